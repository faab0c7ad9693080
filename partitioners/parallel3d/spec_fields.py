"""Declared fields of the planner's input dataclasses: their checks, and one reader from mappings.

Every input of the 3D-parallel planner (:mod:`partitioners.parallel3d.specs`) is a
frozen dataclass whose fields are declared with :func:`spec_field`: a default, a
one-line description, and what a value may be (a count in a range, a flag, a positive
number, one of some choices, a list of layer indices). That declaration is the one
definition of the field:

- :func:`check_declared_fields`, called first by each class's ``__post_init__``,
  checks every field against it and normalises the value (``8.0`` -> ``8``, a list of
  layers -> a tuple), raising :class:`partitioners.errors.InvalidInput` with the
  field's dotted path (``model.moe.num_experts``), so a bad request becomes a 422 that
  says what to fix;
- :func:`spec_from_mapping` builds any of the classes from a JSON-shaped mapping,
  recursing into nested spec types and refusing unknown keys;
- the HTTP schema (``service.schemas.parallel``) is generated from the same
  declarations, so its bounds and descriptions are these.

The value checks below (:func:`positive_int`, :func:`flag`, ...) are also what the
Hugging Face ``config.json`` reader uses.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from partitioners.errors import InvalidInput

__all__ = [
    "MAX_COUNT",
    "FieldRule",
    "spec_field",
    "field_rule",
    "check_declared_fields",
    "spec_from_mapping",
    "is_finite_number",
    "positive_int",
    "positive_float",
    "flag",
    "as_list",
    "reject_unknown",
]

# The largest count a request may carry where no tighter limit applies.
MAX_COUNT = 10**8

SpecT = TypeVar("SpecT")


# --------------------------------------------------------------------------- value checks


def positive_int(value: Any, field_name: str, *, allow_zero: bool = False, maximum: int = MAX_COUNT) -> int:
    """An integer (an integral float such as ``8.0`` too, as JSON writers emit) in 1..maximum (0.. with allow_zero)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not math.isfinite(value))
        or value != int(value)
    ):
        raise InvalidInput(f"{field_name} must be an integer, got {value!r}", field=field_name, code="not-an-integer")
    ivalue = int(value)
    if ivalue < 0 or (ivalue == 0 and not allow_zero):
        raise InvalidInput(
            f"{field_name} must be {'>= 0' if allow_zero else '> 0'}, got {ivalue}",
            field=field_name,
            code="out-of-range",
        )
    if ivalue > maximum:
        raise InvalidInput(f"{field_name} must be <= {maximum}, got {ivalue}", field=field_name, code="out-of-range")
    return ivalue


def is_finite_number(value: Any) -> bool:
    """A JSON number that is neither a boolean (Python's ``True`` is an int) nor NaN or infinite."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def positive_float(value: Any, field_name: str) -> float:
    """A finite number above zero."""
    if not is_finite_number(value) or value <= 0:
        raise InvalidInput(
            f"{field_name} must be a finite number > 0, got {value!r}", field=field_name, code="out-of-range"
        )
    return float(value)


def flag(value: Any, field_name: str) -> bool:
    """A JSON boolean. ``bool("no")`` is true, so a string or a number is refused, not coerced."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{field_name} must be true or false, got {value!r}", field=field_name, code="not-a-boolean")
    return value


