"""Kubernetes resource quantities (`500m`, `2`, `4Gi`, `1.5e3`), checked before a manifest is written.

The grammar is apimachinery's `resource.Quantity`: a decimal number (`1`, `1.5`, `.5`, `1.`)
followed by a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (m k M G T P E) or a decimal
exponent (`e3`, `E-2`). A request must be positive; `2GB` or `lots` is refused with exit 2 naming the
flag, instead of a manifest the API server rejects at `kubectl apply`.
"""

from __future__ import annotations

import re
from decimal import Decimal

from modelport.errors import BadInputError

_QUANTITY = re.compile(r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]|[eE][+-]?\d+)?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
            "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}


def parse_quantity(text: str) -> Decimal | None:
    """The quantity's value in base units, or None when `text` is not a Kubernetes quantity."""
    m = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        return None
    number, suffix = Decimal(m["number"]), m["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number.scaleb(int(suffix[1:]))


def check_quantity(text: str, flag: str, *, whole_units: bool = False) -> str:
    """`text` when it is a positive quantity (at least one unit with `whole_units`, e.g. a byte), else exit 2."""
    value = parse_quantity(text)
    example = "2Gi or 512Mi" if whole_units else "500m or 2"
    if value is None:
        raise BadInputError(f"bad {flag} '{text}': not a Kubernetes quantity (e.g. {example}; suffixes Ki Mi Gi Ti, m k M G T)")
    if whole_units and text.strip().endswith("m"):
        raise BadInputError(f"bad {flag} '{text}': 'm' means thousandths of a byte (did you mean {text.strip()[:-1]}Mi?)")
    if value <= 0 or (whole_units and value < 1):
        raise BadInputError(f"bad {flag} '{text}': must be {'at least one byte' if whole_units else 'above zero'} (e.g. {example})")
    return text
