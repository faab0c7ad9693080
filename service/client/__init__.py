"""A small httpx client for the hyperplace API, used by the CLI and by users.

from service.client import HyperplaceClient
with HyperplaceClient("http://127.0.0.1:8000", api_key=None) as hp:
    plan = hp.submit_plan(onnx_path="model.onnx", inventory={"preset": "dgx-h100", "nodes": 2})
    plan = hp.wait_for_plan(plan["id"])

Running a plan for real (needs ``pip install hyperplace[run]``, onnxruntime)::

from service.client import run_plan
prepared, result = run_plan(Path("model.onnx").read_bytes(), plan, dims={"batch": 1})
hp.post_feedback(plan["id"], {"timeline": result.timeline(), "match": "name"})

``run_plan``, ``RunError`` and ``compare_with_plan`` come from
:mod:`service.client.onnx_runner`, imported on first use (the service never needs it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

__all__ = ["HyperplaceClient", "ApiError", "run_plan", "RunError", "compare_with_plan"]

_RUNNER_NAMES = frozenset({"run_plan", "RunError", "compare_with_plan"})


def __getattr__(name: str) -> Any:
    """The runner's names, imported on first use: onnxruntime is an optional extra."""
    if name in _RUNNER_NAMES:
        from service.client import onnx_runner

        return getattr(onnx_runner, name)
    raise AttributeError(f"module 'service.client' has no attribute {name!r}")


class ApiError(RuntimeError):
    """A problem-details answer from the service."""

    def __init__(self, status: int, problem: dict) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


class HyperplaceClient:
    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 300.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def __enter__(self) -> HyperplaceClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _checked(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"title": response.reason_phrase, "detail": response.text[:500]}
            raise ApiError(response.status_code, problem)
        return response.json() if response.content else None

    def submit_plan(
        self,
        *,
        inventory: dict,
        graph: dict | None = None,
        onnx_path: str | Path | None = None,
        graph_id: str | None = None,
        options: dict | None = None,
        idempotency_key: str | None = None,
    ) -> dict:
        """POST /v1/plans: exactly one of ``graph``, ``onnx_path`` or ``graph_id``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        if onnx_path is not None:
            path = Path(onnx_path)
            files = {"model": (path.name, path.read_bytes(), "application/octet-stream")}
            data = {"inventory": json.dumps(inventory), "options": json.dumps(options or {})}
            response = self._http.post("/v1/plans", files=files, data=data, headers=headers)
        else:
            body = {"inventory": inventory, "options": options or {}}
            body.update({"graph": graph} if graph is not None else {"graph_id": graph_id})
            response = self._http.post("/v1/plans", json=body, headers=headers)
        return self._checked(response)

    def get_plan(self, plan_id: str, *, detail: str = "full") -> dict:
        return self._checked(self._http.get(f"/v1/plans/{plan_id}", params={"detail": detail}))

    def wait_for_plan(
        self,
        plan_id: str,
        *,
        poll_s: float = 0.5,
        timeout_s: float = 3600.0,
        on_progress: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the plan is done or failed (a job), reporting each poll to ``on_progress``."""
        deadline = time.monotonic() + timeout_s
        while True:
            plan = self.get_plan(plan_id, detail="summary")
            if on_progress is not None:
                on_progress(plan)
            if plan["status"] in ("done", "failed"):
                return self.get_plan(plan_id) if plan["status"] == "done" else plan
            if time.monotonic() > deadline:
                raise TimeoutError(f"plan {plan_id} still {plan['status']} after {timeout_s} s")
            time.sleep(poll_s)

    def list_model_plans(self, model_hash: str, **params: Any) -> dict:
        return self._checked(self._http.get(f"/v1/models/{model_hash}/plans", params=params))

    def trace(self, plan_id: str) -> dict:
        return self._checked(self._http.get(f"/v1/plans/{plan_id}/trace"))

    def post_feedback(self, plan_id: str, document: dict) -> dict:
        """POST /v1/plans/{id}/feedback: a measured timeline (docs/feedback.md)."""
        return self._checked(self._http.post(f"/v1/plans/{plan_id}/feedback", json=document))

    def accuracy(self, plan_id: str) -> dict:
        """GET /v1/plans/{id}/accuracy: prediction error before and after calibration."""
        return self._checked(self._http.get(f"/v1/plans/{plan_id}/accuracy"))

    def replan(self, plan_id: str, request: dict | None = None) -> dict:
        return self._checked(self._http.post(f"/v1/plans/{plan_id}/replan", json=request or {}))

    def moe_rebalance(self, request: dict) -> dict:
        return self._checked(self._http.post("/v1/moe/rebalance", json=request))

    def parallel_plan(self, request: dict) -> dict:
        return self._checked(self._http.post("/v1/parallel/plan", json=request))
