"""Request paths: every name checked against its kind's rule, then percent-escaped, in one place.

The kubectl plugin puts names it was given into request paths: ``--delete NAME``, a manifest's
``metadata.name``, ``explain node NAME``, the device-plugin ConfigMap's namespace and name.  Put
in raw, a name can change the request: ``#`` ends the path and turns the query after it
(``?dryRun=All``) into a fragment that is never sent, so a dry-run delete becomes a real one;
``?`` starts a query of its own; ``/`` and ``%2F`` reach another object or a subresource (the
API server routes on the decoded path); ``..`` is resolved away by the client before anything
is sent.  Escaping cannot stop the last three, so a name is first held to the rule the API server
holds every name of its kind to: one that fails it can never be an object's name, and is refused
before any request.  The check is the guard; the escape, which leaves every valid name as it
is, keeps a name inside its own path segment should a rule here ever be looser than it ought to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from gpushare_operator.core.api import models

# Longest stretch of a refused name that an error message repeats.
_SHOWN: Final = 60


@dataclass(frozen=True, slots=True)
class NameRule:
    """A rule of the API server's for object names (k8s.io/apimachinery's ``IsDNS1123*``)."""

    title: str
    max_length: int
    alphabet: str  # the characters a name may have, in words
    allowed: frozenset[str]
    pattern: re.Pattern[str]
    misshapen: str  # what is wrong with a name of allowed characters that fails the pattern

    def problem(self, name: str) -> str | None:
        """What is wrong with ``name`` under this rule, or None."""
        if not name:
            return "it is empty"
        if len(name) > self.max_length:
            return f"it has {len(name)} characters"
        bad = next((char for char in name if char not in self.allowed), None)
        if bad is not None:
            return f"{bad!r} is not allowed"
        if not self.pattern.fullmatch(name):
            return self.misshapen
        return None

    def __str__(self) -> str:
        return f"{self.title}, at most {self.max_length} {self.alphabet}"


_LOWER_ALNUM: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"

# Most kinds' names (Nodes, ConfigMaps, custom resources such as ours).
DNS_SUBDOMAIN: Final = NameRule(
    title="a DNS-1123 subdomain",
    max_length=models.DNS_SUBDOMAIN_MAX_LENGTH,
    alphabet="lowercase letters, digits, '-' and '.', each part between dots starting and"
    " ending with a letter or digit",
    allowed=_LOWER_ALNUM | {"-", "."},
    pattern=re.compile(models.DNS_SUBDOMAIN_PATTERN),
    misshapen="a part between dots is empty or does not start and end with a letter or digit",
)
# Namespaces' names (and Services', which the plugin never names).
DNS_LABEL: Final = NameRule(
    title="a DNS-1123 label",
    max_length=63,
    alphabet="lowercase letters, digits and '-', starting and ending with a letter or digit",
    allowed=_LOWER_ALNUM | {"-"},
    pattern=re.compile(_LABEL),
    misshapen="it does not start and end with a letter or digit",
)
# The rule each kind's names are held to, where it is not DNS_SUBDOMAIN.
_RULES: Final[Mapping[str, NameRule]] = {"Namespace": DNS_LABEL}


def rule_for(kind: str) -> NameRule:
    return _RULES.get(kind, DNS_SUBDOMAIN)


class BadName(ValueError):
    """A name that no object of its kind can have: refused before any request."""

    def __init__(self, *, kind: str, name: str, rule: NameRule, problem: str) -> None:
        self.kind, self.name, self.rule = kind, name, rule
        shown = repr(name) if len(name) <= _SHOWN else f"{name[:_SHOWN]!r}..."
        super().__init__(
            f"{kind} name {shown} is not valid ({problem}): a {kind} name must be {rule}"
        )


def checked(name: str, *, kind: str) -> str:
    """``name`` itself if a ``kind`` may be named so; BadName (the name and the rule) if not."""
    rule = rule_for(kind)
    problem = rule.problem(name)
    if problem is not None:
        raise BadName(kind=kind, name=name, rule=rule, problem=problem)
    return name


def escape(segment: str) -> str:
    """``segment`` percent-escaped as one path segment: no ``/``, ``?``, ``#`` or ``%`` is left
    to mean anything.  (Dot segments stay dot segments: only the name check keeps those out.)"""
    return quote(segment, safe="")


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """A kind of object and where its objects are served: constants of ours, never a user's."""

    api: str  # "/api/v1" or "/apis/<group>/<version>"
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def rbac_name(self) -> str:
        """As RBAC and ``kubectl auth can-i`` name it (``configmaps``, ``nodes.example.com``)."""
        group = self.api.split("/")[2] if self.api.startswith("/apis/") else ""
        return f"{self.plural}.{group}" if group else self.plural


def path(
    resource: Resource,
    name: str | None = None,
    *,
    namespace: str | None = None,
    subresource: str | None = None,
) -> str:
    """The path of ``resource``'s collection, or of one object (or its ``subresource``): the
    only way a name gets into a path.  Raises BadName before anything else can happen."""
    parts = [resource.api]
    if namespace is not None:
        parts += ["namespaces", escape(checked(namespace, kind="Namespace"))]
    parts.append(resource.plural)
    if name is not None:
        parts.append(escape(checked(name, kind=resource.kind)))
        if subresource is not None:
            parts.append(subresource)
    return "/".join(parts)
