"""Constrained building blocks shared by every schema.

Strings reject NUL (PostgreSQL text cannot hold it) and are length-bounded;
numbers reject NaN and infinity; lists are bounded. Requests forbid unknown
fields so a typo is an error, not a silently ignored option; responses forbid
them too, so an answer with a field its schema does not declare fails in tests
instead of reaching clients undocumented.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
    "Name",
    "Text",
    "FiniteFloat",
    "NonNegativeFloat",
    "PositiveFloat",
    "RequestModel",
    "ResponseModel",
    "Page",
    "Timestamp",
    "error_path",
]

_NO_NUL = r"^[^\x00]*$"


def _utf8(value: str) -> str:
    """JSON's \\ud800 escapes decode to unpaired surrogates that no database can store."""
    value.encode("utf-8")  # UnicodeEncodeError is a ValueError: a 422 naming the field
    return value


Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_NO_NUL), AfterValidator(_utf8)]
Text = Annotated[str, StringConstraints(max_length=10_000, pattern=_NO_NUL), AfterValidator(_utf8)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
Timestamp = datetime

T = TypeVar("T")


def error_path(loc: tuple | list) -> str:
    """A validation error's location as a dotted field path.

    A discriminated union's tag (they begin with "@", e.g. ``@shape``) says which form of
    a field was read; it is not a field, so it is left out.
    """
    return ".".join(str(part) for part in loc if not str(part).startswith("@"))


class RequestModel(BaseModel):
    """A request body: unknown fields are refused, and so are values of the wrong JSON type.

    Strict: ``"4"`` is not a number and ``"no"`` is not ``false`` (pydantic's lax mode
    would read it so, and ``"yes"`` as ``true``); a client that sends them has a bug
    worth hearing about. A field that must parse text (a timestamp) says ``strict=False``.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


class ResponseModel(BaseModel):
    """A response body: every field it may carry is declared (``additionalProperties: false``).

    FastAPI validates a handler's answer against its ``response_model``; a key the model
    does not declare is then an error (a 500 in the server, a failure in the tests), not
    a field silently dropped or sent undocumented. Lax, unlike requests: the service
    builds these values itself.
    """

    model_config = ConfigDict(extra="forbid")


class Page(BaseModel, Generic[T]):
    """One page of a keyset-paginated list; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[T]
    next_cursor: str | None = None
