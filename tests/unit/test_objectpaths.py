"""Request paths from names: the name rules, the escaping, and what the client then sends.

The rules are restated here from Kubernetes' own definitions (apimachinery's IsDNS1123Subdomain
and IsDNS1123Label), not imported, so that the module's rules are held to them.  What the client
sends is read off yarl, the URL class aiohttp (and so kubernetes_asyncio) builds requests with.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlencode

import pytest
import yarl
from hypothesis import example, given
from hypothesis import strategies as st

from gpushare_operator.kube import objectpaths
from gpushare_operator.kube.objectpaths import BadName, Resource

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
POLICIES = Resource(api="/apis/gpushare.dev/v1alpha1", plural="gpusharingpolicies", kind="P")
CONFIGMAPS = Resource(api="/api/v1", plural="configmaps", kind="ConfigMap", namespaced=True)
SERVER = "https://127.0.0.1:6443"
HOSTILE = ("inference#", "a?b", "a/b", "a%2Fb", "..", ".", "ünïcode", "a" * 300, "", "A", "a\n")

# Text that hits both sides of the rules often: their own characters, and those that break URLs.
NAMEISH = st.text(alphabet=st.sampled_from("ab09-.#?/%&=;:@+ ü\x00A_~"), max_size=20)
ANY_TEXT = st.text(max_size=300)
SUBDOMAINS = st.from_regex(SUBDOMAIN, fullmatch=True).filter(lambda n: len(n) <= 253)


def is_subdomain(name: str) -> bool:
    return len(name) <= 253 and SUBDOMAIN.fullmatch(name) is not None


def is_label(name: str) -> bool:
    return len(name) <= 63 and LABEL.fullmatch(name) is not None


def sent(path: str) -> yarl.URL:
    """The URL a request to ``path`` with ``?dryRun=All`` is sent to, built as
    kubernetes_asyncio builds it (host + path + '?' + urlencode(query)) and parsed by yarl."""
    return yarl.URL(SERVER + path + "?" + urlencode([("dryRun", "All")]))


@given(name=st.one_of(ANY_TEXT, NAMEISH))
def test_the_escape_leaves_no_character_that_ends_a_segment_and_round_trips(name: str) -> None:
    escaped = objectpaths.escape(name)
    assert not {"#", "?", "/"} & set(escaped)
    assert escaped.isascii() and escaped.isprintable()
    assert unquote(escaped, errors="strict") == name


@given(name=st.one_of(ANY_TEXT, NAMEISH, SUBDOMAINS))
@example(name="inference#")
@example(name="..")
def test_a_name_passes_exactly_when_the_api_server_would_take_it(name: str) -> None:
    for kind, rule in (("Node", is_subdomain), ("P", is_subdomain), ("Namespace", is_label)):
        if rule(name):
            assert objectpaths.checked(name, kind=kind) == name
            continue
        with pytest.raises(BadName) as refused:
            objectpaths.checked(name, kind=kind)
        assert (refused.value.name, refused.value.kind) == (name, kind)


@given(name=st.one_of(ANY_TEXT, NAMEISH, SUBDOMAINS))
def test_a_path_names_one_object_and_keeps_its_query_or_is_never_built(name: str) -> None:
    try:
        path = objectpaths.path(POLICIES, name)
    except BadName:
        assert not is_subdomain(name)
        return
    prefix = "/apis/gpushare.dev/v1alpha1/gpusharingpolicies/"
    segment = path.removeprefix(prefix)
    assert path.startswith(prefix) and not {"#", "?", "/"} & set(segment)
    assert segment == unquote(segment) == name  # a name that passes is its own escape
    url = sent(path)
    assert url.raw_path == path  # nothing resolved away (no dot segment), nothing re-escaped
    assert url.fragment == "" and url.query == {"dryRun": "All"}


@given(name=SUBDOMAINS, namespace=st.from_regex(LABEL, fullmatch=True).filter(is_label))
def test_valid_names_go_into_their_segments_as_they_are(name: str, namespace: str) -> None:
    path = objectpaths.path(CONFIGMAPS, name, namespace=namespace)
    assert path == f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    assert sent(path).raw_parts[1:] == ("api", "v1", "namespaces", namespace, "configmaps", name)


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused_with_the_name_and_the_rule(name: str) -> None:
    with pytest.raises(BadName) as refused:
        objectpaths.path(POLICIES, name)
    message = str(refused.value)
    assert repr(name[:60]) in message
    assert "P name" in message and "a DNS-1123 subdomain, at most 253 lowercase letters" in message


def test_a_namespace_is_held_to_the_label_rule_and_a_subresource_follows_the_name() -> None:
    with pytest.raises(BadName, match=r"Namespace name 'gpu\.operator' .*a DNS-1123 label"):
        objectpaths.path(CONFIGMAPS, "x", namespace="gpu.operator")
    assert objectpaths.path(CONFIGMAPS, namespace="gpu-operator") == (
        "/api/v1/namespaces/gpu-operator/configmaps"
    )
    assert objectpaths.path(POLICIES, "a.b", subresource="status").endswith("/a.b/status")
    assert (POLICIES.rbac_name, CONFIGMAPS.rbac_name) == (
        "gpusharingpolicies.gpushare.dev",
        "configmaps",
    )


def test_the_problem_is_named() -> None:
    problems = {
        "inference#": "'#' is not allowed",
        "a" * 300: "it has 300 characters",
        "": "it is empty",
        "a..b": "a part between dots is empty",
        "-a": "does not start and end with a letter or digit",
    }
    for name, problem in problems.items():
        with pytest.raises(BadName, match=re.escape(problem)):
            objectpaths.checked(name, kind="Node")
    with pytest.raises(BadName) as refused:
        objectpaths.checked("a" * 300, kind="Node")
    message = str(refused.value)  # a long name is cut short
    assert f"{'a' * 60!r}... is not valid" in message and "a" * 61 not in message
