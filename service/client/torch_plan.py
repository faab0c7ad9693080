"""PyTorch programs to hyperplace graphs and back: plan a ``torch.export`` program, run it split by the plan.

Two halves, no ONNX round trip (needs ``pip install hyperplace[torch]``; the service never
imports this module):

- :func:`graph_from_exported` turns a ``torch.export.ExportedProgram`` (or an ``nn.Module``
  and example inputs, exported here) into the service's JSON graph form: one node per
  ``call_function`` of the exported FX graph, named as FX names it; tensors with shapes and
  dtypes from the export's fake-tensor metadata; parameters and buffers as ``kind:
  parameter``. FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` running
  each operator on meta tensors (no data, no compute); operators it has no formula for
  (elementwise, views) count one FLOP per output element, as the ONNX importer does.
- :func:`apply_plan` splits the program's module along a plan's ``ops`` (operator ->
  device) with ``torch.fx.passes.split_module``, moves each part (its parameters with it)
  to its device, and returns a callable that moves the boundary tensors at each cut. A
  device whose parts would form a cycle (A -> B -> A) is split by stage, as the ONNX
  runner does (:func:`service.client.onnx_runner.cut_plan`).

References
----------
PyTorch, "torch.export", https://pytorch.org/docs/stable/export.html; "torch.fx"
(``split_module``), https://pytorch.org/docs/stable/fx.html.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.fx.passes.split_module import split_module
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["export", "graph_from_exported", "apply_plan", "device_for"]


def export(module: nn.Module, example_inputs: Sequence[Any]) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``module`` in eval mode (inference plans)."""
    return torch.export.export(module.eval(), tuple(example_inputs))


def _program(program: torch.export.ExportedProgram | nn.Module, example_inputs: Sequence[Any] | None) -> Any:
    if isinstance(program, nn.Module):
        if example_inputs is None:
            raise ValueError("an nn.Module needs example_inputs to be exported")
        return export(program, example_inputs)
    return program


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_of(v)]
    return []


def _nbytes(value: Any) -> float:
    return float(sum(t.numel() * t.element_size() for t in _tensors_of(value)))


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_meta(v) for v in value)
    return value


def _flops(node: torch.fx.Node) -> float:
    """FLOPs of one operator: FlopCounterMode on meta tensors, else one per output element."""
    out = node.meta.get("val")
    fallback = float(sum(t.numel() for t in _tensors_of(out)))
    if node.target is operator.getitem:
        return 0.0

    def meta_of(arg: Any) -> Any:
        return _on_meta(arg.meta.get("val")) if isinstance(arg, torch.fx.Node) else arg

    args = torch.fx.node.map_aggregate(node.args, meta_of)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, meta_of)
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            node.target(*args, **kwargs)
    except Exception:  # an operator with no meta kernel: count it like an elementwise one
        return fallback
    counted = float(counter.get_total_flops())
    return counted if counted > 0 else fallback


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "overloadpacket", None)
    return str(getattr(packet, "__name__", None) or getattr(target, "__name__", None) or target)


def graph_from_exported(
    program: torch.export.ExportedProgram | nn.Module,
    example_inputs: Sequence[Any] | None = None,
    *,
    name: str | None = None,
) -> dict[str, Any]:
    """The hyperplace JSON graph (``POST /v1/plans`` ``graph``) of an exported program.

    Operator names are the FX node names, which :func:`apply_plan` reads back.
    """
    exported = _program(program, example_inputs)
    signature = exported.graph_signature
    parameters = set(signature.inputs_to_parameters) | set(signature.inputs_to_buffers)
    parameters |= set(getattr(signature, "inputs_to_lifted_tensor_constants", {}))
    tensors: dict[str, dict[str, Any]] = {}
    nodes = []

    def tensor(node: torch.fx.Node, kind: str) -> None:
        value = node.meta.get("val")
        entry: dict[str, Any] = {"name": node.name, "bytes": _nbytes(value), "kind": kind}
        if isinstance(value, torch.Tensor):
            entry["shape"] = [int(d) for d in value.shape]
            entry["dtype"] = _dtype_name(value.dtype)
        tensors[node.name] = entry

    for node in exported.graph.nodes:
        if node.op == "placeholder":
            if _tensors_of(node.meta.get("val")):
                tensor(node, "parameter" if node.name in parameters else "input")
        elif node.op == "call_function":
            inputs = [a.name for a in node.all_input_nodes if a.name in tensors]
            tensor(node, "activation")
            nodes.append(
                {
                    "name": node.name,
                    "op": _op_name(node),
                    "inputs": list(dict.fromkeys(inputs)),
                    "outputs": [node.name],
                    "flops": _flops(node),
                }
            )
    used = {x for n in nodes for x in n["inputs"]} | {x for n in nodes for x in n["outputs"]}
    return {
        "name": name or type(exported.module()).__name__,
        "nodes": nodes,
        "tensors": [t for t in tensors.values() if t["name"] in used],
    }


