"""Engine and session factory for both dialects.

SQLite (the embedded default) runs in WAL mode with ``BEGIN IMMEDIATE`` so
concurrent writers queue on the database lock instead of failing half way
(the approach Prefect's server takes); PostgreSQL is used as it comes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["make_engine", "make_session_factory", "insert_or_fetch"]

RowT = TypeVar("RowT")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
        dbapi_connection.isolation_level = None  # let us emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(database_url: str, **kwargs) -> Engine:
    """An engine for ``database_url`` with the dialect-specific settings applied."""
    if database_url.startswith("sqlite"):
        engine = create_engine(database_url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    # Fail fast when the server is down: the API answers 503 instead of hanging.
    connect_args = {"connect_timeout": 5}
    return create_engine(database_url, connect_args=connect_args, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autoflush=False)


def insert_or_fetch(session: Session, row: RowT, fetch: Callable[[], RowT | None]) -> RowT:
    """Insert ``row``, or return the row a concurrent writer inserted first.

    The insert runs in a SAVEPOINT so that losing a race on a unique key rolls back
    only the insert, not the caller's transaction; ``fetch`` then finds the winner.
    If it finds nothing the conflict was on something else, and the error surfaces.
    """
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
        return row
    except IntegrityError:
        existing = fetch()
        if existing is None:
            raise
        return existing