def as_list(value: Any, field_name: str, what: str) -> Sequence[Any]:
    """A JSON array (not a string or an object, which are sequences to Python too)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidInput(f"{field_name} must be {what}, got {value!r}", field=field_name, code="not-a-list")
    return value


def reject_unknown(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """Refuse keys the reader does not read, rather than ignoring a misspelt field."""
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidInput(
            f"unknown field(s) {unknown} in {where}; allowed: {sorted(allowed)}",
            field=f"{where}.{unknown[0]}",
            code="unknown-field",
        )


# --------------------------------------------------------------------------- declared fields


@dataclasses.dataclass(frozen=True)
class FieldRule:
    """What one field of a planner input may hold, and what it means.

    ``kind`` is one of:

    - ``"count"``: an integer from ``ge`` (0 or 1) to ``le``;
    - ``"flag"``: a JSON boolean;
    - ``"positive"``: a finite number above zero, at most ``le`` when given;
    - ``"number"``: a finite number from ``ge`` to ``le`` (or below ``lt``); ``why`` says
      what the ends mean, in the refusal;
    - ``"choice"``: one of ``choices`` (read case-blind), refused with ``code``;
    - ``"name"``: any text;
    - ``"layers"``: distinct layer indices (0-based);
    - ``"rates"``: a map of dtype names to finite rates above zero, at most ``le`` entries;
    - ``"custom"``: checked by the class's own ``__post_init__`` (nested specs, maps, lists
      of choices).
    """

    kind: str
    doc: str
    ge: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] = ()
    code: str = "out-of-range"
    why: str = ""


def spec_field(
    default: Any = dataclasses.MISSING,
    *,
    kind: str,
    doc: str,
    ge: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[Any, ...] = (),
    code: str = "out-of-range",
    why: str = "",
) -> Any:
    """A dataclass field carrying its :class:`FieldRule` (``metadata["rule"]``).

    A count defaults to ``ge=1, le=MAX_COUNT``; ``default`` left out makes the field required.
    """
    if kind == "count":
        ge = 1 if ge is None else ge
        le = MAX_COUNT if le is None else le
    rule = FieldRule(kind, doc, ge, le, lt, tuple(choices), code, why)
    return dataclasses.field(default=default, metadata={"rule": rule})


def field_rule(field: dataclasses.Field[Any]) -> FieldRule:
    """The rule a field was declared with."""
    rule: FieldRule = field.metadata["rule"]
    return rule


def _checked(value: Any, rule: FieldRule, path: str) -> Any:
    """``value`` as the field holds it, or InvalidInput naming ``path``."""
    if rule.kind == "count":
        maximum = MAX_COUNT if rule.le is None else int(rule.le)
        return positive_int(value, path, allow_zero=rule.ge == 0, maximum=maximum)
    if rule.kind == "flag":
        return flag(value, path)
    if rule.kind == "positive":
        number = positive_float(value, path)
        if rule.le is not None and number > rule.le:
            raise InvalidInput(
                f"{path} must be <= {rule.le:g} {rule.why}".rstrip() + f", got {value!r}", field=path, code=rule.code
            )
        return number
    if rule.kind == "number":
        within = (
            is_finite_number(value)
            and (rule.ge is None or value >= rule.ge)
            and (rule.le is None or value <= rule.le)
            and (rule.lt is None or value < rule.lt)
        )
        if not within:
            span = rule.why or (
                f"in [{rule.ge:g}, {rule.lt:g})" if rule.lt is not None else f"from {rule.ge:g} to {rule.le:g}"
            )
            raise InvalidInput(f"{path} must be a number {span}, got {value!r}", field=path, code=rule.code)
        return float(value)
    if rule.kind == "choice":
        text = str(value).lower()
        if text not in rule.choices:
            raise InvalidInput(
                f"{path} must be one of {list(rule.choices)}{rule.why}, got {text!r}", field=path, code=rule.code
            )
        return text
    if rule.kind == "name":
        return str(value)
    if rule.kind == "rates":
        if not isinstance(value, Mapping) or not value:
            raise InvalidInput(
                f"{path} must map dtype -> FLOP/s, e.g. {{'bf16': 9.89e14}}", field=path, code="not-an-object"
            )
        if rule.le is not None and len(value) > rule.le:
            raise InvalidInput(f"{path} names at most {rule.le:g} dtypes", field=path, code="out-of-range")
        return {str(k).lower(): positive_float(v, f"{path}.{k}") for k, v in value.items()}
    if rule.kind == "layers":
        indices = tuple(
            positive_int(i, f"{path}[]", allow_zero=True) for i in as_list(value, path, "a list of layer indices")
        )
        if len(set(indices)) < len(indices):
            twice = next(i for i in indices if indices.count(i) > 1)
            raise InvalidInput(f"{path} lists layer {twice} more than once", field=path, code="duplicate-layer")
        return indices
    return value


def check_declared_fields(spec: Any) -> None:
    """Check every declared field of a frozen spec against its rule, normalising it in place.

    A field whose default is None may be None. Paths are ``<spec.ROOT>.<field>``.
    """
    for field in dataclasses.fields(spec):
        rule = field.metadata.get("rule")
        if rule is None:
            continue
        value = getattr(spec, field.name)
        if value is None and field.default is None:
            continue
        normal = _checked(value, rule, f"{spec.ROOT}.{field.name}")
        if normal is not value:
            object.__setattr__(spec, field.name, normal)


# --------------------------------------------------------------------------- from a mapping


_DECLARED: dict[type, tuple[tuple[dataclasses.Field[Any], type | None], ...]] = {}


def _declared(cls: type) -> tuple[tuple[dataclasses.Field[Any], type | None], ...]:
    """The init fields of a spec class, each with the spec class its annotation names (or None); read once."""
    if cls not in _DECLARED:
        hints = typing.get_type_hints(cls)
        _DECLARED[cls] = tuple((f, _nested_spec_type(hints[f.name])) for f in dataclasses.fields(cls) if f.init)
    return _DECLARED[cls]


def _nested_spec_type(annotation: Any) -> type | None:
    """The spec dataclass an annotation names (``MoESpec | None`` -> MoESpec), else None."""
    candidates = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate) and hasattr(candidate, "ROOT"):
            return candidate
    return None


def _rerooted(error: InvalidInput, root: str, where: str) -> InvalidInput:
    """The same error with the class's own root path (``layout``) replaced by where it was read."""
    if root == where or error.field is None or not (error.field == root or error.field.startswith(root + ".")):
        return error
    detail = error.detail
    for sep in (".", ":"):
        detail = detail.replace(root + sep, where + sep)
    return type(error)(detail, field=where + error.field[len(root) :], code=error.code)


