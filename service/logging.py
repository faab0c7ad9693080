"""Structured logs (structlog): JSON lines carrying request id, tenant and plan id.

Handlers bind ``tenant`` and ``plan_id`` with ``structlog.contextvars`` and the
request middleware binds ``request_id``, so every line of one request can be
found together.
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging"]


def configure_logging(level: str = "INFO", json_lines: bool = True) -> None:
    logging.basicConfig(format="%(message)s", stream=sys.stderr, level=level.upper(), force=True)
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping().get(level.upper(), 20)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
