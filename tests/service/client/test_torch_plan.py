"""The PyTorch path: a torch.export program as a hyperplace graph, and run split by a plan.

Both "devices" are the CPU (tests never need a GPU); what is checked is that the split
program, parts and cuts included, computes what the original does.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from partitioners.graph.json_import import graph_from_json  # noqa: E402
from service.client.torch_plan import apply_plan, export, graph_from_exported  # noqa: E402
from tests.service.api.test_run_feedback import cpu_inventory  # noqa: E402


class Block(nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        y = self.ln1(x)
        attended, _ = self.attn(y, y, y, need_weights=False)
        x = x + attended
        return x + self.mlp(self.ln2(x))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


@pytest.fixture(scope="module")
def block_program():
    torch.manual_seed(0)
    module = Block().eval()
    x = torch.randn(1, 8, 32)
    return module, x, export(module, (x,))


def test_the_graph_has_every_operator_with_flops_and_the_weights_as_parameters(block_program):
    module, _, program = block_program
    graph = graph_from_exported(program)
    tensors = {t["name"]: t for t in graph["tensors"]}
    parameters = [t for t in graph["tensors"] if t["kind"] == "parameter"]
    assert sum(t["bytes"] for t in parameters) == sum(4 * p.numel() for p in module.parameters())
    linear = next(n for n in graph["nodes"] if n["op"] == "linear")
    assert linear["flops"] == 2 * 8 * 32 * 96  # (8 x 32) @ (32 x 96): the fused q, k, v projection
    assert tensors[linear["outputs"][0]]["shape"][-1] == 96 and tensors[linear["outputs"][0]]["dtype"] == "float32"
    assert tensors["x"] == {"name": "x", "bytes": 8 * 32 * 4, "kind": "input", "shape": [1, 8, 32], "dtype": "float32"}
    assert graph_from_json(graph).n_ops == len(graph["nodes"])


def test_a_module_with_example_inputs_is_exported_here():
    graph = graph_from_exported(mlp(), (torch.randn(2, 16),))
    assert [n["op"] for n in graph["nodes"]] == ["linear", "relu", "linear", "relu", "linear"]
    assert graph["nodes"][0]["flops"] == 2 * 2 * 16 * 64


@pytest.mark.parametrize("layout", ["sliced", "round-robin"])
def test_the_program_split_over_two_cpu_devices_gives_the_original_outputs(block_program, layout):
    module, x, program = block_program
    names = [n["name"] for n in graph_from_exported(program)["nodes"]]
    if layout == "sliced":
        ops = {name: f"host/cpu{(2 * i) // len(names)}" for i, name in enumerate(names)}
    else:
        ops = {name: f"host/cpu{i % 2}" for i, name in enumerate(names)}
    run = apply_plan(program, {"ops": ops})
    assert len(run.parts) == 2 if layout == "sliced" else len(run.parts) > 2  # a cycle splits into stages
    with torch.no_grad():
        torch.testing.assert_close(run(x), program.module()(x), rtol=0, atol=0)  # the same kernels, bit for bit
        torch.testing.assert_close(run(x), module(x))  # eager attention may take another kernel: float tolerance


def test_a_plan_missing_an_operator_is_refused(block_program):
    _, _, program = block_program
    names = [n["name"] for n in graph_from_exported(program)["nodes"]]
    with pytest.raises(ValueError, match=names[-1]):
        apply_plan(program, {"ops": dict.fromkeys(names[:-1], "cpu0")})


def test_a_service_plan_of_the_exported_graph_runs_split_with_the_original_outputs(client):
    torch.manual_seed(0)
    module = mlp().eval()
    x = torch.randn(4, 16)
    program = export(module, (x,))
    response = client.post(
        "/v1/plans",
        json={
            "graph": graph_from_exported(program),
            "inventory": cpu_inventory(2),
            "options": {"strategy": "pipeline"},
        },
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    assert set(plan["ops"].values()) == {"cpu0", "cpu1"}
    run = apply_plan(program, plan)
    with torch.no_grad():
        torch.testing.assert_close(run(x), module(x), rtol=0, atol=0)
