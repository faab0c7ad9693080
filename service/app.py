"""Application factory: ``create_app(settings) -> FastAPI``.

Wires settings, the database engine, middleware, problem handlers and routers.
Tests build one app per database with their own settings; ``hyperplace serve``
builds one from the environment.
"""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from service.api import health
from service.api.body_budget import BodyBudget, BodyBudgetMiddleware
from service.api.middleware import (
    BodyRateMiddleware,
    BodySizeLimitMiddleware,
    HeadMiddleware,
    HttpMetrics,
    RequestContextMiddleware,
)
from service.api.problems import install_problem_handlers
from service.api.v1 import router as v1_router
from service.domain.compute_slots import ComputeSlots
from service.domain.onnx_worker import ImportLimits, serving_onnx_imports
from service.logging import configure_logging
from service.settings import DEFAULT_API_KEY_SECRET, Settings, get_settings
from service.storage.db import make_engine, make_session_factory
from service.storage.migrate import current_revision, head_revision, upgrade_to_head

__all__ = ["create_app", "NotMigrated", "ensure_migrated"]

log = structlog.get_logger("hyperplace")


class NotMigrated(RuntimeError):
    """The database schema is not at the migrations' head."""


def ensure_migrated(engine, settings: Settings) -> None:
    """Upgrade (when configured to) or refuse to run against an out-of-date schema."""
    if settings.auto_migrate:
        upgrade_to_head(engine)
        return
    current = current_revision(engine)
    head = head_revision(settings.database_url)
    if current != head:
        raise NotMigrated(
            f"The database at {engine.url.render_as_string(hide_password=True)} is at revision {current!r}, "
            f"not at head {head!r}. Run `hyperplace migrate` (or set HYPERPLACE_AUTO_MIGRATE=true)."
        )


def _hoist_request_schema_defs(app: FastAPI) -> None:
    """Request bodies declared by hand (``openapi_extra``, e.g. POST /v1/plans' JSON and
    multipart forms) carry their models in a local ``$defs`` while their ``$ref``s point
    at ``#/components/schemas/``: move those models there, or clients cannot resolve them."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = generate()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for operations in document.get("paths", {}).values():
                for operation in operations.values():
                    for content in operation.get("requestBody", {}).get("content", {}).values():
                        for name, definition in content.get("schema", {}).pop("$defs", {}).items():
                            components.setdefault(name, definition)
        return app.openapi_schema

    app.openapi = openapi


def tune_garbage_collector(gen0_threshold: int) -> None:
    """Fewer, cheaper cyclic-GC passes: the request path allocates many short-lived lists.

    The interpreter's default (a generation-0 pass every 700 net allocations, a full
    pass every 100 of those) lands full collections inside MoE requests and tripled
    their p99 (bench/moe_http.py: server-side p99 68 ms -> 27 ms with this). Almost
    all garbage here is acyclic and freed by reference counting anyway.
    ``gc.freeze`` moves what start-up built out of the collector's sight.
    """
    if gen0_threshold <= 0:
        return
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(settings.log_level, settings.log_json)
    engine = make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        ensure_migrated(engine, settings)
        tune_garbage_collector(settings.gc_gen0_threshold)
        if settings.auth_enabled:
            if settings.api_key_secret == DEFAULT_API_KEY_SECRET and not settings.is_sqlite:
                log.warning("HYPERPLACE_API_KEY_SECRET is the development default; set a secret in production")
            log.info("authentication required: send 'Authorization: Bearer <key>'")
        else:
            log.warning("authentication is OFF: every request acts as the 'default' tenant (embedded mode)")
        runner = None
        if settings.runs_embedded_worker:
            from service.domain.jobs import EmbeddedWorker

            runner = EmbeddedWorker(app.state.session_factory, settings)
            runner.start()
        app.state.job_runner = runner
        try:
            with serving_onnx_imports(ImportLimits.of(settings)):  # stops the import workers
                yield
        finally:
            if runner is not None:
                runner.stop()
            engine.dispose()

    app = FastAPI(
        title="hyperplace",
        version="0.1.0",
        summary="Placement backend for deep-learning compilers.",
        description=(
            "POST a computation graph (ONNX or JSON) and a cluster inventory; get a placement plan with its "
            "predicted makespan, peak memory and communication. Errors are RFC 9457 problem details."
        ),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.head_revision = head_revision(settings.database_url)
    app.state.metrics = HttpMetrics(CollectorRegistry())
    app.state.planning_slots = ComputeSlots(
        "planning inside a request", settings.sync_plan_slots, settings.sync_plan_wait_s
    )
    app.state.body_budget = BodyBudget(settings.max_body_bytes_in_flight, settings.body_wait_s)
    app.state.parallel_plan_slots = ComputeSlots(
        "3D-parallel searches", settings.parallel_plan_slots, settings.parallel_plan_wait_s
    )

    install_problem_handlers(app)
    _hoist_request_schema_defs(app)
    # Added last runs first: the request id exists before the size check answers, a body
    # over the limit is refused before it waits for the budget of bodies in flight, and
    # a HEAD is logged and counted as a HEAD though it runs as a GET.
    app.add_middleware(HeadMiddleware)
    # inside the budget: a body cut for its rate gives its reservation back on the way out
    app.add_middleware(
        BodyRateMiddleware, min_bytes_per_s=settings.body_min_bytes_per_s, grace_s=settings.body_read_grace_s
    )
    app.add_middleware(BodyBudgetMiddleware, budget=app.state.body_budget, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, metrics=app.state.metrics)

    app.include_router(health.router)
    app.include_router(v1_router)
    return app
