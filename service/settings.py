"""Service settings, read from the environment (prefix ``HYPERPLACE_``).

One object, built once per process by :func:`get_settings`; tests build their
own and pass it to :func:`service.app.create_app`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = ["Settings", "get_settings", "DEFAULT_API_KEY_SECRET", "LOG_LEVELS"]

#: Used to HMAC API keys when no secret is configured. Fine for a laptop; the
#: service logs a warning when it is used with PostgreSQL.
DEFAULT_API_KEY_SECRET = "hyperplace-development-secret"

#: The levels HYPERPLACE_LOG_LEVEL may name, most verbose first.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(BaseSettings):
    """Everything an operator can set. Each field maps to ``HYPERPLACE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="HYPERPLACE_", extra="ignore")

    database_url: str = Field(
        "sqlite:///./hyperplace.sqlite3",
        description="SQLAlchemy URL. SQLite file (embedded default) or postgresql+psycopg://...",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    auth: Literal["auto", "required", "disabled"] = Field(
        "auto",
        description="auto: off on SQLite, on with PostgreSQL. required / disabled force it.",
    )
    api_key_secret: str = Field(DEFAULT_API_KEY_SECRET, description="HMAC key for stored API key hashes.")
    auto_migrate: bool = Field(False, description="Run `alembic upgrade head` at start-up instead of refusing.")
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    # A JSON body costs the server far more than its bytes while it is parsed and handled:
    # a 27 MiB MoE load matrix (512 layers x 8,000 experts, about HYPERPLACE_MOE_MAX_SLOTS)
    # took 2.1 GiB and 15 s (bench/request_bodies.py). One body limit's worth at a time
    # keeps the process near that; smaller bodies share it (service.api.body_budget).
    max_body_bytes_in_flight: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Bytes of request bodies over 1 MiB handled at once per process; "
        "a body that would pass it waits, then gets 503 (a larger one still runs alone).",
    )
    body_wait_s: float = Field(
        10.0, ge=0, description="How long a large body waits for HYPERPLACE_MAX_BODY_BYTES_IN_FLIGHT before 503."
    )
    # The body deadline: after a grace period a body must have arrived at this average
    # rate (a deadline that moves with every byte), or the request gets 408 and its
    # body-budget reservation goes back (service.api.middleware.BodyRateMiddleware).
    body_min_bytes_per_s: int = Field(
        64 * 1024,
        ge=1,
        description="Average rate a request body must keep up after HYPERPLACE_BODY_READ_GRACE_S; slower: 408.",
    )
    body_read_grace_s: float = Field(
        10.0, ge=0, description="Seconds a request body may take before HYPERPLACE_BODY_MIN_BYTES_PER_S applies."
    )
    # Limits of the HTTP server process (service/server.py; nginx in deploy/ sets the same).
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Request line and headers together; more: 431 and the connection closes.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a connection may take to send a request head (from opening, or the previous "
        "answer); slower: 408 and the connection closes.",
    )
    keep_alive_s: float = Field(5.0, gt=0, description="An idle keep-alive connection closes after this long.")
    max_connections: int = Field(
        2048,
        ge=1,
        description="Open connections per server process; a new one past it gets 503 and is closed. Kept "
        "256 below the process's open-file limit, which `hyperplace serve` raises to its hard limit.",
    )
    shutdown_grace_s: float = Field(
        20.0,
        ge=0,
        description="On SIGTERM, how long requests in flight may finish before they are cancelled and the "
        "ONNX import workers killed; the process exits at most 10 s after that.",
    )
    max_graph_ops: int = Field(1_000_000, ge=1, description="Graphs with more operators are rejected (413).")
    sync_max_ops: int = Field(
        20_000,
        ge=0,
        description="Graphs up to this many operators are planned in the request; larger ones become jobs.",
    )
    max_plan_devices: int = Field(
        2048,
        ge=1,
        description="Inventories with more devices are rejected (413): planning memory grows with devices squared.",
    )
    moe_max_slots: int = Field(
        4_194_304, ge=1, description="MoE requests over this many layers x physical slots are rejected (413)."
    )
    # Measured (Linux x86-64, Python 3.11, onnx 1.23): the ONNX fixtures take at most
    # 23 MiB over the import worker's start-up footprint, a 1,000,000-operator chain
    # (HYPERPLACE_MAX_GRAPH_OPS) 2.3 GiB and a 63 MiB graph-only GPT export of 765,004
    # nodes (partitioners/graph/synthetic_onnx.py, 15,000 layers; about HYPERPLACE_MAX_BODY_BYTES)
    # 3.1 GiB, all as address space (RLIMIT_AS). 6 GiB leaves twice as much again; a
    # crafted rank-doubling Gather chain asks for more than any machine has and is
    # refused here instead.
    onnx_import_memory_bytes: int = Field(
        6 * 2**30,
        ge=0,
        description="Address space one ONNX import may use on top of its worker process's start-up footprint; "
        "a model that needs more is refused (413). Imports run in separate processes so that running out "
        "kills no server. 0: import in the server process, unbounded (platforms without RLIMIT_AS).",
    )
    # The 61,204-node synthetic GPT export imports in 5.3 s (docs/validation.md, ONNX import);
    # the 765,004-node one, the largest a 64 MiB body holds, in about ten times that.
    onnx_import_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Wall-clock seconds one ONNX import may take; its worker process is then killed and "
        "replaced, and the answer is 413 (import-timeout), not retried.",
    )
    onnx_import_wait_s: float = Field(
        10.0,
        ge=0,
        description="How long an ONNX upload waits (on the event loop, holding no thread) for one of the "
        "two import workers before the answer is 503 with Retry-After.",
    )
    gc_gen0_threshold: int = Field(
        50_000,
        ge=0,
        description="Python GC generation-0 threshold (0: interpreter default, 700). Higher means fewer full "
        "collections in the middle of MoE requests: bench/moe_http.py p99.",
    )
    sync_plan_slots: int = Field(
        2,
        ge=1,
        description="Graphs planned inside requests at once (see service.domain.compute_slots); with all "
        "busy a new submission is queued as a job (202) and a re-plan waits, then gets 503.",
    )
    sync_plan_wait_s: float = Field(
        10.0, ge=0, description="How long a re-plan waits for a planning slot before the answer is 503."
    )
    # A worst-case 3D-parallel search (bench.parallel3d: 5,040 layers x 5,040 experts on
    # 100,800 GPUs, 2.6M layouts) holds ~1.5 GiB and one core for 10-20 s; FastAPI's thread
    # pool would otherwise run 40 of them at once.
    parallel_plan_slots: int = Field(
        2, ge=1, description="3D-parallel searches (POST /v1/parallel/plan) computed at once; more wait for a slot."
    )
    parallel_plan_wait_s: float = Field(
        30.0, ge=0, description="How long a 3D-parallel search waits for a free slot before the answer is 503."
    )
    job_lease_s: float = Field(30.0, gt=0, description="A running job whose lease is older is claimed again.")
    worker_poll_s: float = Field(0.5, gt=0)
    embedded_worker: bool | None = Field(
        None, description="Run jobs in-process. Default: on for SQLite, off for PostgreSQL (use `hyperplace worker`)."
    )
    moe_min_improvement: float = Field(
        0.01, ge=0, description="A MoE load report must improve max/mean balance by this much to move experts."
    )
    moe_balance_target: float = Field(
        1.015,
        ge=1,
        description="Max/mean at which a repaired MoE layer stops moving copies (the request's balance_target).",
    )
    moe_move_budget_fraction: float = Field(
        0.14,
        ge=0,
        le=1,
        description="Share of a MoE deployment's physical slots one report may rewrite for balance, on top of "
        "re-creating experts that lost every copy (the request's move_budget).",
    )
    moe_repair_budget_fraction: float = Field(
        0.08,
        ge=0,
        le=1,
        description="Share of a MoE deployment's physical slots a GPU failure may rewrite for balance on the "
        "survivors, on top of one copy per expert that lost every copy (the request's repair_budget).",
    )
    log_level: str = Field("INFO", description="One of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case).")
    log_json: bool = True

    @field_validator("log_level")
    @classmethod
    def _a_known_log_level(cls, log_level: str) -> str:
        """Refuse a level ``logging`` does not know: it would otherwise fall back to INFO unnoticed."""
        level = log_level.strip().upper()
        if level not in LOG_LEVELS:
            # named in full: the server can be started without the CLI (uvicorn --factory)
            raise ValueError(
                f"HYPERPLACE_LOG_LEVEL is {log_level!r}, not a log level; use one of {', '.join(LOG_LEVELS)}"
            )
        return level

    @field_validator("database_url")
    @classmethod
    def _a_supported_database(cls, database_url: str) -> str:
        """Refuse at start-up what the engine would fail on later, with a traceback.

        A plain ``postgresql://`` URL means psycopg 3, the driver the service ships
        with (SQLAlchemy would otherwise look for psycopg2).
        """
        try:
            url = make_url(database_url)
        except ArgumentError:
            raise ValueError(
                "is not a database URL; use sqlite:///path/to/file.sqlite3 or "
                "postgresql+psycopg://user:password@host/database"
            ) from None
        backend = url.get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise ValueError(f"names a {backend} database; hyperplace runs on sqlite or postgresql")
        if url.drivername == "postgresql":
            return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        if backend == "postgresql" and url.get_driver_name() != "psycopg":
            raise ValueError(
                f"uses the {url.get_driver_name()} driver; hyperplace ships psycopg (postgresql+psycopg://...)"
            )
        return database_url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def auth_enabled(self) -> bool:
        if self.auth == "auto":
            return not self.is_sqlite
        return self.auth == "required"

    @property
    def runs_embedded_worker(self) -> bool:
        return self.is_sqlite if self.embedded_worker is None else self.embedded_worker


@lru_cache
def get_settings() -> Settings:
    return Settings()
