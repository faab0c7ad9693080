"""ONNX model bytes -> :class:`~partitioners.graph.hypergraph.Hypergraph`.

Compiler pipelines upload ONNX files, usually without their weights: the
initializers keep their dims and dtype but point to external data that is not
sent. Shapes are all placement needs (memory is bytes, time is FLOPs and bytes),
so the importer never reads weight values and never resolves external-data paths
(a server must not open files named by an upload; STYLE.md, convention 11).

Pipeline: parse the protobuf from bytes, bind the caller's dynamic dimensions
(``{"batch": 8, "sequence": 2048}``) on the graph inputs, run ONNX shape inference
with data propagation on the in-memory model, then one pass over the nodes that
records tensor sizes and FLOPs (:mod:`partitioners.graph.flops`). Initializers become
parameter tensors, and so do the outputs of ``Constant`` nodes and of shape
computations whose values are known once the dims are bound: those nodes are folded
away as ONNX Runtime's constant folding would (:func:`_folded_nodes`), so they are not
costed as kernels nor sent between devices. Control-flow operators (``If``, ``Loop``,
``Scan``) keep their bodies opaque: one operator that reads everything its bodies read
from the outer graph, with a warning, because their cost depends on run-time trip counts.
A training model exported by ONNX Runtime (``generate_artifacts``' ``training_model.onnx``)
writes the gradient of a weight ``w`` as ``w_grad``: such a tensor is read as the
gradient of ``w`` (:func:`_onnx_gradients`), so the model is planned as the training step
it is; its optimizer is a separate model and is not merged in.

An upload is untrusted: a 141-byte model can describe a ``Range`` of 10^10 elements,
and dims can be bound to 10^8. No value is built before its size is checked, tensors
over :data:`MAX_TENSOR_BYTES` are rejected as soon as inference finds their shape, and
ONNX's own data propagation is never shown a long vector (:func:`_infer_with_folding`),
so binding large dims costs no memory. ONNX's static shape inference itself stays out
of reach: declared ranks are capped (:data:`MAX_RANK`), but a crafted chain that grows
the rank at every operator (``Gather(x, x)`` repeated) still costs memory in proportion
to the rank it reaches; only a memory-capped process bounds that.

References
----------
ONNX IR specification, https://onnx.ai/onnx/repo-docs/IR.html (graphs, external
data, dimension parameters); ONNX shape inference,
https://onnx.ai/onnx/repo-docs/ShapeInference.html.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.flops import Shape, estimate_flops
from partitioners.graph.hypergraph import (
    MAX_TENSOR_BYTES,
    ROLE_ABSENT,
    TENSOR_ROLE_GRADIENT,
    Hypergraph,
    build_hypergraph,
    csr_from_lists,
    topological_order,
)
from partitioners.graph.onnx_expansion import expanded_op_count

__all__ = ["MAX_DIM", "MAX_TENSOR_BYTES", "graph_from_onnx_bytes", "onnx_operator_names"]

#: Largest value a dynamic dimension may be bound to (int32 range, what runtimes index with).
MAX_DIM = 2**31 - 1
#: Protocol buffers cap one serialized message at 2 GiB (protobuf encoding guide).
_PROTOBUF_LIMIT_BYTES = 2**31
#: How deep control-flow bodies are walked to find the outer tensors they read.
MAX_SUBGRAPH_DEPTH = 16

_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# Bits per element by TensorProto type name (ONNX IR spec, "Tensor Element Types");
# looked up by name so types missing from an older onnx are skipped.
_BITS_BY_TYPE_NAME = {
    "FLOAT": 32, "UINT8": 8, "INT8": 8, "UINT16": 16, "INT16": 16, "INT32": 32, "INT64": 64,
    "STRING": 64, "BOOL": 8, "FLOAT16": 16, "DOUBLE": 64, "UINT32": 32, "UINT64": 64,
    "COMPLEX64": 64, "COMPLEX128": 128, "BFLOAT16": 16, "FLOAT8E4M3FN": 8, "FLOAT8E4M3FNUZ": 8,
    "FLOAT8E5M2": 8, "FLOAT8E5M2FNUZ": 8, "FLOAT8E8M0": 8, "UINT4": 4, "INT4": 4,
    "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2,
}  # fmt: skip
_BITS = {getattr(TensorProto, k): v for k, v in _BITS_BY_TYPE_NAME.items() if hasattr(TensorProto, k)}
_DTYPE_NAMES = {
    getattr(TensorProto, k): ("bool" if k == "BOOL" else k.lower())
    for k in _BITS_BY_TYPE_NAME
    if hasattr(TensorProto, k)
}
_DTYPE_NAMES[TensorProto.FLOAT] = "float32"
_DTYPE_NAMES[TensorProto.DOUBLE] = "float64"

_SCALAR_ATTRS = (AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT, AttributeProto.STRING)


def _parse(data: bytes) -> onnx.ModelProto:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInput(
            f"the ONNX model must be bytes, got {type(data).__name__}", field="model", code="malformed-onnx"
        )
    if len(data) >= _PROTOBUF_LIMIT_BYTES:
        raise InputTooLarge(
            f"the ONNX file is {len(data)} bytes; protobuf cannot hold 2 GiB or more in one message, "
            "so upload the graph without its weights (external data) -- shapes are all placement needs",
            field="model",
            code="too-large",
        )
    try:
        model = onnx.load_model_from_string(bytes(data))
    except (DecodeError, ValueError, TypeError, RuntimeError) as exc:
        raise InvalidInput(
            f"the upload is not a readable ONNX model ({exc}); send the .onnx file as exported, "
            "not truncated or re-encoded",
            field="model",
            code="malformed-onnx",
        ) from exc
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise InvalidInput(
            "the ONNX model has no graph with operators (empty file, or not an ONNX model)",
            field="model",
            code="malformed-onnx",
        )
    return model


def _check_names(graph: onnx.GraphProto) -> None:
    """Reject names that are not valid UTF-8 text or that hold NUL.

    ONNX strings are proto2 ``string`` fields, which the protobuf runtime does not
    validate: invalid UTF-8 surfaces as ``bytes`` in Python. Such names cannot be
    stored (PostgreSQL text rejects NUL) or shown, so the upload is malformed.
    """

    def bad(value: object) -> bool:
        return type(value) is not str or "\x00" in value

    def node_strings(node: onnx.NodeProto) -> tuple[str, ...]:
        return (node.name, node.op_type, node.domain, *node.input, *node.output)

    strings = [value for node in graph.node for value in node_strings(node)]
    # one pass at C speed over every string; the node at fault is looked for only when one is bad
    if not all(type(value) is str for value in strings) or "\x00" in "".join(strings):
        for i, node in enumerate(graph.node):
            for value in node_strings(node):
                if bad(value):
                    raise InvalidInput(
                        f"operator {i} has a name, type or tensor name that is not valid UTF-8 text ({value!r})",
                        field=f"graph.node[{i}]",
                        code="malformed-onnx",
                    )
    for kind, entries in (("initializer", graph.initializer), ("input", graph.input), ("output", graph.output)):
        for i, entry in enumerate(entries):
            if bad(entry.name):
                raise InvalidInput(
                    f"graph {kind} {i} has a name that is not valid UTF-8 text ({entry.name!r})",
                    field=f"graph.{kind}[{i}]",
                    code="malformed-onnx",
                )


#: Attributes that give a node's output rank (``Unsqueeze`` axes, ``Reshape``-1 shape,
#: ``Transpose`` perm): longer than :data:`MAX_RANK`, they are no shape.
_RANK_ATTRIBUTES = frozenset({"axes", "shape", "perm"})


def _check_ranks(graph: onnx.GraphProto) -> None:
    """Reject declared tensors, constants and rank-giving attributes with more than
    :data:`MAX_RANK` dimensions.

    Shape inference copies a tensor's dimensions into every tensor computed from it, so
    a rank in the thousands, a few kilobytes in the file, costs gigabytes over a chain of
    operators. No runtime accepts such a rank; it is a malformed model.
    """

    def too_deep(rank: int, what: str, where: str) -> None:
        if rank > MAX_RANK:
            raise InvalidInput(
                f"{what} has {rank} dimensions; a tensor has at most {MAX_RANK}",
                field=where,
                code="malformed-onnx",
            )

    for kind, entries in (("input", graph.input), ("output", graph.output)):
        for i, value in enumerate(entries):
            if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
                too_deep(len(value.type.tensor_type.shape.dim), f"graph {kind} '{value.name}'", f"graph.{kind}[{i}]")
    for i, init in enumerate(graph.initializer):
        too_deep(len(init.dims), f"initializer '{init.name}'", f"graph.initializer[{i}]")
    for i, sparse in enumerate(graph.sparse_initializer):
        too_deep(len(sparse.dims), f"sparse initializer '{sparse.values.name}'", f"graph.sparse_initializer[{i}]")
    for i, node in enumerate(graph.node):
        for attr in node.attribute:
            if attr.type == AttributeProto.TENSOR:
                too_deep(len(attr.t.dims), f"operator {i} ({node.op_type}) attribute '{attr.name}'", f"graph.node[{i}]")
            elif attr.type == AttributeProto.INTS and attr.name in _RANK_ATTRIBUTES:
                too_deep(len(attr.ints), f"operator {i} ({node.op_type}) attribute '{attr.name}'", f"graph.node[{i}]")


#: Operators whose output size is given by a constant input: (operator, that input's position).
_SIZE_GIVING_INPUTS = {"Expand": 1, "Tile": 1, "ConstantOfShape": 0}
#: Longest constant read to size an output (a shape or repeats vector is as long as a rank).
_SIZE_VECTOR_MAX = 64


def _all_nodes(model: onnx.ModelProto) -> Iterable[onnx.NodeProto]:
    """Every node of the graph, of its control-flow bodies (to the depth protobuf parsed) and of its functions."""
    stack = [model.graph.node, *(f.node for f in model.functions)]
    while stack:
        for node in stack.pop():
            yield node
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append(attr.g.node)
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend(g.node for g in attr.graphs)


def _check_constant_sizes(model: onnx.ModelProto) -> None:
    """Reject an ``Expand``, ``Tile`` or ``ConstantOfShape`` whose constant shape makes a tensor
    over :data:`MAX_TENSOR_BYTES`, before shape inference.

    Inference multiplies those constants in 64-bit integers: ``Tile`` of a [4] tensor by
    2^62 wraps around, and the output comes back with no shape, which would be planned
    as 0 bytes. The product is taken here in Python's unbounded integers, wherever the
    operator sits (graph, control-flow body, function), for the constants written in the
    file (initializers and ``Constant`` nodes).
    """
    constants: dict[str, list[int]] = {}
    for init in model.graph.initializer:
        if init.data_type == TensorProto.INT64 and len(init.dims) == 1 and init.dims[0] <= _SIZE_VECTOR_MAX:
            constants[init.name] = [int(v) for v in onnx.numpy_helper.to_array(init).reshape(-1)]
    for node in _all_nodes(model):
        if node.op_type == "Constant" and len(node.output) == 1:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == AttributeProto.TENSOR), None)
            if value is not None and value.data_type == TensorProto.INT64 and len(value.dims) == 1:
                if value.dims[0] <= _SIZE_VECTOR_MAX:
                    constants[node.output[0]] = [int(v) for v in onnx.numpy_helper.to_array(value).reshape(-1)]
    declared = {v.name: v for v in (*model.graph.input, *model.graph.value_info)}
    for node in _all_nodes(model):
        position = _SIZE_GIVING_INPUTS.get(node.op_type)
        if position is None or node.domain not in ("", "ai.onnx") or len(node.input) <= position:
            continue
        sizes = constants.get(node.input[position])
        if sizes is None:
            continue
        elements = math.prod(abs(d) for d in sizes)
        if node.op_type == "Tile" and node.input[0] in declared:
            dims = declared[node.input[0]].type.tensor_type.shape.dim
            elements *= math.prod(d.dim_value for d in dims if d.HasField("dim_value") and d.dim_value > 0)
        if elements > MAX_TENSOR_BYTES:  # at least one byte an element
            raise InvalidInput(
                f"operator '{node.name or node.op_type}' ({node.op_type}) makes a tensor of {float(elements):.3g} "
                f"elements from the constant '{node.input[position]}' {sizes}, over the {MAX_TENSOR_BYTES:.3g}-byte "
                "limit",
                field="model",
                code="absurd-size",
            )


def _check_dims(dims: Mapping[str, int] | None) -> dict[str, int]:
    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise InvalidInput("dims must map dimension names to integers", field="dims", code="invalid-dims")
    for key, value in dims.items():
        if not isinstance(key, str) or type(value) is not int or not 1 <= value <= MAX_DIM:
            raise InvalidInput(
                f"dimension {key!r} must be bound to an integer between 1 and {MAX_DIM}, got {value!r}",
                field=f"dims.{key}",
                code="invalid-dims",
            )
    return dict(dims)


def _bind_dims(
    graph: onnx.GraphProto, dims: dict[str, int], initializer_names: set[str], warnings: list[str]
) -> set[str]:
    """Replace ``dim_param`` by the caller's values on graph inputs and outputs, in place.

    Every symbolic dimension of a runtime input must be bound: without it no tensor
    size downstream is known. Output dims the caller did not bind are cleared so that
    shape inference fills them instead of keeping exporter-generated symbols.
    """
    unbound: dict[str, str] = {}
    used: set[str] = set()
    for value in graph.input:
        if value.name in initializer_names or not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                if dim.dim_param in dims:
                    used.add(dim.dim_param)
                    dim.dim_value = dims[dim.dim_param]
                else:
                    unbound.setdefault(dim.dim_param, value.name)
            elif not dim.HasField("dim_value"):
                unbound.setdefault("?", value.name)
    anonymous = unbound.pop("?", None)
    if unbound:
        plural = len(unbound) > 1
        listed = ", ".join(f"'{d}' (input '{t}')" for d, t in unbound.items())
        raise InvalidInput(
            f"dynamic dimension{'s' if plural else ''} {listed} {'are' if plural else 'is'} not bound; "
            f"pass dims={{{', '.join(repr(d) + ': ...' for d in unbound)}}}",
            field="dims",
            code="unbound-dim",
        )
    if anonymous is not None:
        warnings.append(
            f"input '{anonymous}' has a dimension with neither a size nor a name: tensors computed "
            "from it have unknown sizes"
        )
    for value in graph.output:
        if not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                if dim.dim_param in dims:
                    dim.dim_value = dims[dim.dim_param]
                else:
                    dim.Clear()
    # intermediate annotations from the exporter carry the old symbols: let inference redo them
    del graph.value_info[:]
    return used


_VALUE_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")

#: Folded values larger than this are left to shape inference (a shape vector, a mask
#: of a few thousand entries is what the folding is for). Checked on the output's
#: size *before* it is computed: a ``Range`` to 10^10 is never built.
FOLD_MAX_ELEMENTS = 1 << 16
#: Elements all folded values of one import may hold together: without it a chain of
#: operators, each folding a value just under the limit, costs memory in proportion to
#: the chain's length.
FOLD_BUDGET_ELEMENTS = 1 << 22
#: Longest tensor ONNX shape inference is shown the values of. Shapes, axes, pads and
#: slice bounds are at most twice a rank long. ONNX's data propagation turns every 1-D
#: tensor of known length that reaches a shape operator into one protobuf entry per
#: element, values known or not, and ``Concat`` adds lengths up: a ``Range`` over a
#: sequence bound to 10^8 took tens of gigabytes. Longer tensors are shown to it as
#: constants with dims and no values (:func:`_without_long_values`).
SHAPE_DATA_MAX_ELEMENTS = 128
#: Most dimensions a declared tensor may have (numpy's own limit). Every tensor a node
#: writes repeats its input's dimensions, so a rank of thousands costs memory in
#: proportion to rank times operators during shape inference.
MAX_RANK = 64
#: Rounds of (shape inference, folding); each round unblocks at least one Shape chain.
MAX_FOLD_ROUNDS = 8
#: Prefix of the shape-only stand-ins that replace long tensors in the copy given to
#: ONNX data propagation (never a name of the model: see :func:`_without_long_values`).
_STAND_IN_PREFIX = "hyperplace::shape-only::"
#: (name, shape with None for unknown dims or None for no shape, ONNX element type or None)
#: of one graph value, as shape inference left it (:func:`_value_shapes`).
_ValueShape = tuple[str, Shape | None, int | None]


def _mark_external(tensor: TensorProto) -> None:
    """Keep a tensor's dims and dtype, drop its values, in place.

    The tensor then reads as a graph-only upload's weight: shape inference sizes it from
    its dims and cannot parse values from it (external data is never resolved).
    """
    for field_name in _VALUE_FIELDS:
        tensor.ClearField(field_name)
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "dropped-by-hyperplace"


def _shape_only(dims: Iterable[int], data_type: int) -> TensorProto:
    tensor = TensorProto()
    tensor.data_type = data_type
    tensor.dims.extend(int(d) for d in dims)
    _mark_external(tensor)
    return tensor


def _drop_large_values(model: onnx.ModelProto) -> None:
    """Forget the values of initializers too large to be shape data, in place.

    Only dims and dtype are ever read from weights; dropping inline values before the
    working copies and shape inference keeps a full-weight upload from being copied
    several times over. The tensor is marked external, as in a graph-only upload.
    """
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL or _fits(init.dims):
            continue
        _mark_external(init)


def _infer(model: onnx.ModelProto, warnings: list[str], *, data_prop: bool) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=data_prop)
    except MemoryError:
        # not a model ONNX cannot type: one too big to infer. Reading it as "sizes unknown"
        # would plan every tensor at 0 bytes; the caller's memory cap decides what it is.
        raise
    except Exception as exc:  # onnx raises several types (InferenceError, ValidationError, RuntimeError)
        warnings.append(f"ONNX shape inference failed ({exc}); sizes come from declared shapes only")
        return model


def _int_attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """The value of attribute ``name`` of ``node`` (an int, a list or a tensor, as ONNX
    decodes it), or ``default`` when the node does not set it."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value a ``Constant`` node holds, or None when it is large, external or unreadable.

    The element count is read from the dims before anything is decoded.
    """
    for attr in node.attribute:
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            if attr.t.data_location == TensorProto.EXTERNAL or not _fits(attr.t.dims):
                return None
            try:
                return onnx.numpy_helper.to_array(attr.t)
            # data that does not fill its dims, or a data type this onnx does not know
            # (KeyError from its dtype table): leave it to inference
            except (ValueError, TypeError, KeyError):
                return None
        if attr.name in ("value_int", "value_float", "value_ints", "value_floats"):
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, list) and len(value) > FOLD_MAX_ELEMENTS:
                return None
            return np.array(value, dtype=np.int64 if "int" in attr.name else np.float32)
    return None


def _axes(node: onnx.NodeProto, args: Sequence[npt.NDArray[Any] | None], position: int) -> list[int] | None:
    if len(args) > position and args[position] is not None:
        return [int(a) for a in np.asarray(args[position]).reshape(-1)]
    value = _int_attr(node, "axes", None)
    return None if value is None else [int(a) for a in value]


def _fits(shape: Iterable[int]) -> bool:
    """Whether a value of this shape is small enough to fold (checked before it is built)."""
    return math.prod(int(d) for d in shape) <= FOLD_MAX_ELEMENTS


def _range_length(start: npt.NDArray[Any], limit: npt.NDArray[Any], delta: npt.NDArray[Any]) -> int | None:
    """Elements of ``Range(start, limit, delta)``: max(ceil((limit - start) / delta), 0).

    Computed from the three scalars, so the length is known before anything is built;
    None when the inputs are not scalars, the step is zero or a bound is not finite.
    """
    if start.size != 1 or limit.size != 1 or delta.size != 1:
        return None
    first, last, step = (x.reshape(-1)[0].item() for x in (start, limit, delta))
    if step == 0:
        return None
    if all(isinstance(v, int) for v in (first, last, step)):
        quotient, remainder = divmod(last - first, step)
        length: int = max(quotient + (1 if remainder else 0), 0)
        return length
    span = (float(last) - float(first)) / float(step)
    return max(math.ceil(span), 0) if math.isfinite(span) else None


def _eval_node(
    node: onnx.NodeProto, args: Sequence[npt.NDArray[Any] | None], in_shapes: Sequence[Shape | None]
) -> list[npt.NDArray[Any]] | None:
    """Evaluate one shape-computation node with numpy, or None when it is not one.

    Covers what exporters emit between ``Shape`` and ``Reshape``/``Expand``/``Range``
    (ONNX operator semantics, opset 13+ input forms with the attribute forms as fallback).
    Every operator whose output can be larger than its inputs (``Range``,
    ``ConstantOfShape``, ``Expand``, ``Gather``, ``Concat``, broadcasting) has the size
    of its output checked against :data:`FOLD_MAX_ELEMENTS` before the output is built;
    an output over it is not folded (None).
    """
    op = node.op_type
    if op == "Shape":
        in_shape = in_shapes[0]
        if in_shape is None or any(d is None for d in in_shape):
            return None
        return [np.array(in_shape[_int_attr(node, "start", 0) : _int_attr(node, "end", None)], dtype=np.int64)]
    # the leading inputs the operator cannot do without (every one, but for the optional
    # trailing ones of Slice, Unsqueeze, Squeeze and Range) must all be known values
    required = args[: {"Slice": 3, "Unsqueeze": 1, "Squeeze": 1, "Range": 3}.get(op, len(args))]
    known = [x for x in required if x is not None]
    if len(known) < len(required) or not known:
        return None  # an unknown value, or no input at all (a malformed node): nothing to fold
    a = known[0]
    if op == "Size":
        return [np.array(a.size, dtype=np.int64)]
    if op == "Identity":
        return [a]
    if op == "Gather":
        indices = known[1].astype(np.int64)
        axis = _int_attr(node, "axis", 0)
        axis = axis + a.ndim if axis < 0 else axis
        if not 0 <= axis < a.ndim or not _fits(a.shape[:axis] + indices.shape + a.shape[axis + 1 :]):
            return None
        return [np.take(a, indices, axis=axis)]
    if op == "Unsqueeze":
        out = a
        axes = _axes(node, args, 1)
        if axes is None:
            return None  # Unsqueeze cannot do without its axes
        rank = a.ndim + len(axes)
        for axis in sorted(x % rank for x in axes):
            out = np.expand_dims(out, axis)
        return [out]
    if op == "Squeeze":
        axes = _axes(node, args, 1)
        return [np.squeeze(a) if axes is None else np.squeeze(a, axis=tuple(axes))]
    if op == "Concat":
        if sum(x.size for x in known) > FOLD_MAX_ELEMENTS:
            return None
        parts = [np.atleast_1d(x) if x.ndim == 0 else x for x in known]
        return [np.concatenate(parts, axis=_int_attr(node, "axis", 0))]
    if op == "Slice":
        starts, ends = known[1].reshape(-1), known[2].reshape(-1)
        slice_axes = args[3].reshape(-1) if len(args) > 3 and args[3] is not None else np.arange(starts.size)
        steps = args[4].reshape(-1) if len(args) > 4 and args[4] is not None else np.ones(starts.size, dtype=np.int64)
        index = [slice(None)] * a.ndim
        for start, end, axis, step in zip(starts.tolist(), ends.tolist(), slice_axes.tolist(), steps.tolist()):
            index[axis] = slice(start, end, step)
        return [a[tuple(index)]]
    if op == "Cast":
        return [a.astype(onnx.helper.tensor_dtype_to_np_dtype(_int_attr(node, "to", TensorProto.INT64)))]
    if op == "Range":
        length = _range_length(a, known[1], known[2])
        if length is None or length > FOLD_MAX_ELEMENTS:
            return None
        # numpy's stubs take scalars only; arange also takes these size-1 arrays (_range_length checked)
        dtype = np.result_type(a, known[1], known[2])
        return [np.arange(a, known[1], known[2]).astype(dtype)]  # type: ignore[call-overload]
    if op == "ConstantOfShape":
        shape = tuple(int(d) for d in a.reshape(-1))
        if any(d < 0 for d in shape) or not _fits(shape):
            return None
        value = _int_attr(node, "value", None)
        if value is not None and math.prod(value.dims) != 1:
            return None
        fill = onnx.numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
        return [np.full(shape, fill[0], dtype=fill.dtype)]
    if op == "Expand":
        shape = np.broadcast_shapes(a.shape, tuple(int(d) for d in known[1].reshape(-1)))
        if not _fits(shape):
            return None
        return [np.broadcast_to(a, shape).copy()]
    if op == "Reshape":
        target = [int(d) for d in known[1].reshape(-1)]
        if not _int_attr(node, "allowzero", 0):
            target = [a.shape[i] if d == 0 else d for i, d in enumerate(target)]
        return [a.reshape(target)]
    if op == "Transpose":
        return [np.transpose(a, _int_attr(node, "perm", None))]
    # the rest broadcast their inputs against each other: the output can be far larger
    if not _fits(np.broadcast_shapes(*(x.shape for x in known))):
        return None
    if op == "Where":
        return [np.where(a, known[1], known[2])]
    if op in _FOLD_BINARY:
        out = _FOLD_BINARY[op](a, known[1])
        if op == "Div" and np.issubdtype(out.dtype, np.floating) and np.issubdtype(a.dtype, np.integer):
            out = np.trunc(out).astype(a.dtype)  # integer Div truncates toward zero
        return [np.asarray(out)]
    if op in _FOLD_UNARY:
        return [np.asarray(_FOLD_UNARY[op](a))]
    if op in ("Min", "Max"):
        # pairwise: ``np.minimum.reduce`` of a list would first stack every input
        return [np.asarray(functools.reduce(np.minimum if op == "Min" else np.maximum, known))]
    return None


_FOLD_BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.true_divide, "Mod": np.fmod,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Pow": np.power,
}  # fmt: skip
_FOLD_UNARY = {
    "Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor, "Ceil": np.ceil, "Sqrt": np.sqrt,
}  # fmt: skip


_FOLDABLE = frozenset(
    {"Shape", "Size", "Identity", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Range",
     "ConstantOfShape", "Expand", "Reshape", "Transpose", "Where", "Min", "Max"}
    | set(_FOLD_BINARY)
    | set(_FOLD_UNARY)
)  # fmt: skip


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def _constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the initializers and ``Constant`` nodes small enough to fold, by name."""
    values: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if init.data_location != TensorProto.EXTERNAL and _fits(init.dims):
            try:
                values[init.name] = onnx.numpy_helper.to_array(init)
            except Exception:  # unusual encodings: leave the tensor to inference
                continue
    for node in graph.node:
        if _is_constant(node) and len(node.output) == 1 and node.output[0] and node.output[0] not in values:
            value = _constant_value(node)
            if value is not None:
                values[node.output[0]] = value
    return values