def spec_from_mapping(cls: type[SpecT], data: Any, where: str | None = None) -> SpecT:
    """Build the spec dataclass ``cls`` from a JSON-shaped mapping (or return ``data`` if it is one).

    Keys are the dataclass's fields; an unknown key, a missing required field or a value
    the field's rule refuses is InvalidInput naming its path under ``where`` (default
    ``cls.ROOT``, e.g. ``"model"``). Fields whose type is another spec class are read
    recursively (``model.moe``). A class may accept shorthand forms by defining
    ``from_shorthand(data, where)``, which returns the mapping of fields they stand for
    (a cluster preset's figures, a software generation's flags) or a finished instance.
    """
    where = cls.ROOT if where is None else where  # type: ignore[attr-defined]
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be an object", field=where, code="not-an-object")
    shorthand: Callable[[Mapping[str, Any], str], Any] | None = getattr(cls, "from_shorthand", None)
    if shorthand is not None:
        data = shorthand(data, where)
        if isinstance(data, cls):
            return data
    declared = _declared(cls)
    reject_unknown(data, {f.name for f, _ in declared}, where)
    kwargs: dict[str, Any] = {}
    for field, nested in declared:
        if field.name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise InvalidInput(
                    f"{where}.{field.name} is required", field=f"{where}.{field.name}", code="missing-field"
                )
            continue
        value = data[field.name]
        if nested is not None and value is not None:
            value = spec_from_mapping(nested, value, f"{where}.{field.name}")
        kwargs[field.name] = value
    try:
        return cls(**kwargs)
    except InvalidInput as error:
        raise _rerooted(error, cls.ROOT, where) from None  # type: ignore[attr-defined]
