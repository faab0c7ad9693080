"""Run a plan for real: cut an ONNX model along the plan, run the parts with ONNX Runtime,
check the numbers against the unsplit model, measure, and build the timeline to send back.

A plan says where each operator goes (``ops``: operator -> device). This module turns that
into one ONNX model per (device, stage) part and one ``onnxruntime.InferenceSession`` per
part, then runs a step the way the plan means it: every runtime device has one host
thread that runs its parts in order, and a part starts once the boundary tensors it reads
exist (so two CPU "devices" really run at the same time, each with its own intra-op
thread pool). What it does, in order:

1. **Read the model as the service did** (:func:`prepare_model`): the importer
   (:func:`partitioners.graph.onnx_import.graph_from_onnx_bytes`) with the same dims gives
   the operator names, the folded nodes and the model hash; a plan for another hash is
   refused. Nodes are renamed to their plan operator names, so ONNX Runtime's profiler
   reports plan operators by name (unnamed and repeated node names included).
2. **Weights.** Graph-only files keep each initializer's dims and dtype and point to
   external data that was never sent; those get generated values of their shapes (seeded,
   scaled by fan-in; 1-D ones in [0.5, 1.5] so a BatchNorm variance stays positive;
   integer ones 0, a valid index).
3. **Folded nodes** (``Constant`` and shape computations the importer folded) are not
   plan operators: they run once, as ONNX Runtime's constant folding would, and their
   values become initializers of the parts that read them.
4. **Cut** (:func:`cut_plan`): the device parts in a topological order of the quotient
   graph; when it has a cycle (A -> B -> A), a device's part splits by stage (the number
   of device changes on the longest path to an operator), which is acyclic by
   construction. With a ``schedule`` in the plan the parts run in its order.
5. **Run and measure** (:class:`PlanRunner`): warm-up steps, then ``steps`` measured
   steps: wall time per step, per-operator times from ONNX Runtime's profiler
   (``SessionOptions.enable_profiling``), transfer times. Outputs are compared with the
   unsplit model run once.

Only inference plans of one micro-batch map one-to-one onto ONNX nodes; training and
micro-batched plans add operators the ONNX file does not have, and are refused.

References
----------
ONNX Runtime Python API, https://onnxruntime.ai/docs/api/python/api_summary.html
(``SessionOptions``, ``IOBinding``, ``OrtValue``); ONNX Runtime profiling,
https://onnxruntime.ai/docs/performance/tune-performance/profiling-tools.html.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from partitioners.costmodel.costs import OP_CLASS_NAMES, op_class_of
from partitioners.errors import InvalidInput
from partitioners.graph.canonical import model_hash
from partitioners.graph.hypergraph import Hypergraph
from partitioners.graph.onnx_import import graph_from_onnx_bytes, onnx_operator_names

__all__ = [
    "RunError",
    "PreparedModel",
    "Part",
    "RunResult",
    "PlanRunner",
    "prepare_model",
    "cut_plan",
    "resolve_devices",
    "run_plan",
    "compare_with_plan",
]

#: Bytes of a serialized model above which ONNX Runtime is handed a file, not bytes
#: (protobuf cannot hold 2 GiB in one message).
_INLINE_LIMIT_BYTES = 1_800_000_000
#: |measured - reference| <= atol + rtol * |reference|, by output dtype: float32 kernels
#: reordered across a cut (fusions that no longer apply) move the last bits only.
_TOLERANCE = {
    np.dtype(np.float32): (1e-4, 1e-3),
    np.dtype(np.float64): (1e-8, 1e-6),
    np.dtype(np.float16): (1e-2, 1e-2),
}
_DEVICE_RE = re.compile(r"^(cpu|cuda):(\d+)$")


class RunError(RuntimeError):
    """Why a plan cannot run here: the message says what to change."""


# --- the model -------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PreparedModel:
    """A model ready to cut: weights present, nodes named as the plan names them."""

    model: onnx.ModelProto  # nodes renamed to plan operator names, external weights replaced
    graph: Hypergraph  # what the service imported from the same bytes and dims
    model_hash: str
    folded: frozenset[int]  # node indices the importer folded (not plan operators)
    input_shapes: dict[str, tuple[int, ...]]
    input_dtypes: dict[str, np.dtype]
    dims: dict[str, int]
    generated_weights: int  # initializers given generated values


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _has_values(tensor: TensorProto) -> bool:
    if tensor.data_location == TensorProto.EXTERNAL:
        return False
    n = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    if n == 0:
        return True
    return bool(
        tensor.raw_data
        or tensor.float_data
        or tensor.int32_data
        or tensor.int64_data
        or tensor.double_data
        or tensor.uint64_data
        or tensor.string_data
    )


def _generated(tensor: TensorProto, rng: np.random.Generator) -> np.ndarray:
    """Values for a weight that was not sent: of its dims and dtype, scaled so activations stay O(1)."""
    dims = tuple(int(d) for d in tensor.dims)
    dtype = _np_dtype(tensor.data_type)
    if dtype.kind in "iub":
        return np.zeros(dims, dtype=dtype)  # 0 is a valid index into any table
    if len(dims) <= 1:
        return rng.uniform(0.5, 1.5, size=dims).astype(dtype)
    fan_in = int(np.prod(dims[1:])) or 1
    values = rng.standard_normal(size=dims, dtype=np.float32)
    values *= np.float32(1.0 / np.sqrt(fan_in))
    return values.astype(dtype, copy=False)


def prepare_model(data: bytes, dims: Mapping[str, int] | None = None, *, seed: int = 0) -> PreparedModel:
    """Import ``data`` as the service does, rename nodes to plan operators, fill missing weights.

    Raises :class:`RunError` for a model the importer rejects (unbound dims, not ONNX).
    """
    dims = dict(dims or {})
    try:
        graph = graph_from_onnx_bytes(bytes(data), dims=dims)
    except InvalidInput as exc:
        raise RunError(f"cannot read the model: {exc.detail}") from None
    model = onnx.load_model_from_string(bytes(data))
    names = onnx_operator_names(model.graph.node)
    planned = set(graph.op_names.tolist())
    folded = frozenset(i for i, name in enumerate(names) if name not in planned)
    for node, name in zip(model.graph.node, names):
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise RunError(
                f"operator '{name}' ({node.op_type}) has control-flow bodies; the runner cuts flat graphs only"
            )
        node.name = name
    rng = np.random.default_rng(seed)
    generated = 0
    for k, tensor in enumerate(model.graph.initializer):
        if not _has_values(tensor):
            model.graph.initializer[k].CopyFrom(numpy_helper.from_array(_generated(tensor, rng), tensor.name))
            generated += 1
    initializers = {t.name for t in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                shape.append(int(dim.dim_value))
            elif dim.dim_param in dims:
                shape.append(int(dims[dim.dim_param]))
            else:
                raise RunError(f"input '{value.name}' has a dimension with no size and no name; pass --inputs")
        shapes[value.name] = tuple(shape)
        dtypes[value.name] = _np_dtype(tensor_type.elem_type)
    return PreparedModel(
        model=model,
        graph=graph,
        model_hash=model_hash(graph),
        folded=folded,
        input_shapes=shapes,
        input_dtypes=dtypes,
        dims=dims,
        generated_weights=generated,
    )


def example_inputs(prepared: PreparedModel, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the declared shapes: floats N(0, 1), integers 0 or 1 (token ids, masks), seeded."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in prepared.input_shapes.items():
        dtype = prepared.input_dtypes[name]
        if dtype.kind in "iu":
            feeds[name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = np.ones(shape, dtype=dtype)
        else:
            feeds[name] = rng.standard_normal(size=shape).astype(dtype)
    return feeds


# --- the plan --------------------------------------------------------------------------------------------


def fused_members(plan: Mapping[str, Any]) -> dict[str, str]:
    """Operator -> the fused kernel it belongs to, for a plan made with ``options.fusion``.

    A fused plan places each kernel (``fusion_groups``, named after its first operator) as
    one operator; the runner runs its members in that kernel's part, in its place in the
    schedule, and reports their measured times under the kernel's name.
    """
    return {
        str(member): str(group["name"])
        for group in plan.get("fusion_groups") or []
        for member in group.get("ops") or []
        if member != group["name"]
    }


def check_plan(prepared: PreparedModel, plan: Mapping[str, Any]) -> dict[str, str]:
    """The plan's ``ops`` (operator -> plan device), after checking it is a plan of this model;
    a fused plan's kernels expanded to their operators (:func:`fused_members`).

    Raises :class:`RunError` naming what does not fit: another model hash, a training or
    micro-batched plan, operators missing from the plan or unknown to the model.
    """
    options = plan.get("options") or {}
    if options.get("mode", "inference") != "inference" or int(options.get("micro_batches", 1)) != 1:
        raise RunError(
            f"the plan is a {options.get('mode', 'inference')} plan of {options.get('micro_batches', 1)} "
            "micro-batches; its operators (backward pass, optimizer step, micro-batch copies) are not "
            "the ONNX file's nodes: run inference plans of one micro-batch"
        )
    plan_hash = plan.get("model_hash")
    if plan_hash is not None and plan_hash != prepared.model_hash:
        raise RunError(
            f"the plan is for model {plan_hash[:12]}..., but this file with dims {prepared.dims} is model "
            f"{prepared.model_hash[:12]}...: plan this model, with the same dims (plan options.dims: "
            f"{options.get('dims', {})})"
        )
    ops = plan.get("ops")
    if not isinstance(ops, Mapping) or not ops:
        raise RunError("the plan has no 'ops' (operator -> device): fetch it with detail=full")
    names = prepared.graph.op_names.tolist()
    ops = dict(ops)
    for member, kernel in fused_members(plan).items():
        if kernel in ops:
            ops[member] = ops[kernel]
    missing = [n for n in names if n not in ops]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise RunError(f"the plan places no device for operator{'s' if len(missing) > 1 else ''} {shown}")
    known = set(names)
    extra = [n for n in ops if n not in known]
    if extra:
        raise RunError(f"the plan places operators the model does not have: {', '.join(map(repr, extra[:5]))}")
    return {n: str(ops[n]) for n in names}


def _gpu_count() -> int:
    """CUDA devices ONNX Runtime can use here (0 without its CUDA execution provider)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return 0
    try:
        import subprocess

        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False)
        return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