def _hide_long_constants(graph: onnx.GraphProto) -> None:
    """Show ONNX inference only the dims of constants over :data:`SHAPE_DATA_MAX_ELEMENTS`, in place.

    Their values stay with the folding (:func:`_constant_values` reads them first); to
    ONNX they become constants of known shape and unknown values, so neither data
    propagation nor a ``Reshape``/``ConstantOfShape`` reading them as a shape can turn
    one into a vector or a rank of that length.
    """
    for init in graph.initializer:
        if init.data_location != TensorProto.EXTERNAL and math.prod(init.dims) > SHAPE_DATA_MAX_ELEMENTS:
            _mark_external(init)
    for node in graph.node:
        if not _is_constant(node):
            continue
        for k, attr in enumerate(node.attribute):
            if attr.name == "value" and attr.type == AttributeProto.TENSOR:
                if attr.t.data_location != TensorProto.EXTERNAL and math.prod(attr.t.dims) > SHAPE_DATA_MAX_ELEMENTS:
                    _mark_external(attr.t)
            elif attr.name in ("value_ints", "value_floats"):
                count = len(attr.ints) if attr.name == "value_ints" else len(attr.floats)
                if count > SHAPE_DATA_MAX_ELEMENTS:
                    data_type = TensorProto.INT64 if attr.name == "value_ints" else TensorProto.FLOAT
                    node.attribute[k].CopyFrom(onnx.helper.make_attribute("value", _shape_only([count], data_type)))


