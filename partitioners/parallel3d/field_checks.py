"""Field checks shared by the planner's request parsers.

Each check returns the value in the type the planner computes with, or raises
:class:`partitioners.errors.InvalidInput` naming the field by its dotted path
(``model.moe.num_experts``), so a bad request becomes a 422 that says what to fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from partitioners.errors import InvalidInput

__all__ = ["MAX_COUNT", "is_finite_number", "positive_int", "positive_float", "flag", "as_list", "reject_unknown"]

# The largest count a request may carry where no tighter limit applies.
MAX_COUNT = 10**8


def positive_int(value: Any, field_name: str, *, allow_zero: bool = False, maximum: int = MAX_COUNT) -> int:
    """An integer (an integral float such as ``8.0`` too, as JSON writers emit) in 1..maximum (0.. with allow_zero)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise InvalidInput(f"{field_name} must be an integer, got {value!r}", field=field_name,
                           code="not-an-integer")
    ivalue = int(value)
    if ivalue < 0 or (ivalue == 0 and not allow_zero):
        raise InvalidInput(f"{field_name} must be {'>= 0' if allow_zero else '> 0'}, got {ivalue}",
                           field=field_name, code="out-of-range")
    if ivalue > maximum:
        raise InvalidInput(f"{field_name} must be <= {maximum}, got {ivalue}", field=field_name, code="out-of-range")
    return ivalue


def is_finite_number(value: Any) -> bool:
    """A JSON number that is neither a boolean (Python's ``True`` is an int) nor NaN or infinite."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def positive_float(value: Any, field_name: str) -> float:
    """A finite number above zero."""
    if not is_finite_number(value) or value <= 0:
        raise InvalidInput(f"{field_name} must be a finite number > 0, got {value!r}", field=field_name,
                           code="out-of-range")
    return float(value)


def flag(value: Any, field_name: str) -> bool:
    """A JSON boolean. ``bool("no")`` is true, so a string or a number is refused, not coerced."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{field_name} must be true or false, got {value!r}", field=field_name,
                           code="not-a-boolean")
    return value


def as_list(value: Any, field_name: str, what: str) -> Sequence:
    """A JSON array (not a string or an object, which are sequences to Python too)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidInput(f"{field_name} must be {what}, got {value!r}", field=field_name, code="not-a-list")
    return value


def reject_unknown(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """Refuse keys the parser does not read, rather than ignoring a misspelt field."""
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown} in {where}; allowed: {sorted(allowed)}",
                           field=f"{where}.{unknown[0]}", code="unknown-field")
