"""Kubernetes resource quantities (``20Gi``, ``20G``, ``1.5Gi``, ``21474836480``) as bytes.

The grammar is the API server's (``k8s.io/apimachinery/pkg/api/resource``): a decimal number,
then a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal one (m k M G T P E; ``u`` and ``n`` too), or
an exponent (``e3``).  Memory is counted in whole bytes, so a quantity is rounded up to one, as
the API server rounds a pod's memory request.
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Final

MIB: Final = 1024 * 1024

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": decimal.Decimal("1e-9"),
    "u": decimal.Decimal("1e-6"),
    "m": decimal.Decimal("1e-3"),
    "": decimal.Decimal(1),
    "k": decimal.Decimal(10**3),
    "M": decimal.Decimal(10**6),
    "G": decimal.Decimal(10**9),
    "T": decimal.Decimal(10**12),
    "P": decimal.Decimal(10**15),
    "E": decimal.Decimal(10**18),
}
_QUANTITY: Final = re.compile(
    r"(?P<number>\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
# A quantity past this is no GPU's memory (and would be slow to compute with): refused.
_MAX_BYTES: Final = 2**63 - 1


class QuantityError(ValueError):
    """Raised for text that is not a positive quantity of bytes."""


def parse_bytes(text: str) -> int:
    """The number of bytes ``text`` says, rounded up; raises ``QuantityError``."""
    found = _QUANTITY.fullmatch(text.strip())
    if found is None or not text.strip():
        raise QuantityError(f"{text!r} is not a quantity (e.g. 20Gi, 20480Mi or 20G)")
    number = decimal.Decimal(found["number"])
    suffix = found["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    else:  # an exponent
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            raise QuantityError(f"{text!r}: the exponent is out of range")
        value = number.scaleb(exponent)
    if value <= 0:
        raise QuantityError(f"{text!r} is not a positive amount of memory")
    rounded = math.ceil(value)
    if rounded > _MAX_BYTES:
        raise QuantityError(f"{text!r} is more memory than any GPU has")
    return rounded


def parse_mib(text: str) -> int:
    """``text`` in MiB, rounded up (a request of 1 byte more than 20 GiB needs 20481 MiB)."""
    return -(-parse_bytes(text) // MIB)


def describe_mib(mib: int) -> str:
    """``20480`` → ``20Gi (20480 MiB)``; ``10194`` → ``10194 MiB``: as people write it."""
    if mib % 1024 == 0:
        return f"{mib // 1024}Gi ({mib} MiB)"
    return f"{mib} MiB"
