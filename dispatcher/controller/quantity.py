"""Kubernetes resource quantities (``1Gi``, ``500m``, ``2``) as exact numbers.

The API server stores a quantity in its canonical form (``1024Mi`` comes back
as ``1Gi``, ``1000m`` as ``1``), so a rendered manifest and the live object
agree on a quantity only when compared as numbers, never as strings.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["parse_quantity", "same_quantity"]

_SUFFIXES = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]{0,2})$")


def parse_quantity(value: object) -> Decimal | None:
    """The quantity's exact value, or None when ``value`` is not a quantity."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    match = _QUANTITY.match(str(value).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        return None
    number, suffix = match.groups()
    if suffix == "" or not any(c in number for c in "eE"):
        try:
            return Decimal(number) * _SUFFIXES[suffix]
        except InvalidOperation:
            return None
    return None  # an exponent and a suffix together is not a quantity


def same_quantity(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are the same quantity, however each is written."""
    left, right = parse_quantity(a), parse_quantity(b)
    return left is not None and left == right