def resolve_devices(
    plan_devices: Sequence[str], mapping: Mapping[str, str] | None = None, *, gpus: int | None = None
) -> dict[str, str]:
    """Plan device -> runtime device (``cpu:N``, a logical CPU device with its own threads, or ``cuda:N``).

    ``mapping`` first; then a plan device named ``cpu:N``/``cuda:N``; then one whose name
    says cpu (the k-th such device in name order -> ``cpu:k``) or gpu (the k-th -> ``cuda:k``). Raises
    :class:`RunError` naming the devices that have no counterpart here.
    """
    mapping = dict(mapping or {})
    gpus = _gpu_count() if gpus is None else gpus
    out: dict[str, str] = {}
    lacking: list[str] = []
    n_cpu = n_gpu = 0
    for device in sorted(set(plan_devices), key=_natural):
        target = mapping.get(device)
        if target is None:
            last = device.rsplit("/", 1)[-1].lower()
            if _DEVICE_RE.match(device):
                target = device
            elif "cpu" in last:
                target, n_cpu = f"cpu:{n_cpu}", n_cpu + 1
            elif "gpu" in last or "cuda" in last:
                target, n_gpu = f"cuda:{n_gpu}", n_gpu + 1
            else:
                lacking.append(f"{device} (no CPU or GPU by that name)")
                continue
        found = _DEVICE_RE.match(target)
        if found is None:
            raise RunError(f"--map {device}={target}: a runtime device is cpu:N or cuda:N")
        if found.group(1) == "cuda" and int(found.group(2)) >= gpus:
            lacking.append(f"{device} (needs {target}; this machine has {gpus} CUDA device(s) ONNX Runtime can use)")
            continue
        out[device] = target
    if lacking:
        raise RunError(
            "the plan's devices are not on this machine: "
            + "; ".join(lacking)
            + ". Map each to one that is, e.g. --map "
            + f"{lacking[0].split(' (')[0]}=cpu:0"
        )
    return out


