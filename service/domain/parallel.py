"""3D-parallel planning use case: request -> ``partitioners.parallel3d.planner`` -> JSON.

Stateless: nothing is stored. A cluster may be given as a hyperplace inventory
(``cluster.inventory``); the planner reads its figures through
``cluster_from_inventory``, so inventory presets and the planner agree.
"""

from __future__ import annotations

import time

from partitioners.hardware.inventory import inventory_from_json
from partitioners.parallel3d.planner import plan_from_request
from partitioners.parallel3d.specs import cluster_from_inventory
from service.schemas.parallel import ParallelPlanRequest

__all__ = ["parallel_plan"]


def parallel_plan(request: ParallelPlanRequest) -> dict:
    body = request.model_dump(exclude_none=True, exclude={"rank_map_limit"})
    inventory_doc = body["cluster"].pop("inventory", None)
    if inventory_doc is not None:
        body["cluster"] = cluster_from_inventory(inventory_from_json(inventory_doc))
    started = time.perf_counter()
    document = plan_from_request(body, rank_map_limit=request.rank_map_limit)
    document["compute_s"] = round(time.perf_counter() - started, 4)
    return document
