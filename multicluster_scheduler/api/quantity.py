"""Kubernetes resource quantities (``100m``, ``1.5Gi``, ``2e3``) as exact fractions.

Summaries add and compare allocatable and requested resources of many nodes and pods; exact
arithmetic keeps sums stable (no float drift between otherwise equal summaries, which would
cause needless writes). Formatting picks the unit a user would write.
"""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_PATTERN = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$"
)
BINARY = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")
DECIMAL = ("E", "P", "T", "G", "M", "k")


class QuantityError(ValueError):
    pass


def parse(value: str | int | float) -> Fraction:
    if isinstance(value, int | float):
        return Fraction(value)
    match = _PATTERN.fullmatch(value.strip())
    if not match:
        raise QuantityError(f"{value!r} is not a quantity")
    number, suffix, exponent = match.groups()
    amount = Fraction(number)
    if exponent is not None:
        return amount * Fraction(10) ** int(exponent)
    return amount * _SUFFIXES[suffix or ""]


def format_quantity(amount: Fraction, binary: bool = False) -> str:
    """The shortest exact form: binary suffixes for byte-like resources, else decimal or milli."""
    if amount == 0:
        return "0"
    for suffix in BINARY if binary else DECIMAL:
        scaled = amount / _SUFFIXES[suffix]
        if scaled.denominator == 1 and abs(scaled) >= 1:
            return f"{scaled.numerator}{suffix}"
    if amount.denominator == 1:
        return str(amount.numerator)
    milli = amount * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return f"{int(amount * 10**9)}n"


def is_binary(resource: str) -> bool:
    """Resources conventionally written with binary suffixes (bytes)."""
    return resource in ("memory", "ephemeral-storage", "storage") or resource.startswith(
        "hugepages-"
    )


def parse_list(resources: dict[str, str | int] | None) -> dict[str, Fraction]:
    return {name: parse(value) for name, value in (resources or {}).items()}


def format_list(resources: dict[str, Fraction]) -> dict[str, str]:
    return {name: format_quantity(v, is_binary(name)) for name, v in sorted(resources.items())}


def add(into: dict[str, Fraction], other: dict[str, Fraction]) -> dict[str, Fraction]:
    for name, value in other.items():
        into[name] = into.get(name, Fraction(0)) + value
    return into
