"""LabelSet: a read-only Mapping equal to the dict it was built from, sharing key layouts."""

from __future__ import annotations

import gc
import sys

from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.labelling import labelsets
from gpushare_operator.core.labelling.labelsets import LabelSet
from gpushare_testing.strategies import label_sets


@given(label_sets())
def test_behaves_like_the_dict_it_came_from(raw: dict[str, str]) -> None:
    labels = LabelSet(raw)
    assert labels == raw
    assert dict(labels) == raw
    assert len(labels) == len(raw)
    assert list(labels) == list(raw)
    for key, value in raw.items():
        assert labels[key] == value
        assert labels.get(key) == value
        assert key in labels
    assert labels.get("absent/key") is None
    assert labels.get("absent/key", "x") == "x"
    assert "absent/key" not in labels


@given(label_sets(), label_sets())
def test_equality_matches_dict_equality(a: dict[str, str], b: dict[str, str]) -> None:
    assert (LabelSet(a) == LabelSet(b)) == (a == b)
    assert (LabelSet(a) == b) == (a == b)


def test_order_does_not_matter_for_equality() -> None:
    assert LabelSet({"a": "1", "b": "2"}) == {"b": "2", "a": "1"}
    assert LabelSet({"a": "1", "b": "2"}) == LabelSet({"b": "2", "a": "1"})
    assert LabelSet({"a": "1"}) != {"a": "2"}


def test_nodes_with_the_same_keys_share_one_layout() -> None:
    first = LabelSet({"pool": "a", "zone": "x"})
    second = LabelSet({"pool": "b", "zone": "y"})
    assert first._layout is second._layout
    assert LabelSet({"zone": "x", "pool": "a"})._layout is not first._layout


def test_values_are_interned() -> None:
    built = "".join(["NVIDIA-", "H100"])
    labels = LabelSet({"product": built})
    assert labels["product"] is sys.intern("NVIDIA-H100")


def test_unused_layouts_are_freed() -> None:
    keys = tuple(f"freed-{i}" for i in range(3))
    labels = LabelSet(dict.fromkeys(keys, "v"))
    assert keys in labelsets._layouts
    del labels
    gc.collect()
    assert keys not in labelsets._layouts


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=5))
def test_not_hashable_like_a_dict(raw: dict[str, str]) -> None:
    try:
        hash(LabelSet(raw))
    except TypeError:
        return
    raise AssertionError("LabelSet must not be hashable")
