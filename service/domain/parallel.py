"""3D-parallel planning use case: request -> the planner's typed specs -> search or evaluation -> answer.

Stateless: nothing is stored. This is the one place where a ``POST /v1/parallel/plan``
body becomes the frozen dataclasses of :mod:`partitioners.parallel3d.specs`
(:func:`plan_inputs`) and where the planner's results become the answer document
(:func:`plan_answer`, whose shape ``service.schemas.parallel.ParallelPlanAnswer``
declares). A cluster may be given as a hyperplace inventory (``cluster.inventory``);
the planner reads its figures through ``cluster_from_inventory``, so inventory presets
and the planner agree.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.parallel3d.effective import effective_terms
from partitioners.parallel3d.planner import evaluate_layouts, plan_parallel_layout, rank_map
from partitioners.parallel3d.spec_fields import spec_from_mapping
from partitioners.parallel3d.specs import (
    MAX_EVALUATED_LAYOUTS,
    ClusterSpec,
    Constraints,
    LayoutSpec,
    ModelSpec,
    TrainingSpec,
)
from service.schemas.parallel import ParallelPlanRequest

__all__ = ["ParallelPlanInputs", "plan_inputs", "plan_answer", "parallel_plan"]

_REQUEST_FIELDS = ("model", "cluster", "training", "constraints", "evaluate", "top_k")


@dataclass(frozen=True)
class ParallelPlanInputs:
    """A plan request as the planner takes it: typed specs, and the layouts to evaluate (None: search)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    constraints: Constraints | None = None
    evaluate: tuple[LayoutSpec, ...] | None = None
    top_k: int = 10


def plan_inputs(body: Mapping[str, Any]) -> ParallelPlanInputs:
    """Read a request body (JSON-shaped; absent or null fields take their defaults) into typed specs.

    Raises
    ------
    InvalidInput
        An unknown or missing key, or anything a spec refuses, named by its path
        (``model.moe.num_experts``, ``evaluate[2].recompute``).
    InputTooLarge
        More than ``MAX_EVALUATED_LAYOUTS`` layouts to evaluate.
    """
    if not isinstance(body, Mapping):
        raise InvalidInput("the request must be an object", field="", code="not-an-object")
    unknown = sorted(set(body) - set(_REQUEST_FIELDS))
    if unknown:
        raise InvalidInput(
            f"unknown field(s) {unknown}; allowed {sorted(_REQUEST_FIELDS)}", field=unknown[0], code="unknown-field"
        )
    for key in ("model", "cluster", "training"):
        if key not in body:
            raise InvalidInput(f"{key} is required", field=key, code="missing-field")
    top_k = body.get("top_k", 10)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise InvalidInput("top_k must be an integer", field="top_k", code="not-an-integer")
    evaluate = body.get("evaluate")
    layouts = None
    if evaluate is not None:
        if isinstance(evaluate, (str, bytes, Mapping)) or not isinstance(evaluate, Sequence):
            raise InvalidInput("evaluate must be a list of layouts", field="evaluate", code="not-a-list")
        if len(evaluate) > MAX_EVALUATED_LAYOUTS:
            raise InputTooLarge(
                f"evaluate holds {len(evaluate)} layouts; at most {MAX_EVALUATED_LAYOUTS} per request",
                field="evaluate",
                code="too-many-layouts",
            )
        layouts = tuple(spec_from_mapping(LayoutSpec, layout, f"evaluate[{k}]") for k, layout in enumerate(evaluate))
    constraints = body.get("constraints")
    return ParallelPlanInputs(
        model=spec_from_mapping(ModelSpec, body["model"]),
        cluster=spec_from_mapping(ClusterSpec, body["cluster"]),
        training=spec_from_mapping(TrainingSpec, body["training"]),
        constraints=None if constraints is None else spec_from_mapping(Constraints, constraints),
        evaluate=layouts,
        top_k=top_k,
    )


def plan_answer(inputs: ParallelPlanInputs, *, rank_map_limit: int | None = 1024) -> dict[str, Any]:
    """Search, or predict the given layouts, and answer as ``ParallelPlanAnswer`` declares.

    A search answers ``{"mode": "search", ...}`` with the ranked candidates and up to
    ``rank_map_limit`` ranks of the top one's rank map; an evaluation
    ``{"mode": "evaluate", "predictions": [...]}``, one per layout, in order, each with
    its own rank map. Both echo the model shape planned (what a Hugging Face config was
    read as) and the physical terms the run's software settings were resolved into
    (``assumptions``).
    """
    # what the prediction assumed about the software stack, each term with its source
    shape = {
        "model": inputs.model.to_dict(),
        "assumptions": [term.to_dict() for term in effective_terms(inputs.training).assumptions],
    }
    if inputs.evaluate is not None:
        predictions = evaluate_layouts(
            inputs.model, inputs.cluster, inputs.training, inputs.evaluate, inputs.constraints
        )
        return {
            "mode": "evaluate",
            **shape,
            "predictions": [
                {**p.to_dict(), "rank_map": rank_map(inputs.cluster, p).to_dict(rank_map_limit)} for p in predictions
            ],
        }
    plan = plan_parallel_layout(inputs.model, inputs.cluster, inputs.training, inputs.constraints, top_k=inputs.top_k)
    return {"mode": "search", **shape, **plan.to_dict(rank_map_limit)}


def parallel_plan(request: ParallelPlanRequest) -> dict[str, Any]:
    """``POST /v1/parallel/plan``: the validated request planned, with the seconds it took."""
    body = request.model_dump(exclude_none=True, exclude={"rank_map_limit"})
    started = time.perf_counter()
    document = plan_answer(plan_inputs(body), rank_map_limit=request.rank_map_limit)
    document["compute_s"] = round(time.perf_counter() - started, 4)
    return document
