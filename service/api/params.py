"""Path, query and header parameters shared by the v1 routers (bounded, NUL-free)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Header, Path, Query

from service.api.deps import Principal, require_scope
from service.errors import UnprocessableInput
from service.storage.plans import decode_cursor

__all__ = ["PlanId", "ModelHash", "IdempotencyKey", "Limit", "Cursor", "Reader", "Writer", "cursor_position"]

PlanId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$", description="Plan id.")]
ModelHash = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="sha256 model hash.")]
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$", description="Makes a retried POST safe."),
]
Limit = Annotated[int, Query(ge=1, le=200)]
Cursor = Annotated[str | None, Query(max_length=300, pattern=r"^[A-Za-z0-9_-]+$", description="next_cursor of the previous page.")]
Reader = Annotated[Principal, Depends(require_scope("read"))]
Writer = Annotated[Principal, Depends(require_scope("write"))]


def cursor_position(cursor: str | None) -> tuple[datetime, str] | None:
    """Decode a keyset cursor; anything this service did not issue is a 422."""
    if not cursor:
        return None
    try:
        return decode_cursor(cursor)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise UnprocessableInput("The cursor is not one this service issued; pass next_cursor from the previous page.") from None
