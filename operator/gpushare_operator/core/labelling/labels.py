"""Kubernetes label syntax: what a label key and a label value may look like.

The rules are the API server's (``IsQualifiedName`` and ``IsValidLabelValue``), repeated here so
that a selector or a config key is rejected with a readable message before it reaches the API,
where it would fail as a whole write (or, for a node label, never be written at all).

The error functions return a message for people (``None`` when the input is fine) rather than
raise, so that callers can name the offending part of a bigger object in their own message.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 63
MAX_PREFIX_LENGTH = 253
MAX_VALUE_LENGTH = 63

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_NOT_VALUE_CHARS = re.compile(r"[^-._a-zA-Z0-9]")
_UNTRIMMED_ENDS = re.compile(r"^[^a-zA-Z0-9]+|[^a-zA-Z0-9]+$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")

_NAME_RULE = (
    "must consist of letters, digits, '-', '_' or '.', "
    "and must start and end with a letter or digit (e.g. 'pool', 'gpu.product', 'MY_LABEL')"
)
_PREFIX_RULE = (
    "must be a lowercase DNS subdomain: lowercase letters, digits, '-' or '.', "
    "starting and ending with a letter or digit (e.g. 'nvidia.com')"
)


def dns_subdomain_error(text: str) -> str | None:
    """Say why ``text`` is not a DNS-1123 subdomain (the label-key prefix and resource domain)."""
    if not text:
        return "must not be empty"
    if len(text) > MAX_PREFIX_LENGTH:
        return f"must be at most {MAX_PREFIX_LENGTH} characters, not {len(text)}"
    if not _DNS_SUBDOMAIN.fullmatch(text):
        return _PREFIX_RULE
    return None


def label_key_error(key: str) -> str | None:
    """Say why ``key`` is not a valid label key, or ``None`` if it is.

    A key is an optional DNS-subdomain prefix and a slash, then a name of at most 63 characters.
    """
    prefix, slash, name = key.rpartition("/")
    if slash and "/" in prefix:
        return f"label key {key!r} has more than one '/'; use an optional 'prefix/' and a name"
    if slash and (problem := dns_subdomain_error(prefix)):
        return f"label key {key!r}: the prefix before '/' {problem}"
    if not name:
        return f"label key {key!r}: the name part must not be empty"
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"label key {key!r}: the name part must be at most {MAX_NAME_LENGTH} characters, "
            f"not {len(name)}"
        )
    if not _NAME.fullmatch(name):
        return f"label key {key!r}: the name part {_NAME_RULE}"
    return None


def label_value_error(value: str) -> str | None:
    """Say why ``value`` is not a valid label value, or ``None`` if it is (empty is valid)."""
    if len(value) > MAX_VALUE_LENGTH:
        return (
            f"label value {value!r} must be at most {MAX_VALUE_LENGTH} characters, not {len(value)}"
        )
    if not _VALUE.fullmatch(value):
        return f"label value {value!r} is not valid: a non-empty value {_NAME_RULE}"
    return None


def is_valid_label_key(key: str) -> bool:
    return label_key_error(key) is None


def is_valid_label_value(value: str) -> bool:
    return label_value_error(value) is None


def label_value_prefix(text: str, *, budget: int) -> str:
    """The start of ``text`` that fits in ``budget`` characters of a label value, cut and
    trimmed to begin and end on a letter or digit ("" when nothing usable is left).

    Content-hashed names (device-plugin keys, mig-parted config names) are ``<policy>-<tag>``:
    the policy part is what gives way. Policy names are DNS subdomains already; replacing
    other characters only guards the label-value syntax against a caller passing another.
    """
    cut = _NOT_VALUE_CHARS.sub("-", text)[: max(budget, 0)]
    return _UNTRIMMED_ENDS.sub("", cut)
