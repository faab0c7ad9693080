"""A plan that cannot fit in memory is a 422 titled "Does not fit" whose hint names only changes that can help."""

from __future__ import annotations

from tests.service.graphs import plan_request

GB = 1e9


def heavy_chain(n_ops: int, weight_bytes: float) -> dict:
    """``n_ops`` operators in a row, each with its own weight of ``weight_bytes``."""
    nodes = [
        {"name": f"op{i}", "op": "MatMul", "inputs": [f"x{i}", f"w{i}"], "outputs": [f"x{i + 1}"], "flops": 1e12}
        for i in range(n_ops)
    ]
    tensors = [{"name": f"x{i}", "bytes": 1e6} for i in range(n_ops + 1)]
    tensors += [{"name": f"w{i}", "bytes": weight_bytes, "kind": "parameter"} for i in range(n_ops)]
    return {"name": f"heavy-{n_ops}", "nodes": nodes, "tensors": tensors}


def test_a_graph_over_a_nodes_memory_is_a_422_titled_does_not_fit(client):
    # 30 x 30 GB of weights on one DGX H100 node (8 x 80 GB)
    response = client.post("/v1/plans", json=plan_request(heavy_chain(30, 30 * GB)))
    assert response.status_code == 422
    problem = response.json()
    assert problem["title"] == "Does not fit"
    assert problem["type"].endswith("/problems/does-not-fit")
    assert "more devices" in problem["detail"] and "smaller batch" in problem["detail"]


def test_the_hint_names_no_option_already_at_its_minimum(client):
    problem = client.post("/v1/plans", json=plan_request(heavy_chain(30, 30 * GB))).json()
    for option in ("micro_batches", "memory_headroom_fraction", "max_devices", "mode=inference"):
        assert option not in problem["detail"], problem["detail"]


def test_the_hint_names_the_options_that_were_set_above_their_minimum(client):
    options = {"micro_batches": 2, "memory_headroom_fraction": 0.2, "max_devices": 4}
    problem = client.post("/v1/plans", json=plan_request(heavy_chain(30, 30 * GB), **options)).json()
    assert problem["title"] == "Does not fit"
    assert "fewer micro_batches (now 2)" in problem["detail"]
    assert "memory_headroom_fraction (now 0.2)" in problem["detail"]
    assert "a higher max_devices (now 4 of the inventory's 8)" in problem["detail"]


def test_one_operator_larger_than_every_device_asks_for_more_memory_not_more_devices(client):
    problem = client.post("/v1/plans", json=plan_request(heavy_chain(2, 100 * GB), nodes=2)).json()
    assert problem["title"] == "Does not fit"
    assert "devices with more memory" in problem["detail"] and "more devices (" not in problem["detail"]
