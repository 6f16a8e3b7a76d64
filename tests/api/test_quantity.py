"""Quantities parse exactly and print as users write them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api.quantity import QuantityError, format_quantity, parse


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", Fraction(1, 10)),
        ("2", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        ("16Mi", Fraction(16 * 2**20)),
        ("1Gi", Fraction(2**30)),
        ("1k", Fraction(1000)),
        ("2e3", Fraction(2000)),
        ("500n", Fraction(1, 2 * 10**6)),
        (".5", Fraction(1, 2)),
        (3, Fraction(3)),
    ],
)
def test_parse(text, value):
    assert parse(text) == value


@pytest.mark.parametrize("text", ["", "1x", "Mi", "1.2.3", "--1"])
def test_bad_quantities(text):
    with pytest.raises(QuantityError):
        parse(text)


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [
        (Fraction(24), False, "24"),
        (Fraction(96 * 2**30), True, "96Gi"),
        (Fraction(330), False, "330"),
        (Fraction(3, 10), False, "300m"),
        (Fraction(3000), False, "3k"),
        (Fraction(0), True, "0"),
        (Fraction(1536 * 2**20), True, "1536Mi"),
    ],
)
def test_format(value, binary, text):
    assert format_quantity(value, binary) == text


@given(st.integers(min_value=0, max_value=10**12), st.booleans())
def test_round_trip(millis, binary):
    value = Fraction(millis, 1000)
    assert parse(format_quantity(value, binary)) == value
