"""Small request bodies shared by the API tests."""

from __future__ import annotations

import copy

from bench.synthetic import diamond_graph_json as diamond_graph

__all__ = ["diamond_graph", "measured_timeline", "plan_request"]


def plan_request(graph: dict | None = None, *, preset: str = "dgx-h100", nodes: int = 1, **options) -> dict:
    return {"graph": copy.deepcopy(graph or diamond_graph()), "inventory": {"preset": preset, "nodes": nodes}, "options": options}


def measured_timeline(plan: dict) -> dict:
    """A measured timeline in the simple form, one 1 ms run of every operator of ``plan``
    on the device the plan put it on (what a profiler would send back)."""
    ops, start_s = [], 0.0
    for name, device in sorted(plan["ops"].items()):
        ops.append({"name": name, "device": device, "start_s": start_s, "duration_s": 1e-3})
        start_s += 1e-3
    return {"ops": ops}
