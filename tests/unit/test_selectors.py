"""Label syntax, selector compilation and matching, checked against a naive reference."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.labelling.labels import (
    is_valid_label_key,
    is_valid_label_value,
    label_key_error,
    label_value_error,
)
from gpushare_operator.core.labelling.selectors import (
    EVERYTHING,
    CompiledSelector,
    SelectorError,
    compile_selector,
)
from gpushare_testing.strategies import label_sets, selectors

PREFIX_253 = ".".join(["a" * 63] * 3) + "." + "b" * 61


def naive_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics spelled out one rule at a time, sharing no code with the matcher."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if key not in labels or labels[key] != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = list(expression.get("values") or [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def parse_query(query: str) -> dict[str, Any]:
    """Read a ``labelSelector`` query back into a raw selector (only the forms we emit)."""
    match_labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", query):
        if found := re.fullmatch(r"(\S+) (in|notin) \((.*)\)", part):
            operator = "In" if found[2] == "in" else "NotIn"
            expressions.append(
                {"key": found[1], "operator": operator, "values": found[3].split(",")}
            )
        elif part.startswith("!"):
            expressions.append({"key": part[1:], "operator": "DoesNotExist"})
        elif "=" in part:
            key, value = part.split("=", 1)
            match_labels[key] = value
        else:
            expressions.append({"key": part, "operator": "Exists"})
    return {"matchLabels": match_labels, "matchExpressions": expressions}


class FrozenLabels(Mapping[str, str]):
    """A Mapping that is not a dict, as a cache record might hold."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._labels = dict(labels)

    def __getitem__(self, key: str) -> str:
        return self._labels[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)


# --- label syntax -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "a",
        "pool",
        "nvidia.com/gpu.product",
        "A_b.c-D9",
        "x" * 63,
        f"{PREFIX_253}/name",
        "example.com/" + "y" * 63,
        "9/9",
    ],
)
def test_valid_label_keys(key: str) -> None:
    assert is_valid_label_key(key)
    assert label_key_error(key) is None


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "the name part must not be empty"),
        ("a/", "the name part must not be empty"),
        ("/a", "the prefix before '/' must not be empty"),
        ("a/b/c", "more than one '/'"),
        ("-a", "must start and end with a letter or digit"),
        ("a-", "must start and end with a letter or digit"),
        ("a b", "must consist of letters, digits"),
        ("x" * 64, "at most 63 characters, not 64"),
        ("Nvidia.com/gpu", "lowercase DNS subdomain"),
        ("a..b/c", "lowercase DNS subdomain"),
        ("a_b.com/c", "lowercase DNS subdomain"),
        (f"{PREFIX_253}c/name", "at most 253 characters, not 254"),
    ],
)
def test_invalid_label_keys(key: str, message: str) -> None:
    assert not is_valid_label_key(key)
    problem = label_key_error(key)
    assert problem is not None
    assert message in problem
    assert repr(key) in problem


@pytest.mark.parametrize("value", ["", "a", "true", "A-b_c.D", "x" * 63, "NVIDIA-H100-80GB-HBM3"])
def test_valid_label_values(value: str) -> None:
    assert is_valid_label_value(value)
    assert label_value_error(value) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x" * 64, "at most 63 characters, not 64"),
        ("-a", "must start and end with a letter or digit"),
        ("a.", "must start and end with a letter or digit"),
        ("a b", "is not valid"),
        ("a/b", "is not valid"),
    ],
)
def test_invalid_label_values(value: str, message: str) -> None:
    assert not is_valid_label_value(value)
    problem = label_value_error(value)
    assert problem is not None
    assert message in problem


# --- matching, one rule at a time ---------------------------------------------------------------