def _without_long_values(model: onnx.ModelProto, static: list[_ValueShape]) -> onnx.ModelProto:
    """``model`` as ONNX data propagation may see it: one that meets no long vector.

    ``static`` is :func:`_value_shapes` of ``model`` inferred without data propagation.
    Every 1-D tensor it shows longer than :data:`SHAPE_DATA_MAX_ELEMENTS` (a runtime
    input bound to a long sequence, a ``Range``) is read by its consumers through a
    stand-in: a constant with its dims and no values. Inputs of a ``Concat`` whose output
    is that long get one too, since data propagation adds their lengths up. Shapes are
    those of ``static``; only the element-by-element copies are avoided. A model with no
    such vector is returned as it is (inference does not change its argument), a copy
    with the stand-ins otherwise.
    """
    # Initializers with external data (a graph-only upload's weights, and every one
    # :func:`_hide_long_constants` found long) already show ONNX dims and no values, as a
    # stand-in would; the inline ones are short, but a long Concat may read them.
    if not any(
        shape is not None and len(shape) == 1 and shape[0] is not None and shape[0] > SHAPE_DATA_MAX_ELEMENTS
        for _, shape, _ in static
    ):
        return model  # no long vector, and so no Concat that adds up to one
    inline = [init for init in model.graph.initializer if init.data_location != TensorProto.EXTERNAL]
    lengths: dict[str, int] = {}
    elem_types: dict[str, int | None] = {}
    for name, shape, elem in static:
        elem_types[name] = elem
        if shape is not None and len(shape) == 1 and shape[0] is not None:
            lengths[name] = shape[0]
    for init in inline:
        if len(init.dims) == 1:
            lengths[init.name] = int(init.dims[0])
        elem_types[init.name] = init.data_type
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    stand_ins: dict[str, tuple[str, int]] = {}  # name -> (its stand-in's name, its element type)
    for node in copy.graph.node:
        if _is_constant(node):
            continue
        long_concat = node.op_type == "Concat" and any(lengths.get(o, 0) > SHAPE_DATA_MAX_ELEMENTS for o in node.output)
        for k, name in enumerate(node.input):
            length = lengths.get(name)
            if length is None or not (length > SHAPE_DATA_MAX_ELEMENTS or long_concat):
                continue
            elem = elem_types.get(name)
            if elem is None:
                continue
            if name not in stand_ins:
                stand_ins[name] = (f"{_STAND_IN_PREFIX}{len(stand_ins)}", elem)
            node.input[k] = stand_ins[name][0]
    if stand_ins:
        constants = [
            onnx.helper.make_node("Constant", [], [stand_in], value=_shape_only([lengths[name]], elem))
            for name, (stand_in, elem) in stand_ins.items()
        ]
        nodes = constants + list(copy.graph.node)
        del copy.graph.node[:]
        copy.graph.node.extend(nodes)
    return copy


