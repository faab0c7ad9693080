"""Request dependencies: the database session (which owns the transaction) and the caller.

The session dependency commits when the handler returns and rolls back when it
raises (Polar's pattern), and it runs with ``scope="function"`` so the commit
happens *before* the response is sent: a client never sees a 201 for a write
that did not land. Domain code only flushes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

import structlog
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.errors import Forbidden, Unauthorized
from service.settings import Settings
from service.storage.tenants import ALL_SCOPES, DEFAULT_TENANT_ID, find_active_key

__all__ = ["SessionDep", "SettingsDep", "Principal", "require_scope", "get_session", "get_settings_dep"]


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    session: Session = request.app.state.session_factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant every query is scoped to, and what the key may do."""

    tenant_id: str
    scopes: frozenset[str]
    key_id: str | None = None


def _principal(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    if not settings.auth_enabled:
        principal = Principal(tenant_id=DEFAULT_TENANT_ID, scopes=frozenset(ALL_SCOPES))
    else:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                "Send an API key as 'Authorization: Bearer <key>' (create one with `hyperplace keys create`)."
            )
        row = find_active_key(session, token.strip(), settings.api_key_secret)
        if row is None:
            raise Unauthorized("The API key is unknown or revoked.")
        principal = Principal(tenant_id=row.tenant_id, scopes=frozenset(row.scopes.split()), key_id=row.id)
    structlog.contextvars.bind_contextvars(tenant=principal.tenant_id)
    # Sync dependencies run in the threadpool, whose context vars never reach the
    # middleware's request log line: leave the tenant on the request scope too.
    request.state.tenant_id = principal.tenant_id
    return principal


def require_scope(scope: str):
    """Dependency factory: the caller, checked to hold ``scope`` (read, write or moe)."""

    def dependency(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if scope not in principal.scopes:
            raise Forbidden(f"This API key lacks the '{scope}' scope.")
        return principal

    return dependency
