"""Answers of the operations endpoints: liveness (``/healthz``) and readiness (``/readyz``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from service.schemas.common import ResponseModel

__all__ = ["Liveness", "Readiness", "NotReady"]


class Liveness(ResponseModel):
    """The process is up and answering; says nothing about the database."""

    status: Literal["ok"]


class Readiness(ResponseModel):
    """The database answers and its schema is at the migrations' head: send traffic."""

    status: Literal["ready"]
    database: Literal["ok"]
    revision: str | None = Field(description="The Alembic revision the database is at (the head).")


class NotReady(ResponseModel):
    """Why not to send traffic yet (with a 503 and ``Retry-After``): the database is
    unreachable (``detail`` names the error's class) or not migrated to ``head``."""

    status: Literal["unavailable"]
    database: Literal["unreachable", "not migrated"]
    detail: str | None = Field(None, description="Unreachable: the class of the error met (no message, no secrets).")
    revision: str | None = Field(None, description="Not migrated: the revision the database is at (null: none).")
    head: str | None = Field(None, description="Not migrated: the revision this server needs.")