def _check_sizes(values: list[_ValueShape]) -> None:
    """Raise ``absurd-size`` for the first tensor whose inferred shape is over
    :data:`MAX_TENSOR_BYTES`, as soon as shape inference has found it (``values``: its
    :func:`_value_shapes`)."""
    for name, shape, elem in values:
        if (
            shape is not None
            and elem is not None
            and elem in _BITS
            and None not in shape
            and not name.startswith(_STAND_IN_PREFIX)
        ):
            _check_tensor_size(name, shape, elem)


def _all_shaped(values: list[_ValueShape], produced: list[str]) -> bool:
    """Whether inference gave every operator output (``produced``) a whole shape and an element type.

    Then neither data propagation nor another round of inference can add anything:
    they only fill in what is unknown, and folding a node into a ``Constant`` keeps its
    output's shape.
    """
    whole = {name for name, shape, elem in values if shape is not None and elem is not None and None not in shape}
    return whole.issuperset(produced)


def _check_tensor_size(name: str, shape: Shape, elem: int) -> float:
    """Bytes of a tensor with a static shape, or ``absurd-size`` over :data:`MAX_TENSOR_BYTES`.

    Both callers have checked that ``shape`` holds no None, in their own loops over up
    to every tensor of the model; narrowing it again here would cost a pass per tensor.
    """
    size = float(math.prod(shape)) * _BITS[elem] / 8.0  # type: ignore[arg-type]  # no None: see above
    if size > MAX_TENSOR_BYTES:
        raise InvalidInput(
            f"tensor '{name}' would hold {size:.3g} bytes (shape {list(shape)}), over the "
            f"{MAX_TENSOR_BYTES:.3g}-byte limit; check the dims bound for its inputs",
            field="dims",
            code="absurd-size",
        )
    return size


