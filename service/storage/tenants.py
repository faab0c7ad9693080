"""Repository for tenants and API keys.

API keys are never stored: only ``HMAC-SHA256(secret, key)``. A lookup hashes
the presented key and finds the row by that hash (unique index).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.storage.models import ApiKey, Tenant, utcnow

__all__ = [
    "DEFAULT_TENANT_ID",
    "ALL_SCOPES",
    "IssuedKey",
    "hash_api_key",
    "get_tenant_by_name",
    "get_or_create_tenant",
    "issue_api_key",
    "find_active_key",
    "revoke_api_key",
    "list_api_keys",
]

#: Created by the initial migration; owns everything while authentication is off.
DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000000"
ALL_SCOPES = ("read", "write", "moe")


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    tenant_id: str
    api_key: str  # shown once, never stored
    scopes: tuple[str, ...]


def hash_api_key(api_key: str, secret: str) -> str:
    return hmac.new(secret.encode(), api_key.encode(), hashlib.sha256).hexdigest()


def get_tenant_by_name(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = get_tenant_by_name(session, name)
    if tenant is None:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.flush()
    return tenant


def issue_api_key(
    session: Session, tenant: Tenant, secret: str, *, scopes: tuple[str, ...] = ALL_SCOPES, name: str = ""
) -> IssuedKey:
    unknown = set(scopes) - set(ALL_SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes {sorted(unknown)}; valid scopes are {list(ALL_SCOPES)}")
    prefix = secrets.token_hex(4)
    api_key = f"hp_{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey(
        tenant_id=tenant.id, name=name, prefix=prefix, key_hash=hash_api_key(api_key, secret), scopes=" ".join(scopes)
    )
    session.add(row)
    session.flush()
    return IssuedKey(key_id=row.id, tenant_id=tenant.id, api_key=api_key, scopes=tuple(scopes))


def find_active_key(session: Session, api_key: str, secret: str) -> ApiKey | None:
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_api_key(api_key, secret)))
    if row is None or row.revoked_at is not None:
        return None
    return row


def revoke_api_key(session: Session, key_id: str) -> bool:
    row = session.get(ApiKey, key_id)
    if row is None:
        return False
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return True


def list_api_keys(session: Session, tenant: Tenant) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id).order_by(ApiKey.created_at)))