NODE = {"pool": "inference", "nvidia.com/gpu.product": "H100", "empty": ""}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ({"key": "pool", "operator": "In", "values": ["inference", "batch"]}, True),
        ({"key": "pool", "operator": "In", "values": ["batch"]}, False),
        ({"key": "missing", "operator": "In", "values": ["x"]}, False),
        ({"key": "empty", "operator": "In", "values": [""]}, True),
        ({"key": "missing", "operator": "In", "values": [""]}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["batch"]}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["inference"]}, False),
        ({"key": "missing", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "missing", "operator": "NotIn", "values": [""]}, True),
        ({"key": "empty", "operator": "NotIn", "values": [""]}, False),
        ({"key": "pool", "operator": "Exists"}, True),
        ({"key": "empty", "operator": "Exists", "values": []}, True),
        ({"key": "missing", "operator": "Exists"}, False),
        ({"key": "pool", "operator": "DoesNotExist"}, False),
        ({"key": "empty", "operator": "DoesNotExist"}, False),
        ({"key": "missing", "operator": "DoesNotExist", "values": None}, True),
    ],
)
def test_each_operator(expression: dict[str, Any], expected: bool) -> None:
    compiled = compile_selector({"matchExpressions": [expression]})
    assert compiled.matches(NODE) is expected
    assert compiled.keys == {expression["key"]}
    assert not compiled.selects_everything


@pytest.mark.parametrize(
    ("match_labels", "expected"),
    [
        ({"pool": "inference"}, True),
        ({"pool": "inference", "nvidia.com/gpu.product": "H100"}, True),
        ({"pool": "inference", "nvidia.com/gpu.product": "A100"}, False),
        ({"pool": "batch"}, False),
        ({"missing": ""}, False),
        ({"empty": ""}, True),
    ],
)
def test_match_labels(match_labels: dict[str, str], expected: bool) -> None:
    assert compile_selector({"matchLabels": match_labels}).matches(NODE) is expected


def test_match_labels_and_expressions_are_anded() -> None:
    raw = {
        "matchLabels": {"pool": "inference"},
        "matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}
        ],
    }
    compiled = compile_selector(raw)
    assert not compiled.matches(NODE)
    assert compiled.matches({**NODE, "nvidia.com/gpu.product": "A100"})
    assert not compiled.matches({"nvidia.com/gpu.product": "A100"})


@pytest.mark.parametrize("raw", [None, {}, {"matchLabels": {}, "matchExpressions": []}])
def test_empty_selectors_select_everything(raw: dict[str, Any] | None) -> None:
    compiled = compile_selector(raw)
    assert compiled.selects_everything
    assert compiled.keys == frozenset()
    assert compiled.to_query() == ""
    assert compiled.matches({})
    assert compiled.matches(NODE)


def test_none_fields_count_as_absent() -> None:
    # What a pydantic model_dump() of an unset selector looks like.
    compiled = compile_selector({"matchLabels": None, "matchExpressions": None})
    assert compiled == EVERYTHING


def test_keys_lists_every_label_the_selector_reads() -> None:
    raw = {
        "matchLabels": {"pool": "a"},
        "matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
            {"key": "gpushare.dev/skip", "operator": "DoesNotExist"},
        ],
    }
    assert compile_selector(raw).keys == {"pool", "zone", "gpushare.dev/skip"}


def test_matches_any_mapping() -> None:
    compiled = compile_selector(
        {
            "matchLabels": {"pool": "inference"},
            "matchExpressions": [
                {"key": "zone", "operator": "DoesNotExist"},
                {"key": "nvidia.com/gpu.product", "operator": "Exists"},
            ],
        }
    )
    with_zone = {**NODE, "zone": "a"}
    wrappers: tuple[Callable[[dict[str, str]], Mapping[str, str]], ...] = (
        dict,
        MappingProxyType,
        FrozenLabels,
    )
    for wrap in wrappers:
        assert compiled.matches(wrap(NODE))
        assert not compiled.matches(wrap(with_zone))


# --- the query string ---------------------------------------------------------------------------


def test_to_query_uses_the_api_syntax() -> None:
    raw = {
        "matchLabels": {"a": "b"},
        "matchExpressions": [
            {"key": "e", "operator": "Exists"},
            {"key": "c", "operator": "In", "values": ["y", "x", "y"]},
            {"key": "d", "operator": "DoesNotExist"},
            {"key": "f", "operator": "NotIn", "values": ["", "z"]},
        ],
    }
    assert compile_selector(raw).to_query() == "a=b,c in (x,y),!d,e,f notin (,z)"