def device_for(name: str) -> torch.device:
    """A plan device as a torch device: ``cuda:N``/``cpu`` as named, ``.../gpuN`` -> ``cuda:N``,
    anything with ``cpu`` in its last component -> ``cpu``."""
    last = name.rsplit("/", 1)[-1].lower()
    if last.startswith(("cuda", "cpu")) and ":" in last:
        return torch.device(last)
    if "gpu" in last:
        digits = "".join(ch for ch in last if ch.isdigit())
        return torch.device(f"cuda:{int(digits or 0)}")
    if "cpu" in last:
        return torch.device("cpu")
    raise ValueError(f"plan device '{name}' is neither a CPU nor a GPU; pass device_map={{'{name}': 'cpu'}}")


class _OnDevice(nn.Module):
    """One part of the split program on its device: inputs moved there first (the cut)."""

    def __init__(self, inner: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.inner = inner.to(device)
        self.device = device

    def forward(self, *args: Any) -> Any:
        moved = torch.utils._pytree.tree_map(
            lambda v: v.to(self.device) if isinstance(v, torch.Tensor) else v, list(args)
        )
        return self.inner(*moved)


def _stages(gm: torch.fx.GraphModule, device_of: Mapping[str, str]) -> dict[str, int]:
    """A part index per node: one per device when devices form a chain; otherwise per (device,
    stage), the stage being the most device changes on a path to the node (acyclic)."""
    stage: dict[str, int] = {}
    where: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        preds = [p for p in node.all_input_nodes if p.name in where]
        if node.name in device_of:
            where[node.name] = device_of[node.name]
        elif node.op == "get_attr":
            continue  # goes with its first user (below)
        else:
            where[node.name] = where[preds[0].name] if preds else next(iter(device_of.values()))
        stage[node.name] = max((stage[p.name] + (where[p.name] != where[node.name]) for p in preds), default=0)
    keys = sorted({(stage[n], where[n]) for n in stage})
    index = {k: i for i, k in enumerate(keys)}
    part = {n: index[(stage[n], where[n])] for n in stage}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            users = [u.name for u in node.users if u.name in part]
            part[node.name] = part[users[0]] if users else 0
    return part


def apply_plan(
    program: torch.export.ExportedProgram,
    plan: Mapping[str, Any],
    *,
    device_map: Mapping[str, str] | None = None,
) -> Callable[..., Any]:
    """A callable running ``program`` split by ``plan["ops"]`` (FX node name -> device).

    Each part runs on its device (``device_map`` names the torch device of a plan device,
    e.g. ``{"node0/gpu3": "cuda:0"}``); tensors move at the cuts. The callable takes the
    program's inputs and returns its outputs, as the exported module does.
    """
    ops = plan.get("ops") or {}
    gm = program.module()
    names = [n.name for n in program.graph.nodes if n.op == "call_function"]
    missing = [n for n in names if n not in ops]
    if missing:
        raise ValueError(f"the plan places no device for operator(s) {', '.join(missing[:5])}")
    mapped = dict(device_map or {})
    devices = {d: torch.device(mapped[d]) if d in mapped else device_for(d) for d in set(ops.values())}
    part = _stages(gm, {n: ops[n] for n in names})
    part_device: dict[int, torch.device] = {}
    for name, k in part.items():
        if name in ops:
            part_device.setdefault(k, devices[ops[name]])
    split = split_module(gm, gm, lambda node: part[node.name], keep_original_order=True)
    for child_name, child in list(split.named_children()):
        if child_name.startswith("submod_"):
            k = int(child_name.removeprefix("submod_"))
            setattr(split, child_name, _OnDevice(child, part_device.get(k, torch.device("cpu"))))
    out_spec = program.call_spec.out_spec

    def run(*args: Any, **kwargs: Any) -> Any:
        flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
        outputs = split(*flat)
        flat_out = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        return torch.utils._pytree.tree_unflatten(flat_out, out_spec) if out_spec is not None else outputs

    run.parts = {k: str(d) for k, d in part_device.items()}  # type: ignore[attr-defined]
    run.module = split  # type: ignore[attr-defined]
    return run
