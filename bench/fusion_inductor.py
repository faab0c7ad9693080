"""Do hyperplace's fusion groups agree with what TorchInductor fuses? One GPT-2-style block, both ways.

The block (pre-norm attention and MLP with residuals, d=64, 4 heads) is compiled by
TorchInductor (``torch.compile``, CPU backend: C++ kernels named ``cpp_fused_<ops>_N``,
GEMMs as ``extern_kernels`` calls) and exported to ONNX with ``torch.onnx.export``; the
ONNX graph is then grouped by :func:`partitioners.placement.fusion.fusion_groups` in
``elementwise`` mode (the mode that follows Inductor) and ``compiler`` mode. Printed:
Inductor's fused kernels and extern calls, and each hyperplace group of several
operators, so the two can be read side by side.

Needs torch (``pip install -e .[torch]``). Run: ``.venv/bin/python -m bench.fusion_inductor``
(about 1.5 minutes on two cores, most of it Inductor compiling C++).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.placement.fusion import fusion_groups


def _block():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int = 64, heads: int = 4) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.heads = heads

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            h = self.heads
            q, k, v = (y.view(b, t, h, d // h).transpose(1, 2) for y in self.qkv(self.ln1(x)).split(d, dim=2))
            attention = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / (d // h) ** 0.5), dim=-1) @ v
            x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    torch.manual_seed(0)
    return Block().eval(), torch.randn(2, 16, 64)


def main() -> None:
    import torch
    from torch._inductor.utils import run_and_get_code

    model, x = _block()
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(model), x)
    source = "\n".join(code)
    kernels = sorted(set(re.findall(r"(cpp_fused_\w+?)(?:\s*=|\()", source)))
    externs = re.findall(r"extern_kernels\.(\w+)", source)
    print(
        f"TorchInductor {torch.__version__}: {len(kernels)} fused kernels, {len(externs)} extern calls {sorted(set(externs))}"
    )
    for kernel in kernels:
        print(f"  {kernel}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "block.onnx"
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
        graph = graph_from_onnx_bytes(path.read_bytes())
    print(f"\nONNX export: {graph.n_ops} operators")
    for mode in ("elementwise", "compiler"):
        groups = fusion_groups(graph, mode)
        members: dict[int, list[str]] = {}
        for op in groups.topological_order.tolist():
            members.setdefault(int(groups.op_group[op]), []).append(str(graph.op_types[op]))
        multi = [ops for ops in members.values() if len(ops) > 1]
        print(f"hyperplace {mode}: {groups.n_groups} kernels, {len(multi)} of several operators")
        for ops in multi:
            print(f"  {'+'.join(ops)}")


if __name__ == "__main__":
    main()
