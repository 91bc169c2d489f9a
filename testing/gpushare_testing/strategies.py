"""Hypothesis strategies for labels and label selectors, shared by unit and integration tests.

Keys and values come mostly from small shared pools, so that generated selectors and generated
label sets talk about the same labels and a selector matches a label set a good part of the time
(a bit under half overall; each operator holds 20-80% of the time), which is where bugs in
matching show. A minority of keys and values is generated from the full grammar, so that
prefixes, dots, underscores, upper case and the empty value are exercised too.

Everything generated is valid for the real API server: the integration tests feed these to
kube-apiserver and compare its ``labelSelector`` filtering with ours.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

KEY_POOL = (
    "pool",
    "zone",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.present",
    "gpushare.dev/team",
    "node.kubernetes.io/instance-type",
)
VALUE_POOL = ("a", "b")
RARE_VALUES = ("", "NVIDIA-H100-80GB-HBM3")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_LOWER_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def _bounded(*, inner: str, ends: str, max_size: int) -> st.SearchStrategy[str]:
    """A string of ``ends`` at both ends (or one character) with ``inner`` in between."""
    one = st.text(ends, min_size=1, max_size=1)
    middle = st.text(inner, max_size=max_size - 2)
    longer = st.builds(lambda a, m, b: a + m + b, one, middle, one)
    return one | longer


def _mostly(
    *, common: st.SearchStrategy[str], rare: st.SearchStrategy[str], odds: int
) -> st.SearchStrategy[str]:
    """``common`` ``odds`` times as often as ``rare`` (``one_of`` would draw each half the time)."""
    return st.sampled_from([common] * odds + [rare]).flatmap(lambda chosen: chosen)


def _names() -> st.SearchStrategy[str]:
    return _bounded(inner=_ALNUM + "-_.", ends=_ALNUM, max_size=63)


def _dns_subdomains() -> st.SearchStrategy[str]:
    dns_label = _bounded(inner=_LOWER_ALNUM + "-", ends=_LOWER_ALNUM, max_size=20)
    return st.lists(dns_label, min_size=1, max_size=4).map(".".join)


def label_keys() -> st.SearchStrategy[str]:
    """Valid label keys: mostly from a shared pool, sometimes any ``[prefix/]name``."""
    generated = _names() | st.builds(lambda p, n: f"{p}/{n}", _dns_subdomains(), _names())
    return _mostly(common=st.sampled_from(KEY_POOL), rare=generated, odds=5)


def label_values() -> st.SearchStrategy[str]:
    """Valid label values (empty included): mostly from a shared pool, sometimes any."""
    return _mostly(
        common=st.sampled_from(VALUE_POOL), rare=st.sampled_from(RARE_VALUES) | _names(), odds=4
    )


def label_sets() -> st.SearchStrategy[dict[str, str]]:
    """A node's labels: most of the pooled keys, plus a few others."""
    pooled = st.dictionaries(st.sampled_from(KEY_POOL), label_values(), min_size=5, max_size=6)
    others = st.dictionaries(label_keys(), label_values(), max_size=3)
    return st.builds(lambda a, b: {**b, **a}, pooled, others)


@st.composite
def expressions(draw: st.DrawFn) -> dict[str, Any]:
    """One valid ``matchExpressions`` entry."""
    key, operator = draw(label_keys()), draw(st.sampled_from(OPERATORS))
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if operator in ("In", "NotIn"):
        expression["values"] = draw(st.lists(label_values(), min_size=1, max_size=3))
    elif draw(st.booleans()):
        expression["values"] = []  # allowed, and the same as absent
    return expression


@st.composite
def selectors(draw: st.DrawFn) -> dict[str, Any]:
    """A valid raw ``metav1.LabelSelector``; each part absent, empty or (twice as often) filled.

    About a quarter select everything; the rest match a :func:`label_sets` node about a third
    of the time.
    """
    selector: dict[str, Any] = {}
    pairs = st.dictionaries(label_keys(), label_values(), min_size=1, max_size=2)
    parts: tuple[tuple[str, st.SearchStrategy[Any], Any], ...] = (
        ("matchLabels", pairs, {}),
        ("matchExpressions", _expression_lists(), []),
    )
    for field, filled, empty in parts:
        shape = draw(st.sampled_from(("filled", "filled", "empty", "absent")))
        if shape == "filled":
            selector[field] = draw(filled)
        elif shape == "empty":
            selector[field] = empty
    return selector


def _expression_lists() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(expressions(), min_size=1, max_size=2)
