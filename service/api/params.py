"""Path, query and header parameters shared by the v1 routers (bounded, NUL-free)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Header, Path, Query

from service.api.deps import Principal, require_scope
from service.errors import UnprocessableInput
from service.storage.plans import decode_cursor

__all__ = [
    "PlanId",
    "ModelHash",
    "IdempotencyKey",
    "IfNoneMatch",
    "Limit",
    "Cursor",
    "Reader",
    "Writer",
    "cursor_position",
    "none_match",
]

PlanId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$", description="Plan id.")]
ModelHash = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="sha256 model hash.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$", description="Makes a retried POST safe."
    ),
]
IfNoneMatch = Annotated[
    str | None,
    Header(
        alias="If-None-Match", max_length=4096, description="ETags the client holds: `*`, or a comma-separated list."
    ),
]
Limit = Annotated[int, Query(ge=1, le=200)]
Cursor = Annotated[
    str | None, Query(max_length=300, pattern=r"^[A-Za-z0-9_-]+$", description="next_cursor of the previous page.")
]
Reader = Annotated[Principal, Depends(require_scope("read"))]
Writer = Annotated[Principal, Depends(require_scope("write"))]


def cursor_position(cursor: str | None) -> tuple[datetime, str] | None:
    """Decode a keyset cursor; anything this service did not issue is a 422."""
    if not cursor:
        return None
    try:
        return decode_cursor(cursor)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise UnprocessableInput(
            "The cursor is not one this service issued; pass next_cursor from the previous page."
        ) from None


# entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE (RFC 9110 8.8.3); etagc excludes DQUOTE but not
# the comma, so a list is read tag by tag, never split on commas.
_ENTITY_TAG_RE = re.compile(r'\s*(?:W/)?("[\x21\x23-\x7e\x80-\xff]*")\s*(?:,|$)')


def none_match(if_none_match: str | None, current_tag: str) -> bool:
    """Whether ``If-None-Match`` names the representation tagged ``current_tag`` (RFC 9110 13.1.2).

    ``*`` matches any current representation; otherwise the field is a comma-separated list of
    entity tags compared weakly (``W/"x"`` matches ``"x"``), as caches and browsers send them.
    Members that are not entity tags match nothing.
    """
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    current_opaque = current_tag.removeprefix("W/")
    return any(match.group(1) == current_opaque for match in _ENTITY_TAG_RE.finditer(if_none_match))