def test_to_query_of_empty_values() -> None:
    raw = {
        "matchLabels": {"a": ""},
        "matchExpressions": [{"key": "b", "operator": "In", "values": [""]}],
    }
    assert compile_selector(raw).to_query() == "a=,b in ()"


@given(selectors())
def test_to_query_round_trips(raw: dict[str, Any]) -> None:
    compiled = compile_selector(raw)
    assert compile_selector(parse_query(compiled.to_query())) == compiled


# --- properties against the reference -------------------------------------------------------------


@given(selectors(), label_sets())
def test_matches_like_the_reference(raw: dict[str, Any], labels: dict[str, str]) -> None:
    compiled = compile_selector(raw)
    expected = naive_matches(raw, labels)
    assert compiled.matches(labels) is expected
    assert compiled.matches(FrozenLabels(labels)) is expected


@given(selectors(), label_sets(), label_sets())
def test_labels_outside_keys_never_change_the_outcome(
    raw: dict[str, Any], labels: dict[str, str], noise: dict[str, str]
) -> None:
    compiled = compile_selector(raw)
    unrelated = {k: v for k, v in noise.items() if k not in compiled.keys}
    assert compiled.matches({**labels, **unrelated}) is compiled.matches(
        {**unrelated, **{k: v for k, v in labels.items() if k in compiled.keys}}
    )


@given(selectors(), st.randoms(use_true_random=False))
def test_order_of_expressions_does_not_matter(raw: dict[str, Any], rng: random.Random) -> None:
    shuffled = dict(raw)
    expressions = list(raw.get("matchExpressions") or [])
    rng.shuffle(expressions)
    shuffled["matchExpressions"] = expressions
    assert compile_selector(shuffled) == compile_selector(raw)
    assert hash(compile_selector(shuffled)) == hash(compile_selector(raw))


def test_compiled_selectors_are_frozen() -> None:
    compiled = compile_selector({"matchLabels": {"a": "b"}})
    assert isinstance(compiled, CompiledSelector)
    with pytest.raises(AttributeError):
        compiled.requirements = ()  # type: ignore[misc]


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "a label selector must be an object, not list"),
        ({"matchLabel": {"a": "b"}}, "unknown field(s) 'matchLabel'"),
        ({"matchLabels": ["a"]}, "matchLabels must be an object"),
        ({"matchLabels": {"bad key": "x"}}, "matchLabels: label key 'bad key'"),
        ({"matchLabels": {"a": "-x"}}, "matchLabels['a']: label value '-x'"),
        ({"matchLabels": {"a": 1}}, "matchLabels['a']: label value 1 must be a string, not int"),
        ({"matchLabels": {"a": None}}, "must be a string, not null"),
        ({"matchExpressions": {"key": "a"}}, "matchExpressions must be a list, not dict"),
        ({"matchExpressions": ["a"]}, "matchExpressions[0] must be an object"),
        (
            {"matchExpressions": [{"operator": "Exists"}]},
            "matchExpressions[0]: a label key is required",
        ),
        (
            {
                "matchExpressions": [
                    {"key": "a", "operator": "Exists"},
                    {"key": "b", "operator": "Gt"},
                ]
            },
            "matchExpressions[1]: operator 'Gt' is not supported; use one of In, NotIn, Exists",
        ),
        ({"matchExpressions": [{"key": "a"}]}, "operator None is not supported"),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
            "matchExpressions[0]: operator In needs at least one value",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn"}]},
            "operator NotIn needs at least one value",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "matchExpressions[0]: operator Exists takes no 'values'",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": [""]}]},
            "operator DoesNotExist takes no 'values'",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]},
            "'values' must be a list of strings, not str",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "not ok"]}]},
            "matchExpressions[0] (a In): label value 'not ok'",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "value": ["x"]}]},
            "matchExpressions[0] has unknown field(s) 'value'",
        ),
        (
            {"matchExpressions": [{"key": "Bad.Prefix/x", "operator": "Exists"}]},
            "matchExpressions[0]: label key 'Bad.Prefix/x': the prefix",
        ),
    ],
)
def test_selector_errors_name_the_bad_part(raw: Any, message: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(raw)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)
