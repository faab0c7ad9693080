"""``Idempotency-Key`` for creating POSTs.

The key, a fingerprint of what the request asked for, and a reference to what it
created are written in the same transaction as the thing created. A retry with
the same key and the same request replays the stored answer (a client that lost
the response to a timeout or a 503 can resend safely); the same key with another
request is a 422. The fingerprint is over the request's *content* (model hash,
inventory hash, options), not its bytes, so a re-encoded multipart body with a
new boundary still matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import UnprocessableInput
from service.storage.blobs import pack_json, unpack_json
from service.storage.models import IdempotencyKey
from service.storage.plans import delete_idempotency_key, get_idempotency_key

__all__ = ["StoredAnswer", "check_idempotency_key", "remember_idempotency_key", "forget_idempotency_key"]


@dataclass(frozen=True)
class StoredAnswer:
    """What a key answered: status, the id of what it made or found, and that thing's path.

    ``location`` is also how deleting the thing finds the key, so store it even for
    answers that send no ``Location`` header (a 200 with a cached plan).
    """

    status_code: int
    resource_id: str
    location: str | None


def check_idempotency_key(
    session: Session, tenant_id: str, key: str | None, route: str, fingerprint: str
) -> StoredAnswer | None:
    """The earlier answer for ``key``, None if the key is new; 422 if it was used for another request."""
    if not key:
        return None
    row = get_idempotency_key(session, tenant_id, key)
    if row is None:
        return None
    if row.route != route or row.fingerprint != fingerprint:
        raise UnprocessableInput(
            "This Idempotency-Key was already used for a different request; use a new key for a new request."
        )
    return StoredAnswer(status_code=row.status_code, resource_id=unpack_json(row.response)["id"], location=row.location)


def remember_idempotency_key(
    session: Session, tenant_id: str, key: str | None, route: str, fingerprint: str, answer: StoredAnswer
) -> StoredAnswer:
    """Store ``answer`` under ``key``; if a concurrent request stored one first, return that one."""
    if not key:
        return answer
    try:
        with session.begin_nested():
            session.add(
                IdempotencyKey(
                    tenant_id=tenant_id,
                    key=key,
                    route=route,
                    fingerprint=fingerprint,
                    status_code=answer.status_code,
                    response=pack_json({"id": answer.resource_id}),
                    location=answer.location,
                )
            )
            session.flush()
    except IntegrityError:
        earlier = check_idempotency_key(session, tenant_id, key, route, fingerprint)
        if earlier is None:
            raise
        return earlier
    return answer


def forget_idempotency_key(session: Session, tenant_id: str, key: str | None, stale: StoredAnswer) -> None:
    """Free ``key`` whose stored answer ``stale`` names something since deleted.

    Call it in the transaction that will store the new answer (after any rollback),
    so the key is never free in the database without being bound again. A key that a
    concurrent request has bound anew (another ``location``) is left alone.
    """
    if key:
        delete_idempotency_key(session, tenant_id, key, stale.location)
