"""Alembic from code: upgrade to head, and ask whether a database is at head.

The service refuses to start against a database that is not at head (or
upgrades it when ``HYPERPLACE_AUTO_MIGRATE`` is set). On PostgreSQL the upgrade
holds an advisory lock, so two replicas starting at once never race.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

__all__ = ["alembic_config", "upgrade_to_head", "current_revision", "head_revision", "is_at_head"]

_MIGRATION_LOCK_ID = 7_406_221_118  # arbitrary constant: pg_advisory_lock key for migrations


def _alembic_ini() -> Path:
    candidates = [
        os.environ.get("HYPERPLACE_ALEMBIC_INI"),
        Path(__file__).resolve().parents[2] / "alembic.ini",
        Path.cwd() / "alembic.ini",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("alembic.ini not found; set HYPERPLACE_ALEMBIC_INI to its path")


def alembic_config(database_url: str) -> Config:
    config = Config(str(_alembic_ini()))
    config.attributes["database_url"] = database_url
    config.attributes["configure_logger"] = False
    return config


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def is_at_head(engine: Engine) -> bool:
    return current_revision(engine) == head_revision(str(engine.url))


def upgrade_to_head(engine: Engine) -> None:
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK_ID})
            try:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                connection.commit()
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK_ID})
                connection.commit()
    else:
        command.upgrade(config, "head")
