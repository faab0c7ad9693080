"""3D-parallel planning use case: request -> ``partitioners.parallel3d`` -> JSON.

Stateless: nothing is stored. A cluster may be given as a hyperplace inventory;
its (homogeneous) figures become the planner's cluster description here, so the
inventory presets and the planner never disagree about a GPU.
"""

from __future__ import annotations

import time

import numpy as np

from partitioners.errors import InvalidInput
from partitioners.inventory import inventory_from_json
from partitioners.parallel3d import evaluate_layouts, plan_parallel_layout
from partitioners.parallel3d_specs import NODE_PRESETS
from service.schemas.parallel import ParallelPlanRequest

__all__ = ["cluster_document", "parallel_plan"]


def cluster_document(request: ParallelPlanRequest) -> dict:
    cluster = request.cluster.model_dump(exclude_none=True)
    inventory_doc = cluster.pop("inventory", None)
    if inventory_doc is None:
        return cluster
    inventory = inventory_from_json(inventory_doc)
    if inventory.preset in NODE_PRESETS:  # the planner's own GPU figures (SM count, GEMM efficiency) for it
        return {"preset": inventory.preset, "nodes": int(inventory.n_groups), **cluster}
    group_sizes = np.bincount(inventory.device_group)
    if len(set(group_sizes.tolist())) != 1 or len(set(inventory.device_types.tolist())) != 1:
        raise InvalidInput(
            "3D-parallel planning needs identical nodes of one GPU type; this inventory mixes them.",
            field="cluster.inventory",
            code="heterogeneous",
        )
    peaks = {dtype: float(values[0]) for dtype, values in inventory.device_peak_flops_by_dtype.items() if np.isfinite(values[0])}
    derived = {
        "name": inventory.name,
        "gpus_per_node": int(group_sizes[0]),
        "num_nodes": int(inventory.n_groups),
        "peak_flops_per_s": peaks,
        "memory_bytes": float(inventory.device_memory_bytes[0]),
        "hbm_bandwidth_bytes_per_s": float(inventory.device_memory_bandwidth_bytes_per_s[0]),
        "intra_node_bandwidth_bytes_per_s": float(inventory.group_link_bandwidth_bytes_per_s[0]),
        "intra_node_latency_s": max(float(inventory.group_link_latency_s[0]), 1e-9),
        "inter_node_bandwidth_bytes_per_s": float(inventory.inter_link.bandwidth_bytes_per_s),
        "inter_node_latency_s": max(float(inventory.inter_link.latency_s), 1e-9),
    }
    return {**derived, **cluster}


def parallel_plan(request: ParallelPlanRequest) -> dict:
    parts = request.parts()
    cluster = cluster_document(request)
    started = time.perf_counter()
    if request.evaluate:
        layouts = [layout.model_dump(exclude_none=True) for layout in request.evaluate]
        predictions = evaluate_layouts(parts["model"], cluster, parts["training"], layouts, parts["constraints"])
        document = {"evaluated": [p.to_dict() for p in predictions]}
    else:
        plan = plan_parallel_layout(parts["model"], cluster, parts["training"], parts["constraints"], top_k=request.top_k)
        document = plan.to_dict(rank_map_limit=request.rank_map_limit)
    document["compute_s"] = round(time.perf_counter() - started, 4)
    return document