def _count_text(count: int) -> str:
    """A count for a sentence: exact while short, else as a power of ten (2^40 is 1.1e+12)."""
    return (
        str(count) if count < 10**9 else f"{float(count):.2g}" if count < 10**300 else f"over 10^{len(str(count)) - 1}"
    )


def _has_bodies(model: onnx.ModelProto) -> bool:
    """Whether some operator holds a graph (control flow) or the model defines functions:
    ONNX data propagation runs inside those too, out of :func:`_without_long_values`' reach."""
    if len(model.functions):
        return True
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in model.graph.node for a in n.attribute)


def _infer_with_folding(model: onnx.ModelProto, warnings: list[str]) -> tuple[list[_ValueShape], dict[str, np.ndarray]]:
    """Shape inference that also sees through ``Shape -> ... -> Reshape`` chains: the
    (name, shape, element type) it gave every value (:func:`_value_shapes`), and the
    values of the operator outputs it folded, by name.

    ONNX inference stops where a shape is *computed* (``Range``, ``Slice`` of a
    ``Shape``, ``Expand`` to a computed shape), which exporters emit for every dynamic
    axis. Once the dims are bound those computations are constants: each round infers,
    evaluates every node whose inputs are now known values (:func:`_eval_node`), and
    rewrites it as a ``Constant`` in a working copy, until nothing changes. The
    caller's model keeps its operators; only the shapes come from the copy.

    Binding large dims costs no memory: each round first infers without data
    propagation, which gives every tensor's shape without its values, rejects a tensor
    over :data:`MAX_TENSOR_BYTES` right there (``absurd-size``), and then runs data
    propagation on a copy in which long vectors are stand-ins (:func:`_without_long_values`). Folded values are capped one by one
    (:data:`FOLD_MAX_ELEMENTS`, checked before they are built) and together
    (:data:`FOLD_BUDGET_ELEMENTS`). Models with control flow or local functions are
    inferred without data propagation. Once inference has left no operator output
    without a whole shape (:func:`_all_shaped`), data propagation and later rounds of
    inference have nothing to add: such a round skips the first, and the rounds after it
    only fold.

    The folded values (``Constant`` nodes small enough to read, and every node rewritten
    as one) are what :func:`graph_from_onnx_bytes` drops from the operators, as a
    deployment compiler's constant folding would; initializers are not among them.
    """
    work = onnx.ModelProto()
    work.CopyFrom(model)
    values = _constant_values(work.graph)
    initializer_names = {init.name for init in work.graph.initializer}

    def folded() -> dict[str, np.ndarray]:
        return {name: value for name, value in values.items() if name not in initializer_names}

    _hide_long_constants(work.graph)
    use_data_prop = not _has_bodies(work)
    folded_elements = 0
    budget_spent = False
    inferred_values = _value_shapes(work)
    produced = [output for node in work.graph.node for output in node.output if output]  # folding keeps them
    shapes_final = False  # every operator output has a whole shape: inference has no more to say
    for round_number in range(MAX_FOLD_ROUNDS + 1):  # the last round only infers
        if not shapes_final:
            notes = warnings if round_number == 0 else []
            static = _infer(work, notes, data_prop=False)
            if static is work:  # inference failed (warned): declared shapes only
                return inferred_values, folded()
            static_values = _value_shapes(static)
            _check_sizes(static_values)
            inferred_values = static_values
            shapes_final = _all_shaped(static_values, produced)
            if use_data_prop and not shapes_final:
                inferred = _infer(_without_long_values(work, static_values), notes, data_prop=True)
                inferred_values = _value_shapes(inferred)
                _check_sizes(inferred_values)
                shapes_final = _all_shaped(inferred_values, produced)
            known_shapes = {name: shape for name, shape, _ in static_values}
            known_shapes.update((name, shape) for name, shape, _ in inferred_values)
            known_shapes.update((init.name, tuple(int(d) for d in init.dims)) for init in work.graph.initializer)
        if round_number == MAX_FOLD_ROUNDS:
            break

        replaced = False
        for node in work.graph.node:
            op_type = node.op_type
            if (
                op_type not in _FOLDABLE
                or node.domain not in ("", "ai.onnx")
                or len(node.output) != 1
                or not node.output[0]
            ):
                continue
            if op_type != "Shape" and node.input and node.input[0] not in values:
                continue  # _eval_node needs the first input's value (every operator but Shape)
            args = [values.get(x) if x else None for x in node.input]
            try:
                in_shapes = [known_shapes.get(node.input[0])] if op_type == "Shape" else []
                outputs = _eval_node(node, args, in_shapes)
            except Exception:  # anything numpy refuses is simply not folded
                outputs = None
            if outputs is None or len(outputs) != 1 or outputs[0].size > FOLD_MAX_ELEMENTS:
                continue
            value = outputs[0]
            if folded_elements + value.size > FOLD_BUDGET_ELEMENTS:
                budget_spent = True
                continue
            try:
                data_type = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
                # inference sees the value only while shapes are still being learnt
                shown = (
                    None
                    if shapes_final
                    else (
                        onnx.numpy_helper.from_array(value)
                        if value.size <= SHAPE_DATA_MAX_ELEMENTS
                        else _shape_only(value.shape, data_type)
                    )
                )
            except (TypeError, ValueError, KeyError):  # a dtype ONNX has no tensor type for
                continue
            folded_elements += value.size
            # rewrite in place as a Constant: same output name, no inputs
            values[node.output[0]] = value
            node.op_type = "Constant"
            node.domain = ""
            del node.input[:]
            del node.attribute[:]
            if shown is not None:
                node.attribute.append(onnx.helper.make_attribute("value", shown))
            replaced = True
        if not replaced:
            break
    if budget_spent:
        warnings.append(
            f"constant folding stopped at {FOLD_BUDGET_ELEMENTS} folded elements: shapes computed "
            "from the remaining values are unknown"
        )
    return inferred_values, folded()