def _natural(name: str) -> list[Any]:
    """``node0/gpu10`` after ``node0/gpu9``: the k-th device by name is ``cpu:k`` / ``cuda:k``."""
    return [int(piece) if piece.isdigit() else piece for piece in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class Part:
    """One subgraph: the nodes (indices into the model) of one plan device and stage."""

    device: str  # plan device
    stage: int
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]  # boundary tensors and graph inputs it reads
    outputs: tuple[str, ...]  # what other parts or the caller read from it


def cut_plan(prepared: PreparedModel, ops: Mapping[str, str], schedule: Mapping[str, Any] | None = None) -> list[Part]:
    """The parts to run, in an order in which every part's inputs exist before it runs.

    One part per device when the quotient graph (devices joined by the tensors they
    send) is acyclic, in a topological order of it; otherwise each operator's stage is
    the most device changes on a path to it, and each (device, stage) is a part. Parts
    run in ``schedule`` order (earliest predicted start first) when the plan has one.
    """
    graph = prepared.model.graph
    nodes = graph.node
    produced_by: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                produced_by[out] = i
    placed = [i for i in range(len(nodes)) if i not in prepared.folded]
    device_of = {i: ops[nodes[i].name] for i in placed}
    # the placed operators each placed operator reads from (through folded nodes: no edge)
    preds = {i: sorted({produced_by[x] for x in nodes[i].input if x in produced_by} - prepared.folded) for i in placed}
    devices = list(dict.fromkeys(device_of[i] for i in placed))
    quotient = {d: set() for d in devices}
    for i in placed:
        for p in preds[i]:
            if device_of[p] != device_of[i]:
                quotient[device_of[p]].add(device_of[i])
    order = _topological(devices, quotient)
    if order is not None:
        stage_of = {i: order.index(device_of[i]) for i in placed}
    else:
        stage_of = {}
        for i in _node_order(placed, preds):
            stage_of[i] = max((stage_of[p] + (device_of[p] != device_of[i]) for p in preds[i]), default=0)
    start = _schedule_start(schedule)
    groups: dict[tuple[str, int], list[int]] = {}
    for i in placed:
        groups.setdefault((device_of[i], stage_of[i]), []).append(i)
    keys = sorted(
        groups,
        key=lambda k: (k[1], min(start.get(nodes[i].name, float("inf")) for i in groups[k]), devices.index(k[0])),
    )
    if start:
        keys = _schedule_order(keys, groups, preds, start, nodes)
    graph_outputs = [o.name for o in graph.output]
    part_of = {i: k for k in keys for i in groups[k]}
    readers: dict[str, set[tuple[str, int]]] = {}
    for i in placed:
        for x in nodes[i].input:
            if x in produced_by and produced_by[x] not in prepared.folded:
                readers.setdefault(x, set()).add(part_of[i])
    initializers = {t.name for t in graph.initializer}
    parts = []
    for k in keys:
        members = sorted(groups[k])
        written = {o for i in members for o in nodes[i].output if o}
        reads = [
            x
            for i in members
            for x in nodes[i].input
            if x and x not in written and (x not in produced_by or produced_by[x] not in prepared.folded)
        ]
        inputs = tuple(dict.fromkeys(x for x in reads if x not in initializers))
        outputs = tuple(
            o
            for i in members
            for o in nodes[i].output
            if o and (o in graph_outputs or any(r != k for r in readers.get(o, ())))
        )
        parts.append(Part(device=k[0], stage=k[1], nodes=tuple(members), inputs=inputs, outputs=outputs))
    return parts


