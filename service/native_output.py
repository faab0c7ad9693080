"""Keep what native libraries print off the process's standard output.

METIS (through pymetis) reports some partitioning requests with ``printf`` to file
descriptor 1, e.g. "***Cannot bisect a graph with 0 vertices!" when a heterogeneous
inventory gives a slow device a target smaller than any operator; it still returns a
valid partition (that device gets nothing). Standard output is where ``hyperplace plan``
writes the plan JSON, so such a line would corrupt it; the service itself logs to
standard error. :func:`native_stdout_to_stderr` points descriptor 1 at standard error
while planning runs, so the diagnostics stay visible where the logs are.

Descriptor 1 belongs to the whole process, so the redirection is reference-counted
under a lock: concurrent plans (the API's thread pool) share one redirection, the first
to enter installs it and the last to leave restores standard output. Python-level writes
to ``sys.stdout`` from other threads meanwhile land on standard error too, which is
where this service's output goes anyway.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["native_stdout_to_stderr"]

_STDOUT_FD = 1
_STDERR_FD = 2

_lock = threading.Lock()
_depth = 0
_saved_stdout_fd: int | None = None


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):  # closed or replaced streams
            pass


def _redirect() -> int | None:
    """Point descriptor 1 at descriptor 2 and return a copy of the old one, or None (and
    leave everything as it was) where either descriptor is closed: a plan must not fail
    over where diagnostics go."""
    try:
        saved = os.dup(_STDOUT_FD)
    except OSError:
        return None
    try:
        os.dup2(_STDERR_FD, _STDOUT_FD)
    except OSError:
        os.close(saved)
        return None
    return saved


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """While inside, anything written to file descriptor 1 goes to descriptor 2."""
    global _depth, _saved_stdout_fd
    with _lock:
        if _depth == 0:
            _flush_python_streams()
            _saved_stdout_fd = _redirect()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved_stdout_fd is not None:
                _flush_python_streams()
                os.dup2(_saved_stdout_fd, _STDOUT_FD)
                os.close(_saved_stdout_fd)
                _saved_stdout_fd = None