def _value_shapes(model: onnx.ModelProto) -> list[_ValueShape]:
    """(name, shape, element type) of the graph's inputs, intermediate values and outputs, in that order.

    Reading a shape walks protobuf messages dim by dim, the import's main Python cost on a
    large model: each inferred model is read once, here, and the lists are passed on.
    """
    graph = model.graph
    return [(value.name, *_value_shape(value)) for value in (*graph.input, *graph.value_info, *graph.output)]


def _value_shape(value: onnx.ValueInfoProto) -> tuple[Shape | None, int | None]:
    type_proto = value.type
    if not type_proto.HasField("tensor_type"):
        return None, None
    tensor_type = type_proto.tensor_type
    elem = tensor_type.elem_type or None
    if not tensor_type.HasField("shape"):
        return None, elem
    # a dim is a value, a symbol or neither (the oneof); WhichOneof reads it in one call
    shape = tuple(
        [
            d.dim_value if d.WhichOneof("value") == "dim_value" and d.dim_value >= 0 else None
            for d in tensor_type.shape.dim
        ]
    )
    return shape, elem


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for attr in node.attribute:
        if attr.type in _SCALAR_ATTRS:
            out[attr.name] = onnx.helper.get_attribute_value(attr)
    return out


def _outer_reads(node: onnx.NodeProto) -> tuple[list[str], int, bool]:
    """Names a control-flow node's bodies read from enclosing scopes, its body node count,
    and whether the walk stopped at :data:`MAX_SUBGRAPH_DEPTH`.

    Iterative (explicit stack) so a deeply nested model cannot exhaust the Python stack.
    A name counts as outer when no enclosing body defines it; the caller keeps the ones
    the outer graph knows.
    """
    reads: list[str] = []
    seen: set[str] = set()
    n_nodes = 0
    truncated = False
    stack: list[tuple[onnx.GraphProto, frozenset[str], int]] = []
    for attr in node.attribute:
        for body in [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs):
            stack.append((body, frozenset(), 1))
    while stack:
        body, defined_above, depth = stack.pop()
        defined = set(defined_above)
        defined.update(v.name for v in body.input)
        defined.update(t.name for t in body.initializer)
        for inner in body.node:
            n_nodes += 1
            for name in inner.input:
                if name and name not in defined and name not in seen:
                    seen.add(name)
                    reads.append(name)
            defined.update(o for o in inner.output if o)
        for inner in body.node:
            for attr in inner.attribute:
                bodies = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
                if bodies and depth >= MAX_SUBGRAPH_DEPTH:
                    truncated = True
                    continue
                frozen = frozenset(defined)
                stack.extend((b, frozen, depth + 1) for b in bodies)
        for value in body.output:
            if value.name and value.name not in defined and value.name not in seen:
                seen.add(value.name)
                reads.append(value.name)
    return reads, n_nodes, truncated


def _op_names(nodes: Iterable[onnx.NodeProto]) -> list[str]:
    """Node names made unique and non-empty (ONNX allows both empty and repeated names).

    An unnamed node is called ``"<op_type>(<first output>)"``: output names are unique
    in a valid graph, and the name does not depend on the node's position in the file,
    which keeps :func:`partitioners.graph.canonical.model_hash` independent of node order.
    """
    names: list[str] = []
    used: set[str] = set()
    for i, node in enumerate(nodes):
        first_output = next((o for o in node.output if o), None)
        if node.name:
            base = node.name
        elif first_output is not None:
            base = f"{node.op_type}({first_output})"
        else:
            base = f"{node.op_type}#{i}"
        name = base
        k = 1
        while name in used:
            name = f"{base}#{k}"
            k += 1
        used.add(name)
        names.append(name)
    return names


def onnx_operator_names(nodes: Iterable[onnx.NodeProto]) -> list[str]:
    """The operator name :func:`graph_from_onnx_bytes` gives each node of ``nodes`` (a graph's
    ``node`` list, in file order), folded nodes included.

    A runtime that executes a plan maps plan operators back to ONNX nodes by these names
    (``service.client.onnx_runner``): nodes may be unnamed or share a name.
    """
    return _op_names(nodes)