def _topological(items: list[str], edges: Mapping[str, set[str]]) -> list[str] | None:
    indegree = dict.fromkeys(items, 0)
    for a in items:
        for b in edges[a]:
            indegree[b] += 1
    ready = [d for d in items if indegree[d] == 0]
    order: list[str] = []
    while ready:
        d = ready.pop(0)
        order.append(d)
        for b in sorted(edges[d], key=items.index):
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return order if len(order) == len(items) else None


def _node_order(placed: list[int], preds: Mapping[int, list[int]]) -> list[int]:
    """File order is topological in a valid ONNX graph; checked, not assumed."""
    seen: set[int] = set()
    for i in placed:
        if any(p not in seen for p in preds[i]):
            raise RunError(f"node {i} reads a tensor written later in the file: the ONNX graph is not sorted")
        seen.add(i)
    return placed


def _schedule_start(schedule: Mapping[str, Any] | None) -> dict[str, float]:
    """Operator -> predicted start from a plan's ``schedule`` (``{devices: [{device, ops: [{op, start_s}]}]}``)."""
    if not isinstance(schedule, Mapping):
        return {}
    start: dict[str, float] = {}
    for row in schedule.get("devices") or []:
        for position, entry in enumerate(row.get("ops") or []):
            start[str(entry["op"])] = float(entry.get("start_s", position))
    return start


def _with_members(schedule: Any, members: Mapping[str, str]) -> Any:
    """``schedule`` with each fused kernel's operators listed at the kernel's start."""
    if not members or not isinstance(schedule, Mapping):
        return schedule
    by_kernel: dict[str, list[str]] = {}
    for member, kernel in members.items():
        by_kernel.setdefault(kernel, []).append(member)
    devices = []
    for row in schedule.get("devices") or []:
        entries = []
        for entry in row.get("ops") or []:
            entries.append(entry)
            entries.extend({**entry, "op": member} for member in by_kernel.get(str(entry["op"]), []))
        devices.append({**row, "ops": entries})
    return {**schedule, "devices": devices}


def _schedule_order(
    keys: list[tuple[str, int]],
    groups: Mapping[tuple[str, int], list[int]],
    preds: Mapping[int, list[int]],
    start: Mapping[str, float],
    nodes: Any,
) -> list[tuple[str, int]]:
    """Parts by earliest scheduled start, each only after the parts it reads from."""
    part_of = {i: k for k in keys for i in groups[k]}
    needs = {k: {part_of[p] for i in groups[k] for p in preds[i]} - {k} for k in keys}
    first = {k: min(start.get(nodes[i].name, float("inf")) for i in groups[k]) for k in keys}
    done: list[tuple[str, int]] = []
    left = list(keys)
    while left:
        ready = [k for k in left if needs[k] <= set(done)]
        k = min(ready, key=lambda k: (first[k], left.index(k)))
        done.append(k)
        left.remove(k)
    return done


# --- building the parts ----------------------------------------------------------------------------------


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Element types of every value, from ONNX shape inference on the graph without its weights."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    del light.graph.initializer[:]
    names = {t.name for t in model.graph.initializer}
    for t in model.graph.initializer:
        light.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del light.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    types = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        if value.name not in names and value.type.HasField("tensor_type"):
            proto = onnx.TypeProto()
            proto.tensor_type.elem_type = value.type.tensor_type.elem_type
            types[value.name] = proto
    return types


def _value_info(name: str, types: Mapping[str, onnx.TypeProto], values: Mapping[str, np.ndarray]) -> Any:
    if name in values:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(values[name].dtype), None)
    info = onnx.ValueInfoProto()
    info.name = name
    if name in types:
        info.type.CopyFrom(types[name])
    return info


