"""Small plan requests of odd but valid structure, drawn from a seeded ``random.Random``.

Graphs with operators that read nothing or write nothing, read one tensor twice, or
restrict themselves to a device type; zero-byte and gigabyte tensors; explicit
clusters of one to three groups with tiny or large memories; every option. The
schema accepts all of them, so the service must answer each with a plan or a 4xx.
"""

from __future__ import annotations

import random

OP_TYPES = ["MatMul", "Relu", "Add", "Conv", "Softmax", "Gemm", "LayerNormalization", "SomethingUnknown"]
PRESETS = ["dgx-h100", "dgx-a100", "dgx-b200", "gb200-nvl72", "ascend-910b", "pcie-workstation"]


def random_graph(rng: random.Random) -> dict:
    """Parameters and inputs first, then operators that read what exists so far (a DAG)."""
    tensors: list[dict] = []
    for index in range(rng.randint(0, 3)):
        tensors.append({"name": f"w{index}", "bytes": rng.choice([0, 1, 1e3, 1e6, 1e9]), "kind": "parameter"})
    for index in range(rng.randint(0, 2)):
        tensors.append({"name": f"x{index}", "bytes": rng.choice([0, 4, 1e4, 1e8])})
    readable = [t["name"] for t in tensors]
    nodes = []
    for k in range(rng.choice([1, 1, 2, 3, 5, 8, 20])):
        inputs = rng.sample(readable, min(len(readable), rng.randint(0, 3)))
        if inputs and rng.random() < 0.1:
            inputs.append(inputs[0])
        outputs = [f"t{k}_{j}" for j in range(rng.choice([0, 1, 1, 1, 2]))]
        node: dict = {"name": f"op{k}", "op": rng.choice(OP_TYPES), "inputs": inputs, "outputs": outputs}
        if rng.random() < 0.5:
            node["flops"] = rng.choice([0, 1, 1e6, 1e12, 1e15])
        if rng.random() < 0.1:
            node["param_bytes"] = rng.choice([0, 1e6])
        if rng.random() < 0.1:
            node["device_types"] = [rng.choice(["gpu", "cpu", "H100"])]
        nodes.append(node)
        for name in outputs:
            tensor: dict = {"name": name, "bytes": rng.choice([0, 1, 4096, 1e6, 1e9])}
            if rng.random() < 0.3:
                tensor.update(shape=[rng.randint(0, 64), rng.randint(1, 64)], dtype="float32")
            tensors.append(tensor)
            readable.append(name)
    return {"name": f"random-{rng.randrange(10**9)}", "nodes": nodes, "tensors": tensors}


def random_inventory(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return {"preset": rng.choice(PRESETS), "nodes": rng.choice([1, 1, 2, 3])}
    groups = []
    for g in range(rng.randint(1, 3)):
        devices = [
            {
                "name": f"g{g}d{i}",
                "type": rng.choice(["gpu", "cpu"]),
                "peak_flops": rng.choice([1e9, 1e12, 1e15]),
                "memory_tiers": [
                    {
                        "name": "HBM",
                        "capacity_bytes": rng.choice([1e3, 1e6, 1e9, 8e10]),
                        "bandwidth_bytes_per_s": rng.choice([1e6, 1e9, 3e12]),
                    }
                ]
                + (
                    [{"name": "L2", "capacity_bytes": 5e7, "bandwidth_bytes_per_s": 1e13}] if rng.random() < 0.3 else []
                ),
            }
            for i in range(rng.randint(1, 4))
        ]
        link = {"bandwidth_bytes_per_s": rng.choice([1e6, 1e9, 4e11]), "latency_s": rng.choice([0, 1e-6, 0.1])}
        groups.append({"name": f"g{g}", "devices": devices, "link": link})
    inventory: dict = {"name": "random", "groups": groups}
    if len(groups) > 1 or rng.random() < 0.3:
        inventory["link"] = {"bandwidth_bytes_per_s": rng.choice([1e3, 1e9, 5e10]), "latency_s": rng.choice([0, 5e-6])}
    return inventory


def random_options(rng: random.Random) -> dict:
    choices = {
        "mode": ["inference", "training"],
        "micro_batches": [1, 2, 7, 64],
        "objective": ["makespan", "throughput", "communication"],
        "pipeline": [True, False],
        "max_devices": [1, 2, 3, 100],
        "memory_headroom_fraction": [0.0, 0.5, 0.9],
        "strategy": ["auto", "single", "heft", "metis", "pipeline", "hybrid"],
        "seed": [0, 7],
    }
    return {name: rng.choice(values) for name, values in choices.items() if rng.random() < 0.4}


def random_plan_request(seed: int) -> dict:
    rng = random.Random(seed)
    return {"graph": random_graph(rng), "inventory": random_inventory(rng), "options": random_options(rng)}