def graph_from_onnx_bytes(
    data: bytes,
    *,
    dims: Mapping[str, int] | None = None,
    max_ops: int | None = None,
    name: str | None = None,
) -> Hypergraph:
    """Import an ONNX model, weights optional, as a hypergraph with sizes and FLOPs.

    Parameters
    ----------
    data : bytes
        The serialized ``ModelProto``. Initializers may hold their values or point to
        external data that is absent; only their dims and dtype are read.
    dims : mapping of str to int, optional
        Values for the symbolic dimensions of the graph inputs
        (``{"batch": 8, "sequence": 2048}``); every one must be bound.
    max_ops : int, optional
        Refuse graphs with more operators, counted with functions inlined and
        subgraphs included, before shape inference and before building anything.
    name : str, optional
        Model name; defaults to the ONNX graph name.

    Returns
    -------
    Hypergraph
        Operators in file order, less the ones folded into constants (see
        :func:`_folded_nodes`); ``tensor_shapes``/``tensor_dtypes`` filled; one
        ``warnings`` line per kind of estimate or simplification made.

    Raises
    ------
    InvalidInput
        ``malformed-onnx`` (not parseable, truncated, empty, no nodes),
        ``unbound-dim`` (a symbolic input dimension missing from ``dims``),
        ``invalid-dims``, ``unknown-tensor`` (a node reads a name nothing defines),
        ``duplicate-producer``, ``absurd-size`` (a tensor over
        :data:`MAX_TENSOR_BYTES`, found as soon as shape inference gives its shape, and
        never by building it), ``cycle``; ``malformed-onnx`` also for a declared rank
        over :data:`MAX_RANK`.
    InputTooLarge
        ``too-many-ops`` when the graph has more than ``max_ops`` operators, or expands
        to more once its local functions are inlined and its control-flow bodies
        counted (:func:`~partitioners.graph.onnx_expansion.expanded_op_count`, before
        shape inference, which would walk every one of them).
    """
    model = _parse(data)
    n_nodes = len(model.graph.node)
    if max_ops is not None and n_nodes > max_ops:
        raise InputTooLarge(
            f"the model has {n_nodes} operators, more than the limit of {max_ops}; "
            "split it or use the job API with a higher limit",
            field="model",
            code="too-many-ops",
        )
    # before inference, which inlines every function call and walks every subgraph
    expanded = expanded_op_count(model) if max_ops is not None and (model.functions or _has_bodies(model)) else 0
    if max_ops is not None and expanded > max_ops:
        raise InputTooLarge(
            f"the model expands to {_count_text(expanded)} operators once its local functions are inlined and "
            f"its subgraphs counted, more than the limit of {max_ops}; a function that calls another several "
            "times, nested, multiplies the count at every level",
            field="model",
            code="too-many-ops",
        )
    _check_names(model.graph)
    _check_ranks(model.graph)
    _check_constant_sizes(model)
    bound = _check_dims(dims)
    warnings: list[str] = []
    initializer_names = {t.name for t in model.graph.initializer} | {
        t.values.name for t in model.graph.sparse_initializer
    }
    used_dims = _bind_dims(model.graph, bound, initializer_names, warnings)
    if set(bound) - used_dims:
        warnings.append(
            f"dims {sorted(set(bound) - used_dims)} name no dimension of the model's inputs and were ignored"
        )
    _drop_large_values(model)
    inferred_values, folded_values = _infer_with_folding(model, warnings)
    graph = model.graph  # operators as uploaded; shapes and dtypes come from inference

    table = _TensorTable.of(graph, inferred_values)
    ops = _read_operators(graph, table, _folded_nodes(graph, folded_values))
    table.add_folded(ops.folded_outputs, folded_values)
    warnings += ops.warnings()
    tensor_names, unused_params = _tensor_order(graph, table, ops)
    if unused_params:
        warnings.append(f"{unused_params} initializers are read by no operator and were left out")
    tensor_shapes = [table.shapes.get(t) for t in tensor_names]
    tensor_elems = [table.elems.get(t) for t in tensor_names]
    tensor_bytes, unknown_size = _tensor_bytes(tensor_names, tensor_shapes, tensor_elems)
    if unknown_size:
        warnings.append(
            f"{unknown_size} tensors have no static shape or dtype after shape inference: counted as 0 bytes"
        )

    index = {t: k for k, t in enumerate(tensor_names)}
    in_ptr, in_ids = csr_from_lists([[index[x] for x in ins] for ins in ops.inputs])
    out_ptr, out_ids = csr_from_lists([[index[x] for x in outs] for outs in ops.outputs])
    is_parameter = np.array([t in table.parameters or t in ops.folded_outputs for t in tensor_names], dtype=bool)
    tensor_role, tensor_of = _onnx_gradients(tensor_names, index, out_ids, is_parameter, warnings)
    result = build_hypergraph(
        name=name if name is not None else (graph.name or "onnx-model"),
        op_names=np.array(ops.names, dtype=object),
        op_types=np.array(ops.types, dtype=object),
        op_flops=ops.flops,
        input_ptr=in_ptr,
        input_tensors=in_ids,
        output_ptr=out_ptr,
        output_tensors=out_ids,
        tensor_names=np.array(tensor_names, dtype=object),
        tensor_bytes=tensor_bytes,
        tensor_is_parameter=is_parameter,
        tensor_shapes=tensor_shapes,
        tensor_dtypes=[_DTYPE_NAMES.get(e) if e else None for e in tensor_elems],
        warnings=warnings,
        tensor_role=tensor_role,
        tensor_of=tensor_of,
    )
    topological_order(result)  # raises InvalidInput(code="cycle")
    return result


#: ONNX Runtime's gradient graph builder names the gradient of ``w`` ``w_grad``
#: (onnxruntime, orttraining/core/graph/gradient_builder_base.h, ``GradientName``).
_GRADIENT_SUFFIX = "_grad"


