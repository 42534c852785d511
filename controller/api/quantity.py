"""Kubernetes resource quantities ("500m", "2Gi", "1e3", "129M") to engine integers.

``cpu`` becomes millicores, every other resource its base unit; fractions round up, as the
scheduler does, so a plan never under-counts a request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

# As Kubernetes' ParseQuantity: ASCII digits only, nothing around the quantity (no
# whitespace, no trailing newline); the API server refuses anything else.
_PATTERN = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
CPU = "cpu"


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a quantity; ValueError naming the value when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"invalid quantity {value!r}")
        return Decimal(str(value))
    match = _PATTERN.fullmatch(value)
    if match is None:
        raise ValueError(f"invalid quantity {value!r}: expected a number with an optional "
                         "suffix such as 500m, 2Gi, 1e3 or 129M")
    suffix = match.group("suffix") or ""
    try:
        number = Decimal(match.group("num"))
        if suffix in _SUFFIX:  # "E" alone is exa; "E3"/"e3" is an exponent
            return number * _SUFFIX[suffix]
        return number.scaleb(int(suffix[1:]))
    except (InvalidOperation, ValueError, OverflowError) as exc:  # pragma: no cover
        raise ValueError(f"invalid quantity {value!r}") from exc


def to_units(resource: str, value: str | int | float) -> int:
    """Canonical integer amount: millicores for cpu, base units otherwise, rounded up."""
    q = parse_quantity(value)
    if q < 0:
        raise ValueError(f"negative quantity {value!r} for {resource}")
    if resource == CPU:
        q = q * 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def to_resources(values: Mapping[str, str | int | float]) -> dict[str, int]:
    """A resource list (``requests``, ``allocatable``) in canonical units."""
    out: dict[str, int] = {}
    for name, value in values.items():
        try:
            out[name] = to_units(name, value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
    return out
