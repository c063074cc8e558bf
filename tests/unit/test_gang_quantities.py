"""Kubernetes quantities parse exactly and round up to milli-units like the API server does."""

from __future__ import annotations

from fractions import Fraction

import pytest

from phalanx.gang.quantities import QuantityError, format_milli, parse_quantity, to_milli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("2e-3", Fraction(2, 1000)),
        ("128974848", Fraction(128974848)),
        ("129M", Fraction(129_000_000)),
        ("123Mi", Fraction(123 * 2**20)),
        ("1.5Gi", Fraction(3 * 2**29)),
        (".5", Fraction(1, 2)),
        ("+3k", Fraction(3000)),
        ("100n", Fraction(1, 10**7)),
        ("7u", Fraction(7, 10**6)),
        ("1Ei", Fraction(2**60)),
        ("1E", Fraction(10**18)),
        (8, Fraction(8)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity_is_exact(text: str | int | float, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "milli"),
    [("500m", 500), ("2", 2000), ("0.5m", 1), ("1n", 1), ("1Ki", 1_024_000), ("0", 0), ("129M", 129 * 10**9)],
)
def test_to_milli_rounds_up_like_kubernetes(text: str, milli: int) -> None:
    assert to_milli(text) == milli


@pytest.mark.parametrize("text", ["", "abc", "1Gb", "1.2.3", "Gi", "1 Gi", "--1", "1e", True])
def test_malformed_quantity_is_rejected(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_memoized_to_milli_still_rejects_a_boolean_after_the_equal_integer() -> None:
    # True == 1 and hash(True) == hash(1): an untyped cache would answer True with 1's entry.
    assert to_milli(1) == 1000
    with pytest.raises(QuantityError):
        to_milli(True)
    with pytest.raises(QuantityError):
        to_milli("1Gb")
    with pytest.raises(QuantityError):  # a failure is not cached as an answer either
        to_milli("1Gb")


@pytest.mark.parametrize(
    ("resource", "milli", "text"),
    [
        ("cpu", 500, "500m"),
        ("cpu", 4000, "4"),
        ("memory", 4 * 2**30 * 1000, "4Gi"),
        ("memory", 1536 * 2**20 * 1000, "1.5Gi"),
        ("memory", 512_000, "512"),
        ("nvidia.com/gpu", 8000, "8"),
    ],
)
def test_format_milli_is_readable(resource: str, milli: int, text: str) -> None:
    assert format_milli(resource, milli) == text
