"""Kubernetes resource quantities (``100m``, ``1.5Gi``, ``2e3``) as exact fractions.

Summaries add and compare allocatable and requested resources of many nodes and pods; exact
arithmetic keeps sums stable (no float drift between otherwise equal summaries, which would
cause needless writes). Formatting picks the unit a user would write.
"""

from __future__ import annotations

import re
from fractions import Fraction

BINARY = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")
"""Binary suffixes, largest first: ``Ki`` is 1024, ``Mi`` 1024², … ``Ei`` 1024⁶."""
DECIMAL = ("E", "P", "T", "G", "M", "k")
"""Decimal suffixes, largest first: ``k`` is 1000, ``M`` 1000², … ``E`` 1000⁶."""


def _powers(suffixes: tuple[str, ...], base: int) -> dict[str, Fraction]:
    """What each of ``suffixes`` (largest first) multiplies by: a power of ``base``."""
    return {suffix: Fraction(base) ** (len(suffixes) - i) for i, suffix in enumerate(suffixes)}


_SUFFIXES = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    **_powers(DECIMAL, 1000),
    **_powers(BINARY, 1024),
}
_PATTERN = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$"
)


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