def _submodel(
    model: onnx.ModelProto,
    node_ids: Sequence[int],
    inputs: Sequence[str],
    outputs: Sequence[str],
    constants: Mapping[str, np.ndarray],
    types: Mapping[str, onnx.TypeProto],
    known: Mapping[str, np.ndarray],
) -> onnx.ModelProto:
    """The nodes ``node_ids`` as a model: ``inputs`` in, ``outputs`` out, the weights they read inside."""
    graph = model.graph
    read = {x for i in node_ids for x in graph.node[i].input if x}
    initializers = [t for t in graph.initializer if t.name in read]
    initializers += [numpy_helper.from_array(v, n) for n, v in constants.items() if n in read]
    sub = helper.make_graph(
        [graph.node[i] for i in node_ids],
        f"{graph.name or 'model'}-part",
        [_value_info(x, types, known) for x in inputs],
        [_value_info(x, types, known) for x in outputs],
        initializer=initializers,
    )
    out = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out


def _session(
    model: onnx.ModelProto, device: str, *, threads: int | None, profile_prefix: str | None, spin: bool = True
) -> Any:
    options = ort.SessionOptions()
    # basic: constant folding and redundant-node removal, no fusions, so the profiler's
    # nodes stay the plan's operators (and the unsplit reference runs the same kernels)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    if not spin:  # idle intra-op threads sleep instead of spinning: fairer on a machine shared with other work
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    kind, _, index = device.partition(":")
    providers: list[Any] = ["CPUExecutionProvider"]
    if kind == "cuda":
        providers = [("CUDAExecutionProvider", {"device_id": int(index)}), "CPUExecutionProvider"]
    data = model.SerializeToString()
    if len(data) > _INLINE_LIMIT_BYTES:
        raise RunError("a part of the model is over 1.8 GB serialized; run it on more devices")
    try:
        return ort.InferenceSession(data, sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise RunError(f"ONNX Runtime cannot load the model (or a part of it on {device}): {exc}") from None


# --- running ---------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What one run measured, with the reference comparison."""

    parts: list[Part]
    devices: dict[str, str]  # plan device -> runtime device
    outputs: dict[str, np.ndarray]
    diffs: dict[str, tuple[float, float]]  # output -> (max abs, max rel) difference from the unsplit model
    step_wall_s: list[float]
    reference_wall_s: list[float]  # the unsplit model on one session with every core
    ops: list[dict[str, Any]] = field(default_factory=list)  # {name, device, step, start_s, duration_s}
    transfers: list[dict[str, Any]] = field(default_factory=list)  # {tensor, src, dst, step, duration_s}

    @property
    def median_step_s(self) -> float:
        return float(np.median(self.step_wall_s))

    def timeline(self) -> dict[str, Any]:
        """The measured timeline in the service's simple JSON form (docs/feedback.md)."""
        return {"ops": list(self.ops), "transfers": list(self.transfers)}


def _tolerance(dtype: np.dtype) -> tuple[float, float]:
    return _TOLERANCE.get(np.dtype(dtype), (0.0, 0.0))


def compare_outputs(
    reference: Mapping[str, np.ndarray], measured: Mapping[str, np.ndarray]
) -> dict[str, tuple[float, float]]:
    """Max absolute and relative difference per output; raises :class:`RunError` naming the
    first output that differs beyond its dtype's tolerance."""
    diffs = {}
    for name, ref in reference.items():
        got = measured[name]
        if got.shape != ref.shape:
            raise RunError(f"output '{name}' has shape {got.shape} split, {ref.shape} unsplit")
        if ref.dtype.kind not in "fc":
            same = bool(np.array_equal(got, ref))
            diffs[name] = (0.0 if same else float("inf"), 0.0 if same else float("inf"))
            if not same:
                raise RunError(f"output '{name}' differs from the unsplit model's")
            continue
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        abs_diff = np.abs(got64 - ref64)
        max_abs = float(abs_diff.max()) if abs_diff.size else 0.0
        rel = abs_diff / np.maximum(np.abs(ref64), np.finfo(np.float64).tiny)
        max_rel = float(rel.max()) if rel.size else 0.0
        diffs[name] = (max_abs, max_rel)
        atol, rtol = _tolerance(ref.dtype)
        scale = float(np.abs(ref64).max()) if ref64.size else 0.0
        if not np.all(abs_diff <= atol * max(1.0, scale) + rtol * np.abs(ref64)) or not np.isfinite(max_abs):
            raise RunError(
                f"output '{name}' differs from the unsplit model's: max abs {max_abs:.3g}, max rel {max_rel:.3g} "
                f"(tolerance {atol:g} abs, {rtol:g} rel for {ref.dtype})"
            )
    return diffs


class PlanRunner:
    """One model cut along one plan: the sessions, built once; :meth:`run` measures steps."""

    def __init__(
        self,
        prepared: PreparedModel,
        plan: Mapping[str, Any],
        *,
        device_map: Mapping[str, str] | None = None,
        threads_per_device: int | None = None,
        profile: bool = True,
        gpus: int | None = None,
        spin: bool = True,
    ) -> None:
        self.prepared = prepared
        self.ops = check_plan(prepared, plan)
        self.members = fused_members(plan)
        self.devices = resolve_devices(list(self.ops.values()), device_map, gpus=gpus)
        self.parts = cut_plan(prepared, self.ops, _with_members(plan.get("schedule"), self.members))
        runtime = sorted(set(self.devices.values()))
        n_cpu = sum(1 for d in runtime if d.startswith("cpu"))
        cores = os.cpu_count() or 1
        self.threads = threads_per_device or max(1, cores // max(1, n_cpu))
        self._spin = spin
        self._profiled = False
        self._profile_dir = tempfile.mkdtemp(prefix="hyperplace-run-") if profile else None
        try:
            self._build_sessions()
        except BaseException:
            if self._profile_dir is not None:
                shutil.rmtree(self._profile_dir, ignore_errors=True)
            raise
        self._executors = {d: ThreadPoolExecutor(max_workers=1, thread_name_prefix=d) for d in runtime}
        self._runs_per_session = [0] * len(self.parts)

    def _build_sessions(self) -> None:
        """The unsplit reference, the folded constants, and one session per part."""
        prepared = self.prepared
        types = _value_types(prepared.model)
        self._reference, self.constants = self._fold(types)
        known = dict(self.constants)
        self.sessions: list[Any] = []
        for k, part in enumerate(self.parts):
            device = self.devices[part.device]
            prefix = None if self._profile_dir is None else str(Path(self._profile_dir) / f"part{k}")
            sub = _submodel(prepared.model, part.nodes, part.inputs, part.outputs, self.constants, types, known)
            threads = self.threads if device.startswith("cpu") else None
            self.sessions.append(_session(sub, device, threads=threads, profile_prefix=prefix, spin=self._spin))

    def close(self) -> None:
        for executor in self._executors.values():
            executor.shutdown(wait=True)
        if self._profile_dir is not None:
            shutil.rmtree(self._profile_dir, ignore_errors=True)

    def __enter__(self) -> PlanRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fold(self, types: Mapping[str, onnx.TypeProto]) -> tuple[Any, dict[str, np.ndarray]]:
        """The unsplit model's session, and the values of the folded nodes' outputs that
        placed operators read.

        Folded values are constants once the dims are bound (shapes, shape arithmetic,
        ``Constant`` nodes), but may read the shape of any tensor, so they are read off one
        run of the whole model with them as extra outputs, as ONNX Runtime's constant
        folding would; the same session is the reference the parts are checked against.
        """
        prepared = self.prepared
        graph = prepared.model.graph
        written = {o for i in prepared.folded for o in graph.node[i].output if o}
        needed = list(
            dict.fromkeys(
                x for i, node in enumerate(graph.node) if i not in prepared.folded for x in node.input if x in written
            )
        )
        model = prepared.model
        if needed:
            model = onnx.ModelProto()
            model.CopyFrom(prepared.model)
            have = {o.name for o in model.graph.output}
            model.graph.output.extend(_value_info(x, types, {}) for x in needed if x not in have)
        session = _session(model, "cpu:0", threads=os.cpu_count() or 1, profile_prefix=None, spin=self._spin)
        if not needed:
            return session, {}
        values = session.run(needed, example_inputs(prepared))
        return session, dict(zip(needed, values))

    def reference(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The unsplit model's outputs (every core, one session)."""
        names = [o.name for o in self.prepared.model.graph.output]
        try:
            return dict(zip(names, self._reference.run(names, dict(feeds))))
        except Exception as exc:  # ORT's own error types: wrong dtype or shape of an input
            raise RunError(f"ONNX Runtime cannot run the model on these inputs: {exc}") from None

    def _run_part(
        self, k: int, feeds: Mapping[str, np.ndarray], producers: Mapping[str, tuple[int, Future]]
    ) -> tuple[dict[str, Any], float, float, list[tuple[str, str, float]]]:
        part = self.parts[k]
        device = self.devices[part.device]
        inputs: dict[str, Any] = {}
        moves = []
        for name in part.inputs:
            if name in feeds:
                value = feeds[name]
            else:
                src, future = producers[name]
                value = future.result()[0][name]
                src_device = self.devices[self.parts[src].device]
                if src_device != device:
                    t0 = time.perf_counter()
                    value = _move(value, device)
                    moves.append((name, self.parts[src].device, part.device, time.perf_counter() - t0))
            inputs[name] = value
        session = self.sessions[k]
        t0 = time.perf_counter()
        if device.startswith("cuda"):
            outputs = _run_bound(session, inputs, part.outputs, device)
        else:
            host = {n: (v.numpy() if not isinstance(v, np.ndarray) else v) for n, v in inputs.items()}
            outputs = dict(zip(part.outputs, session.run(list(part.outputs), host)))
        t1 = time.perf_counter()
        return outputs, t0, t1, moves

    def _step(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], list[tuple[float, float]], list]:
        producers: dict[str, tuple[int, Future]] = {}
        futures = []
        for k, part in enumerate(self.parts):
            future = self._executors[self.devices[part.device]].submit(self._run_part, k, feeds, dict(producers))
            futures.append(future)
            for name in part.outputs:
                producers[name] = (k, future)
        results = [f.result() for f in futures]
        for k in range(len(self.parts)):
            self._runs_per_session[k] += 1
        outputs: dict[str, Any] = {}
        for outs, *_ in results:
            outputs.update(outs)
        spans = [(t0, t1) for _, t0, t1, _ in results]
        moves = [m for *_, ms in results for m in ms]
        return outputs, spans, moves

    def run(self, feeds: Mapping[str, np.ndarray], *, steps: int = 5, warmup: int = 2) -> RunResult:
        """``warmup`` steps, then ``steps`` measured ones; outputs checked against the unsplit model."""
        if steps < 1:
            raise RunError("steps must be at least 1")
        missing = [n for n in self.prepared.input_shapes if n not in feeds]
        if missing:
            raise RunError(f"no value for input(s) {', '.join(missing)}")
        reference = self.reference(feeds)
        reference_wall = []
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            self.reference(feeds)
            reference_wall.append(time.perf_counter() - t0)
        first_measured = self._runs_per_session[0] + warmup if self.parts else 0
        for _ in range(warmup):
            self._step(feeds)
        walls, all_spans, all_moves, outputs = [], [], [], {}
        for _ in range(steps):
            t0 = time.perf_counter()
            outputs, spans, moves = self._step(feeds)
            walls.append(time.perf_counter() - t0)
            all_spans.append((t0, spans))
            all_moves.append(moves)
        host = {n: (v if isinstance(v, np.ndarray) else v.numpy()) for n, v in outputs.items()}
        final = {n: host[n] for n in reference}
        diffs = compare_outputs(reference, final)
        result = RunResult(
            parts=self.parts,
            devices=self.devices,
            outputs=final,
            diffs=diffs,
            step_wall_s=walls,
            reference_wall_s=reference_wall[warmup:],
        )
        origin = all_spans[0][0]
        for step, moves in enumerate(all_moves):
            for tensor, src, dst, seconds in moves:
                result.transfers.append(
                    {"tensor": tensor, "src": src, "dst": dst, "step": step, "duration_s": max(seconds, 0.0)}
                )
        if self._profile_dir is not None and not self._profiled:
            # a session's profile ends once: per-operator times come from the first run() only
            result.ops = self._profiled_ops(first_measured, steps, all_spans, origin)
            self._profiled = True
        return result

    def _profiled_ops(
        self, first: int, steps: int, spans: list[tuple[float, list[tuple[float, float]]]], origin: float
    ) -> list[dict[str, Any]]:
        """Per-operator times from each session's profile, placed on the host clock of the run."""
        ops = []
        for k, session in enumerate(self.sessions):
            path = session.end_profiling()
            events = json.loads(Path(path).read_text())
            Path(path).unlink(missing_ok=True)
            runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
            nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
            nodes.sort(key=lambda e: e["ts"])
            for step in range(steps):
                index = first + step
                if index >= len(runs):
                    break
                run = runs[index]
                begin, end = run["ts"], run["ts"] + run["dur"]
                host_start = spans[step][1][k][0] - origin
                for e in nodes:
                    if e["ts"] < begin or e["ts"] > end:
                        continue
                    name = e["name"][: -len("_kernel_time")]
                    if name not in self.ops:
                        continue
                    ops.append(
                        {
                            "name": name,
                            "device": self.parts[k].device,
                            "start_s": host_start + (e["ts"] - begin) * 1e-6,
                            "duration_s": e["dur"] * 1e-6,
                            "step": step,
                        }
                    )
        ops.sort(key=lambda o: (o["step"], o["start_s"]))
        return _as_kernels(ops, self.members)


def _as_kernels(ops: list[dict[str, Any]], members: Mapping[str, str]) -> list[dict[str, Any]]:
    """Measured operators of a fused plan under their kernel's name: one entry per kernel and
    step, from its first operator's start, lasting its operators' summed time."""
    if not members:
        return ops
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for op in ops:
        kernel = members.get(op["name"], op["name"])
        key = (kernel, op["step"])
        if key not in merged:
            merged[key] = {**op, "name": kernel}
        else:
            entry = merged[key]
            entry["start_s"] = min(entry["start_s"], op["start_s"])
            entry["duration_s"] += op["duration_s"]
    return sorted(merged.values(), key=lambda o: (o["step"], o["start_s"]))


def _move(value: Any, device: str) -> Any:
    """A boundary tensor on ``device``: host arrays hand over as they are (logical CPU devices
    share memory); a CUDA destination gets a device copy."""
    if device.startswith("cuda"):
        host = value if isinstance(value, np.ndarray) else value.numpy()
        return ort.OrtValue.ortvalue_from_numpy(host, "cuda", int(device.split(":")[1]))
    return value if isinstance(value, np.ndarray) else value.numpy()


def _run_bound(session: Any, inputs: Mapping[str, Any], outputs: Sequence[str], device: str) -> dict[str, Any]:
    """One run with IO binding: inputs and outputs stay in GPU memory."""
    index = int(device.split(":")[1])
    binding = session.io_binding()
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            value = ort.OrtValue.ortvalue_from_numpy(value, "cuda", index)
        binding.bind_ortvalue_input(name, value)
    for name in outputs:
        binding.bind_output(name, "cuda", index)
    session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    return dict(zip(outputs, binding.get_outputs()))


# --- predictions next to measurements --------------------------------------------------------------------


def _predicted_ops(plan: Mapping[str, Any], trace: Mapping[str, Any] | None) -> dict[str, float]:
    events = (trace or plan.get("trace") or {}).get("traceEvents") or []
    return {e["name"]: e["dur"] * 1e-6 for e in events if e.get("ph") == "X" and e.get("cat") == "op"}


def compare_with_plan(
    prepared: PreparedModel, plan: Mapping[str, Any], result: RunResult, trace: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Predicted next to measured: makespan, busy time per device, time per operator class,
    and the median relative error per operator (where the plan's trace gives its times)."""
    graph = prepared.graph
    names = graph.op_names.tolist()
    classes = op_class_of(graph.op_types)
    class_of = {n: OP_CLASS_NAMES[int(c)] for n, c in zip(names, classes.tolist())}
    steps = max(1, len(result.step_wall_s))
    measured: dict[str, list[float]] = {}
    for op in result.ops:
        measured.setdefault(op["name"], []).append(op["duration_s"])
    measured_op = {n: float(np.median(v)) for n, v in measured.items()}
    predicted_op = _predicted_ops(plan, trace)
    ops = plan.get("ops") or {}
    busy_measured: dict[str, float] = {}
    busy_predicted: dict[str, float] = {}
    class_measured: dict[str, float] = {}
    class_predicted: dict[str, float] = {}
    for op in result.ops:
        busy_measured[op["device"]] = busy_measured.get(op["device"], 0.0) + op["duration_s"] / steps
        c = class_of[op["name"]]
        class_measured[c] = class_measured.get(c, 0.0) + op["duration_s"] / steps
    for name, seconds in predicted_op.items():
        if name in ops:
            busy_predicted[ops[name]] = busy_predicted.get(ops[name], 0.0) + seconds
            class_predicted[class_of[name]] = class_predicted.get(class_of[name], 0.0) + seconds
    both = [n for n in measured_op if n in predicted_op and measured_op[n] > 0]
    errors = [abs(predicted_op[n] - measured_op[n]) / measured_op[n] for n in both]
    summary = plan.get("summary") or {}
    return {
        "predicted_makespan_s": summary.get("makespan_s"),
        "measured_makespan_s": result.median_step_s,
        "unsplit_step_s": float(np.median(result.reference_wall_s)) if result.reference_wall_s else None,
        "busy_s": {
            d: {"predicted": busy_predicted.get(d), "measured": busy_measured.get(d)}
            for d in sorted(set(busy_predicted) | set(busy_measured))
        },
        "by_class_s": {
            c: {"predicted": class_predicted.get(c), "measured": class_measured.get(c)}
            for c in OP_CLASS_NAMES
            if c in class_predicted or c in class_measured
        },
        "op_median_rel_error": float(np.median(errors)) if errors else None,
        "ops_compared": len(both),
        "ops_measured": len(measured_op),
    }


def run_plan(
    model_bytes: bytes,
    plan: Mapping[str, Any],
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    device_map: Mapping[str, str] | None = None,
    steps: int = 5,
    warmup: int = 2,
    threads_per_device: int | None = None,
    seed: int = 0,
) -> tuple[PreparedModel, RunResult]:
    """Cut, run and measure in one call; ``dims`` default to the plan's ``options.dims``."""
    if dims is None:
        dims = (plan.get("options") or {}).get("dims") or {}
    prepared = prepare_model(model_bytes, dims, seed=seed)
    feeds = dict(inputs) if inputs is not None else example_inputs(prepared, seed=seed)
    with PlanRunner(prepared, plan, device_map=device_map, threads_per_device=threads_per_device) as runner:
        result = runner.run(feeds, steps=steps, warmup=warmup)
    return prepared, result