def _onnx_gradients(
    tensor_names: list[str], index: dict[str, int], out_ids: np.ndarray, is_parameter: np.ndarray, warnings: list[str]
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(tensor_role, tensor_of)`` of a training model's ``w_grad`` tensors, or ``(None, None)``.

    A tensor some operator writes named ``w_grad``, where ``w`` is a tensor no operator
    writes, is the gradient of ``w``; ``w`` is then a parameter (``is_parameter`` is
    set in place), also when it is a graph input, as ONNX Runtime's training models
    take their weights.
    """
    produced = np.zeros(len(tensor_names), dtype=bool)
    produced[out_ids] = True
    pairs = [
        (t, index[name[: -len(_GRADIENT_SUFFIX)]])
        for t, name in enumerate(tensor_names)
        if name.endswith(_GRADIENT_SUFFIX) and produced[t] and name[: -len(_GRADIENT_SUFFIX)] in index
    ]
    pairs = [(t, w) for t, w in pairs if not produced[w]]
    if not pairs:
        return None, None
    grads = np.array([t for t, _ in pairs], dtype=np.int64)
    weights = np.array([w for _, w in pairs], dtype=np.int64)
    tensor_role = np.full(len(tensor_names), ROLE_ABSENT, dtype=np.int8)
    tensor_role[grads] = TENSOR_ROLE_GRADIENT
    tensor_of = np.full(len(tensor_names), -1, dtype=np.int64)
    tensor_of[grads] = weights
    is_parameter[weights] = True
    warnings.append(
        f"{len(pairs)} tensors named '<weight>_grad' read as the gradients of their weights (an ONNX Runtime "
        "training model): planned as the training step it is, its optimizer (a separate model) not included"
    )
    return tensor_role, tensor_of


@dataclass
class _TensorTable:
    """Every tensor the model defines: shape and ONNX element type by name, and which are weights.

    Initializers (the weights) come first, as written; graph inputs, intermediate values
    and outputs take the shapes and types shape inference found for them.
    """

    shapes: dict[str, Shape | None]
    elems: dict[str, int | None]
    parameters: set[str]
    runtime_inputs: list[str]

    @classmethod
    def of(cls, graph: onnx.GraphProto, inferred: list[_ValueShape]) -> _TensorTable:
        shapes: dict[str, Shape | None] = {}
        elems: dict[str, int | None] = {}
        parameters: set[str] = set()
        for init in graph.initializer:
            shapes[init.name] = tuple(int(d) for d in init.dims)
            elems[init.name] = init.data_type
            parameters.add(init.name)
        for sparse in graph.sparse_initializer:
            shapes[sparse.values.name] = tuple(int(d) for d in sparse.dims)
            elems[sparse.values.name] = sparse.values.data_type
            parameters.add(sparse.values.name)
        for name, shape, elem in inferred:
            if name in parameters:
                continue
            if shape is not None or name not in shapes:
                shapes[name] = shape
                elems[name] = elem if elem is not None else elems.get(name)
        # a nameless graph input is one no operator can read (an empty input name means "absent")
        runtime_inputs = [v.name for v in graph.input if v.name and v.name not in parameters]
        return cls(shapes, elems, parameters, runtime_inputs)

    def add_folded(self, names: dict[str, None], values: Mapping[str, np.ndarray]) -> None:
        """Give folded tensors that inference left without a full shape or a type the ones of their value.

        Shape inference types every ``Constant`` it is shown, so this only matters where
        it failed; a folded value's shape is exact either way.
        """
        for name in names:
            value = values.get(name)
            if value is None:
                continue
            shape = self.shapes.get(name)
            if shape is None or any(d is None for d in shape):
                self.shapes[name] = tuple(int(d) for d in value.shape)
            if self.elems.get(name) is None:
                try:
                    self.elems[name] = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
                except (TypeError, ValueError, KeyError):  # a dtype ONNX has no tensor type for
                    continue


@dataclass
class _Operators:
    """The model's operators in file order: what each reads and writes, its FLOPs, and
    what had to be estimated (for the warnings)."""

    names: list[str]
    types: list[str]
    inputs: list[list[str]]
    outputs: list[list[str]]
    flops: np.ndarray
    fallback_types: dict[str, int]  # operator type -> count without a FLOP formula
    shape_notes: dict[str, int]  # operator type -> count with incomplete shapes
    opaque: list[str]  # control-flow operators placed whole
    deep_truncated: bool  # some subgraph was nested deeper than MAX_SUBGRAPH_DEPTH
    n_folded: int  # nodes folded away (not operators)
    folded_outputs: dict[str, None]  # what they wrote, in node order: parameter tensors now
    folded_reads: set[str]  # what they read (an initializer read only by them is not "unused")

    def warnings(self) -> list[str]:
        lines = []
        if self.n_folded:
            lines.append(
                f"{self.n_folded} ONNX nodes folded away as constants (Constant nodes, and shape "
                "computations whose values are known once dims are bound): their outputs are "
                "parameter tensors, not operators"
            )
        if self.opaque:
            shown = ", ".join(self.opaque[:5]) + (f" and {len(self.opaque) - 5} more" if len(self.opaque) > 5 else "")
            lines.append(
                f"control flow placed as opaque operators, FLOPs estimated from their outputs: {shown}"
                + (
                    f"; subgraphs nested deeper than {MAX_SUBGRAPH_DEPTH} were not inspected"
                    if self.deep_truncated
                    else ""
                )
            )
        for op_type, count in sorted(self.fallback_types.items()):
            lines.append(
                f"no FLOP formula for operator type '{op_type}' ({count} operators): "
                "counted one FLOP per output element"
            )
        for op_type, count in sorted(self.shape_notes.items()):
            lines.append(
                f"{count} '{op_type}' operators have incomplete shapes after inference: "
                "FLOPs counted as one per known output element"
            )
        return lines


def _folded_nodes(graph: onnx.GraphProto, folded_values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Which nodes are not operators: their outputs are constants once dims are bound.

    ONNX Runtime and TensorRT fold these at load time, so they launch no kernel; as
    operators they would each cost a launch overhead and send their few bytes between
    devices. A node is folded when it is

    * a ``Constant`` (default domain), whatever its size: its value is in the file, like
      an initializer's; a large one becomes a parameter tensor of its full size (its
      values are never decoded, as for weights);
    * any other node whose outputs the importer folded to known values
      (:func:`_infer_with_folding`: each at most :data:`FOLD_MAX_ELEMENTS` elements, all
      inputs known), e.g. ``Shape -> Gather -> Unsqueeze -> Concat`` feeding a ``Reshape``.

    A node that writes a graph output stays an operator, so every output of the model
    is still produced by something placed. Returns a boolean mask over ``graph.node``.
    """
    graph_outputs = {value.name for value in graph.output}
    dropped = np.zeros(len(graph.node), dtype=bool)
    for i, node in enumerate(graph.node):
        constant = _is_constant(node)
        if not constant and not folded_values:
            continue
        outputs = [o for o in node.output if o]
        if not constant and (not outputs or outputs[0] not in folded_values):
            continue  # most nodes: their first output was not folded
        if any(o in graph_outputs for o in outputs):
            continue
        dropped[i] = constant or all(o in folded_values for o in outputs)
    return dropped


def _read_operators(graph: onnx.GraphProto, table: _TensorTable, folded: np.ndarray) -> _Operators:
    """Walk the nodes once: every output has one producer, every input is defined before
    it is read, control flow reads what its subgraphs read from outside; FLOPs estimated.

    Nodes marked in ``folded`` are checked like the others but become no operator: their
    outputs are listed in ``folded_outputs`` instead.
    """
    all_names = _op_names(graph.node)  # over every node, so names do not depend on what was folded
    ops = _Operators(
        names=[],
        types=[],
        inputs=[],
        outputs=[],
        flops=np.zeros(0),
        fallback_types={},
        shape_notes={},
        opaque=[],
        deep_truncated=False,
        n_folded=int(folded.sum()),
        folded_outputs={},
        folded_reads=set(),
    )
    flops: list[float] = []
    op_names, parameters, runtime_inputs = all_names, table.parameters, table.runtime_inputs
    producer: dict[str, int] = {}
    defined = set(parameters) | set(runtime_inputs)
    for i, node in enumerate(graph.node):
        op_type = node.op_type
        outputs = [o for o in node.output if o]
        for out in outputs:
            if out in producer or out in parameters or out in runtime_inputs:
                first = op_names[producer[out]] if out in producer else "a graph input or initializer"
                raise InvalidInput(
                    f"tensor '{out}' is written by operator '{op_names[i]}' and already by {first}; "
                    "every tensor needs exactly one producer",
                    field=f"graph.node[{i}].output",
                    code="duplicate-producer",
                )
            producer[out] = i
        inputs = [x for x in node.input if x]
        attributes = node.attribute
        if op_type in _CONTROL_FLOW or (
            attributes and any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in attributes)
        ):
            reads, body_nodes, truncated = _outer_reads(node)
            inputs = inputs + [r for r in reads if (r in defined or r in producer) and r not in inputs]
            ops.opaque.append(f"'{op_names[i]}' ({op_type}, {body_nodes} operators inside)")
            ops.deep_truncated = ops.deep_truncated or truncated
        for x in inputs:
            if x not in defined and x not in producer:
                raise InvalidInput(
                    f"operator '{op_names[i]}' ({op_type}) reads tensor '{x}', which no operator, graph input "
                    "or initializer defines before it",
                    field=f"graph.node[{i}].input",
                    code="unknown-tensor",
                )
        defined.update(outputs)
        if folded[i]:
            ops.folded_outputs.update(dict.fromkeys(outputs))
            ops.folded_reads.update(inputs)
            continue
        in_shapes = [table.shapes.get(x) for x in inputs]
        out_shapes = [table.shapes.get(x) for x in outputs]
        if op_type in _CONTROL_FLOW:
            estimate = estimate_flops("", [], out_shapes)
        else:
            estimate = estimate_flops(op_type, in_shapes, out_shapes, _attrs(node) if attributes else {})
            if estimate.note is not None:
                if estimate.note.startswith("no FLOP formula"):
                    ops.fallback_types[op_type] = ops.fallback_types.get(op_type, 0) + 1
                else:
                    ops.shape_notes[op_type] = ops.shape_notes.get(op_type, 0) + 1
        flops.append(estimate.flops)
        ops.names.append(all_names[i])
        ops.types.append(op_type)
        ops.inputs.append(inputs)
        ops.outputs.append(outputs)
    ops.flops = np.array(flops, dtype=np.float64)
    return ops


def _tensor_order(graph: onnx.GraphProto, table: _TensorTable, ops: _Operators) -> tuple[list[str], int]:
    """The graph's tensors: runtime inputs, then the weights something reads, then the
    folded constants something reads, then operator outputs; and how many weights no
    node reads (left out). Weights and constants read only by folded nodes are left out
    too: folding consumed them."""
    used = {x for ins in ops.inputs for x in ins}
    unused_params = sum(1 for p in table.parameters if p not in used and p not in ops.folded_reads)
    tensor_names = list(table.runtime_inputs)
    tensor_names += [t.name for t in graph.initializer if t.name in used]
    tensor_names += [t.values.name for t in graph.sparse_initializer if t.values.name in used]
    tensor_names += [t for t in ops.folded_outputs if t in used]
    tensor_names += [o for outs in ops.outputs for o in outs]
    return tensor_names, unused_params


def _tensor_bytes(
    names: list[str], shapes: list[Shape | None], elems: list[int | None]
) -> tuple[npt.NDArray[np.float64], int]:
    """Bytes of every tensor with a static shape and known dtype, and how many had none
    (counted as 0); a tensor over MAX_TENSOR_BYTES means the dims were bound wrong."""
    tensor_bytes = np.zeros(len(names), dtype=np.float64)
    unknown_size = 0
    for k, (shape, elem) in enumerate(zip(shapes, elems)):
        if shape is None or any(d is None or d < 0 for d in shape) or elem is None or elem not in _BITS:
            unknown_size += 1
            continue
        tensor_bytes[k] = np.ceil(_check_tensor_size(names[k], shape, elem))
    return tensor_bytes, unknown_size
