"""Exact parsing and formatting of Kubernetes resource quantities.

Every quantity becomes an int count of milli-units (what the API server calls MilliValue), rounded
up like Kubernetes does, so "500m" cpu is 500, "2" GPUs are 2000 and "1Ki" of memory is 1_024_000.
Integers keep the capacity arithmetic exact: no float ever decides whether a gang fits.
"""

import functools
import math
import re
from fractions import Fraction
from typing import Final

_BINARY_SUFFIXES: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY: Final = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*|[eE][+-]?[0-9]+)$")
_EXPONENT: Final = re.compile(r"^[eE]([+-]?[0-9]+)$")

MILLI: Final = 1000


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity such as "500m", "4Gi", "1e3", "129M" or "128974848"."""
    if isinstance(text, bool):
        raise QuantityError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        # JSON numbers sometimes reach us unquoted; their decimal spelling is what the user meant.
        return Fraction(repr(text))
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {text!r}")
    number, suffix = match.groups()
    value = Fraction(number)
    if suffix in _BINARY_SUFFIXES:
        return value * _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return value * _DECIMAL_SUFFIXES[suffix]
    exponent = _EXPONENT.match(suffix)
    if exponent is None:
        raise QuantityError(f"unknown suffix {suffix!r} in quantity {text!r}")
    return value * Fraction(10) ** int(exponent.group(1))


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True must not hit the entry of 1
def to_milli(text: str | int | float) -> int:
    """Milli-units of a quantity, rounded up (a request of 0.5m cpu still needs 1m).

    Memoized: a cluster spells its quantities a few dozen ways, and the admission plan reads every
    pod's and node's on each pass.
    """
    return math.ceil(parse_quantity(text) * MILLI)


def format_milli(resource: str, milli: int) -> str:
    """A short human spelling: cpu as cores or millicores, memory-like sizes in binary units."""
    if resource == "cpu":
        return f"{milli // MILLI}" if milli % MILLI == 0 else f"{milli}m"
    if milli % MILLI != 0:
        return f"{milli}m"
    whole = milli // MILLI
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, factor in reversed(_BINARY_SUFFIXES.items()):
            if whole >= factor:
                # One decimal is plenty for a person; exactness lives in the milli-unit ints.
                text = f"{whole / factor:.1f}".removesuffix(".0")
                return f"{text}{suffix}"
    return str(whole)
