"""Small request bodies shared by the API tests."""

from __future__ import annotations

import copy

from bench.synthetic import diamond_graph_json as diamond_graph

__all__ = ["diamond_graph", "plan_request"]


def plan_request(graph: dict | None = None, *, preset: str = "dgx-h100", nodes: int = 1, **options) -> dict:
    return {"graph": copy.deepcopy(graph or diamond_graph()), "inventory": {"preset": preset, "nodes": nodes}, "options": options}
