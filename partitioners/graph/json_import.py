"""The service's JSON graph form, validated and read into a :class:`~partitioners.graph.hypergraph.Hypergraph`.

The form is DESIGN.md's "Data shapes": ``{"name", "nodes", "tensors", "warnings"?}``.
Every list is read column by column with C-level comprehensions; the entry-by-entry
checks that name the offending field run only once that pass has found a problem
(``bench/ingest.py`` measures the cost against ``json.loads``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
import numpy.typing as npt

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.flops import Shape, estimate_flops
from partitioners.graph.hypergraph import (
    MAX_OP_FLOPS,
    MAX_TENSOR_BYTES,
    OP_ROLE_BACKWARD,
    OP_ROLE_FORWARD,
    OP_ROLE_OPTIMIZER,
    ROLE_ABSENT,
    TENSOR_ACTIVATION,
    TENSOR_INPUT,
    TENSOR_PARAMETER,
    TENSOR_ROLE_GRADIENT,
    TENSOR_ROLE_OPTIMIZER_STATE,
    Hypergraph,
    build_hypergraph,
    topological_order,
)

__all__ = ["GraphJson", "NodeJson", "TensorJson", "graph_from_json"]

#: The kinds a tensor may declare. A gradient is written by an operator (structurally an
#: activation); optimizer state is resident and updated in place (structurally a
#: parameter): their codes here are the JSON form's own, mapped by _training_roles.
_KIND_GRADIENT = 3
_KIND_OPTIMIZER_STATE = 4
_TENSOR_KINDS = {
    None: -1,
    "activation": TENSOR_ACTIVATION,
    "input": TENSOR_INPUT,
    "parameter": TENSOR_PARAMETER,
    "gradient": _KIND_GRADIENT,
    "optimizer_state": _KIND_OPTIMIZER_STATE,
}
_KIND_NAMES = '"parameter", "input", "activation", "gradient" or "optimizer_state"'
_OP_ROLES = {
    None: ROLE_ABSENT,
    "forward": OP_ROLE_FORWARD,
    "backward": OP_ROLE_BACKWARD,
    "optimizer": OP_ROLE_OPTIMIZER,
}
_NUMBER_TYPES = frozenset({int, float})
#: The fields of the JSON graph form (DESIGN.md, "Data shapes"); any other is a typo
#: that would otherwise be ignored. ``warnings`` is what
#: :func:`~partitioners.graph.canonical.graph_to_json` carries.
_GRAPH_FIELDS = ("name", "nodes", "tensors", "warnings")
_NODE_FIELDS = ("name", "op", "inputs", "outputs", "flops", "param_bytes", "device_types", "role", "time_s")
_TENSOR_FIELDS = ("name", "bytes", "shape", "dtype", "kind", "of")


class NodeJson(TypedDict):
    """One operator of the JSON graph form (an entry of ``"nodes"``)."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    flops: NotRequired[float | None]  # None or absent: estimated from shapes on import
    param_bytes: NotRequired[float | None]  # absent: the bytes of the parameter tensors it reads
    device_types: NotRequired[list[str] | None]  # absent: any device type
    role: NotRequired[Literal["forward", "backward", "optimizer"] | None]  # absent: forward
    time_s: NotRequired[float | dict[str, float] | None]  # the compiler's own time, per device type or for all


class TensorJson(TypedDict):
    """One tensor of the JSON graph form (an entry of ``"tensors"``)."""

    name: str
    bytes: float
    shape: NotRequired[list[int | None] | None]  # None in a shape: a dimension left unresolved
    dtype: NotRequired[str | None]
    # absent: from the structure
    kind: NotRequired[Literal["activation", "input", "parameter", "gradient", "optimizer_state"] | None]
    of: NotRequired[str | None]  # a gradient's (or optimizer state's) parameter tensor


class GraphJson(TypedDict):
    """The JSON graph form as :func:`~partitioners.graph.canonical.graph_to_json` and the
    generators write it; :func:`graph_from_json` also takes it without ``"name"`` (then
    ``""``) or ``"tensors"`` (then none declared), and checks every field itself."""

    name: str
    nodes: list[NodeJson]
    tensors: list[TensorJson]
    warnings: NotRequired[list[str]]


#: Entries of the document's "nodes" or "tensors" list as decoded from JSON: nothing is
#: known of them until :class:`_JsonColumns` has checked each column's value types.
_JsonEntries = list[Any]
_OPTIONAL_NUMBER_TYPES = frozenset({int, float, type(None)})
#: Bytes per element assumed when an operator has neither flops nor shapes and its
#: work is estimated from its output bytes (float32, the ONNX export default).
_FALLBACK_ELEMENT_BYTES = 4.0
_FLOAT_MAX = float(np.finfo(np.float64).max)
#: Shape dimensions are hashed and multiplied as int64.
_MAX_DIM = 2**63 - 1


def _types(values: Iterable[object]) -> set[type]:
    return set(map(type, values))


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _raise_entry_problem(nodes: _JsonEntries, tensors: _JsonEntries) -> None:
    """Find and raise the first malformed entry, with its exact field path.

    The fast path only notices *that* some entry has the wrong shape (a missing key,
    a wrong type); this slow pass, run only then, says which one and why.
    """
    for i, t in enumerate(tensors):
        where = f"tensors[{i}]"
        if not isinstance(t, dict):
            raise InvalidInput(f"{where} must be an object, got {_describe(t)}", field=where, code="invalid-tensor")
        _unknown_field_first(t, where, "tensor", _TENSOR_FIELDS)
        if not isinstance(t.get("name"), str):
            raise InvalidInput(f'{where} needs a string "name"', field=f"{where}.name", code="invalid-tensor")
        if type(t.get("bytes")) not in _NUMBER_TYPES:
            raise InvalidInput(
                f"tensor '{t['name']}' needs \"bytes\" as a number, got {_describe(t.get('bytes'))}",
                field=f"{where}.bytes",
                code="invalid-tensor",
            )
        shape = t.get("shape")
        if shape is not None and (
            not isinstance(shape, list)
            or any(d is not None and (type(d) is not int or not 0 <= d <= _MAX_DIM) for d in shape)
        ):
            raise InvalidInput(
                f"tensor '{t['name']}' has shape {_describe(shape)}; a shape is a list of "
                "integers from 0 to 2^63 - 1, or null for an unknown dimension (bind symbolic "
                "dimensions before sending the graph)",
                field=f"{where}.shape",
                code="invalid-tensor",
            )
        if t.get("dtype") is not None and not isinstance(t.get("dtype"), str):
            raise InvalidInput(
                f"tensor '{t['name']}' has dtype {_describe(t.get('dtype'))}; use a name such as \"float16\"",
                field=f"{where}.dtype",
                code="invalid-tensor",
            )
        kind = t.get("kind")
        if not isinstance(kind, (str, type(None))) or kind not in _TENSOR_KINDS:
            raise InvalidInput(
                f"tensor '{t['name']}' has kind {_describe(kind)}; expected {_KIND_NAMES}",
                field=f"{where}.kind",
                code="invalid-tensor",
            )
        if not isinstance(t.get("of"), (str, type(None))):
            raise InvalidInput(
                f"tensor '{t['name']}' has \"of\" {_describe(t.get('of'))}; expected the name of a parameter tensor",
                field=f"{where}.of",
                code="invalid-tensor",
            )
    for i, n in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise InvalidInput(f"{where} must be an object, got {_describe(n)}", field=where, code="invalid-node")
        _unknown_field_first(n, where, "operator", _NODE_FIELDS)
        if not isinstance(n.get("name"), str):
            raise InvalidInput(f'{where} needs a string "name"', field=f"{where}.name", code="invalid-node")
        label = f"operator '{n['name']}'"
        if not isinstance(n.get("op"), str):
            raise InvalidInput(f'{label} needs a string "op" (its type)', field=f"{where}.op", code="invalid-node")
        for key in ("inputs", "outputs"):
            refs = n.get(key)
            if not isinstance(refs, list):
                raise InvalidInput(
                    f'{label} needs "{key}" as a list of tensor names', field=f"{where}.{key}", code="invalid-node"
                )
            for j, ref in enumerate(refs):
                if not isinstance(ref, str):
                    raise InvalidInput(
                        f'{label} lists {_describe(ref)} in "{key}"; expected a tensor name',
                        field=f"{where}.{key}[{j}]",
                        code="invalid-node",
                    )
        for key in ("flops", "param_bytes"):
            if type(n.get(key)) not in _OPTIONAL_NUMBER_TYPES:
                raise InvalidInput(
                    f'{label} has "{key}" {_describe(n.get(key))}; expected a number',
                    field=f"{where}.{key}",
                    code="invalid-node",
                )
        role = n.get("role")
        if not isinstance(role, (str, type(None))) or role not in _OP_ROLES:
            raise InvalidInput(
                f'{label} has "role" {_describe(role)}; expected "forward", "backward" or "optimizer"',
                field=f"{where}.role",
                code="invalid-node",
            )
        devices = n.get("device_types")
        if devices is not None and (
            not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices)
        ):
            raise InvalidInput(
                f'{label} has "device_types" {_describe(devices)}; expected a non-empty list of device '
                "type names (leave it out to allow any device)",
                field=f"{where}.device_types",
                code="invalid-node",
            )
    raise InvalidInput("the graph is malformed", field="nodes", code="invalid-graph")  # pragma: no cover


def _unknown_field_first(entry: dict[str, Any], where: str, kind: str, fields: tuple[str, ...]) -> None:
    """An unknown field is reported before a missing one: ``"nmae"`` is a typo of ``"name"``."""
    unknown = [key for key in entry if key not in fields]
    if unknown:
        name = entry.get("name")
        owner = f"{kind} '{_field_label(name)}'" if isinstance(name, str) else where
        _raise_unknown_field(owner, unknown[0], where, fields)


def _check_numbers(
    values: npt.NDArray[np.float64],
    present: npt.NDArray[np.bool_] | None,
    owner_names: Sequence[str],
    what: str,
    section: str,
    maximum: float,
) -> None:
    """Reject negative, non-finite or absurdly large sizes and FLOP counts, naming the first offender."""
    bad = ~np.isfinite(values) | (values < 0) | (values > maximum)
    if present is not None:
        bad &= present
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(
            f"{section[:-1] if section == 'tensors' else 'operator'} '{owner_names[i]}' has {what} = "
            f"{float(values[i])!r}; {what} must be a finite number from 0 to {maximum:.3g}",
            field=f"{section}[{i}].{what}",
            code="invalid-number",
        )


def _float_array(
    values: Sequence[float | None], owner_names: Sequence[str], what: str, section: str
) -> npt.NDArray[np.float64]:
    """``values`` as float64 (None -> nan); integers beyond float range are rejected."""
    try:
        return np.array(values, dtype=np.float64)
    except OverflowError:
        i = next(i for i, v in enumerate(values) if isinstance(v, int) and abs(v) > _FLOAT_MAX)
        raise InvalidInput(
            f"{section[:-1] if section == 'tensors' else 'operator'} '{owner_names[i]}' has {what} = "
            f"{_describe(values[i])}, beyond the range of a double; {what} must be a finite number >= 0",
            field=f"{section}[{i}].{what}",
            code="invalid-number",
        ) from None


def _first_duplicate(names: Sequence[str]) -> tuple[int, int]:
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            return seen[name], i
        seen[name] = i
    raise AssertionError("no duplicate")  # pragma: no cover


def _unknown_reference(nodes: _JsonEntries, key: str, index: dict[str, int]) -> None:
    for i, n in enumerate(nodes):
        for j, ref in enumerate(n[key]):
            if ref not in index:
                if key == "inputs":
                    detail = (
                        f"operator '{n['name']}' reads tensor '{ref}', which is neither declared in "
                        '"tensors" nor produced by any operator'
                    )
                else:
                    detail = (
                        f"operator '{n['name']}' writes tensor '{ref}', which is not declared in "
                        '"tensors"; declare it with its size in bytes'
                    )
                raise InvalidInput(detail, field=f"nodes[{i}].{key}[{j}]", code="unknown-tensor")
    raise AssertionError("no unknown reference")  # pragma: no cover


def _csr_ids(
    lists: list[list[str]], index: dict[str, int], nodes: _JsonEntries, key: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Name lists -> CSR of tensor ids, one C-level pass (map over dict lookups)."""
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    try:
        ids = np.fromiter(map(index.__getitem__, chain.from_iterable(lists)), dtype=np.int64, count=int(ptr[-1]))
    except (KeyError, TypeError):
        _unknown_reference(nodes, key, index)
    return ptr, ids


def graph_from_json(
    doc: dict[str, Any],
    *,
    max_ops: int | None = None,
    max_tensors: int | None = None,
) -> Hypergraph:
    """Validate the service's JSON graph form and build its :class:`Hypergraph`.

    The document is ``{"name", "nodes": [{"name", "op", "inputs", "outputs", "flops"?,
    "param_bytes"?, "device_types"?, "role"?}], "tensors": [{"name", "bytes", "shape"?,
    "dtype"?, "kind"?, "of"?}]}`` (DESIGN.md, "Data shapes"); a ``null`` in a shape is a
    dimension the exporter could not resolve. An exported training step declares its
    operators' ``role`` (``forward``, ``backward``, ``optimizer``) and tensors of kind
    ``gradient`` (written by an operator) or ``optimizer_state`` (resident, updated in
    place), whose ``of`` names the parameter they belong to (required for a gradient);
    they become ``op_role``, ``tensor_role`` and ``tensor_of`` (docs/api.md, "Exported
    training steps"). A tensor that no operator writes is a
    graph input, or a parameter (resident weights) when its ``kind`` is
    ``"parameter"``. A node's ``param_bytes``, when given, replaces the sum of the
    parameter tensors it reads (weights the graph does not spell out as tensors).
    Missing ``flops`` are estimated from the operator type and tensor shapes
    (:func:`partitioners.graph.flops.estimate_flops`), or from output bytes when there are
    no shapes; each estimate adds a line to ``graph.warnings``.

    Every list is read once, column by column, with C-level comprehensions and
    ``map``; entry-by-entry checking runs only after that pass has found a problem, to
    say precisely where it is. So a 10^6-operator graph ingests in a small multiple of
    the time ``json.loads`` took to parse it (``bench/ingest.py``).

    Parameters
    ----------
    doc : dict
        The parsed JSON document.
    max_ops, max_tensors : int, optional
        Size limits, checked on the list lengths before anything is built.

    Returns
    -------
    Hypergraph

    Raises
    ------
    InputTooLarge
        More operators or tensors than the limits (``code="too-many-ops"`` /
        ``"too-many-tensors"``).
    InvalidInput
        With ``field`` set to the offending entry's path and ``code`` one of
        ``invalid-graph``, ``empty-graph``, ``invalid-node``, ``invalid-tensor``,
        ``invalid-number`` (negative, non-finite or over ``MAX_TENSOR_BYTES`` / ``MAX_OP_FLOPS``), ``duplicate-op``,
        ``duplicate-tensor``, ``unknown-tensor``, ``duplicate-producer``,
        ``kind-mismatch`` (also an ``of`` naming a tensor that is not a parameter), ``cycle``,
        ``unknown-field`` (a field the form does not have:
        a typo such as ``"flop"`` is an error, never silently ignored); an empty node or
        tensor name is ``invalid-node`` / ``invalid-tensor``.
    """
    nodes, tensors, name = _document_lists(doc)
    _check_graph_size(len(nodes), len(tensors), max_ops, max_tensors)
    columns = _JsonColumns.read(nodes, tensors)
    _check_fields(nodes, tensors)
    n_ops = len(nodes)
    index = _unique_names(columns)

    # numbers are finite and non-negative
    bytes_arr = _float_array(columns.t_bytes, columns.t_names, "bytes", "tensors")
    _check_numbers(bytes_arr, None, columns.t_names, "bytes", "tensors", MAX_TENSOR_BYTES)
    flops_arr = _float_array(columns.op_flops, columns.op_names, "flops", "nodes")  # None -> nan
    flops_missing = _absent(columns.op_flops, columns.flops_types, n_ops)
    _check_numbers(flops_arr, ~flops_missing, columns.op_names, "flops", "nodes", MAX_OP_FLOPS)
    params_arr = _float_array(columns.op_params, columns.op_names, "param_bytes", "nodes")
    params_given = ~_absent(columns.op_params, columns.params_types, n_ops)
    _check_numbers(params_arr, params_given, columns.op_names, "param_bytes", "nodes", MAX_TENSOR_BYTES)

    # references resolve; each tensor has at most one producer
    in_ptr, in_ids = _csr_ids(columns.op_inputs, index, nodes, "inputs")
    out_ptr, out_ids = _csr_ids(columns.op_outputs, index, nodes, "outputs")
    writes = _writers_per_tensor(out_ptr, out_ids, columns)
    is_param = _declared_parameters(columns, writes > 0)
    op_role, tensor_role, tensor_of = _training_roles(columns, index, is_param)

    shapes = [tuple(s) if s is not None else None for s in columns.t_shapes] if columns.has_shapes else None
    dtypes = columns.t_dtypes if _types(columns.t_dtypes) != {type(None)} else None
    devices = (
        _object_vector([tuple(d) if d is not None else None for d in columns.op_devices])
        if list in columns.device_types_types
        else None
    )
    warnings: list[str] = []
    if flops_missing.any():
        _estimate_missing_flops(
            flops_arr, flops_missing, columns.op_types, in_ptr, in_ids, out_ptr, out_ids, shapes, bytes_arr, warnings
        )

    graph = build_hypergraph(
        name=name,
        op_names=_object_vector(columns.op_names),
        op_types=_object_vector(columns.op_types),
        op_flops=flops_arr,
        input_ptr=in_ptr,
        input_tensors=in_ids,
        output_ptr=out_ptr,
        output_tensors=out_ids,
        tensor_names=_object_vector(columns.t_names),
        tensor_bytes=bytes_arr,
        tensor_is_parameter=is_param,
        tensor_shapes=shapes,
        tensor_dtypes=dtypes,
        op_device_types=devices,
        warnings=warnings + _carried_warnings(doc.get("warnings")),
        op_role=op_role,
        tensor_role=tensor_role,
        tensor_of=tensor_of,
    )
    if params_given.any():
        graph.op_param_bytes[params_given] = params_arr[params_given]
    times = _node_times(nodes, columns.op_names)
    if times is not None:
        graph = replace(graph, op_time_s=times[0], op_time_keys=times[1])
    topological_order(graph)  # raises InvalidInput(code="cycle")
    return graph


#: Longest operator time a node may give: a day. Anything longer is a unit mistake.
MAX_NODE_TIME_S = 86_400.0


def _node_times(nodes: _JsonEntries, op_names: Sequence[str]) -> tuple[npt.NDArray[np.float64], tuple[str, ...]] | None:
    """Nodes' ``time_s`` as ``(times (n_ops, n_keys), keys)``, NaN where absent; None when no node has one.

    A number applies to every device (key ``"*"``), an object ``{device type: s}`` to
    the devices of those types.
    """
    values = [n.get("time_s") for n in nodes]
    if values.count(None) == len(values):  # C-level: a graph without times costs one pass
        return None
    given = [i for i, v in enumerate(values) if v is not None]
    keys: dict[str, None] = {}
    for i in given:
        v = values[i]
        where = f"nodes[{i}].time_s"
        entries = v.items() if isinstance(v, dict) else [("*", v)]
        if isinstance(v, dict) and not v:
            raise InvalidInput(
                f"operator '{op_names[i]}' has an empty \"time_s\" object; give seconds per device type",
                field=where,
                code="invalid-number",
            )
        for key, t in entries:
            if not isinstance(key, str) or not key or len(key) > 200 or "\x00" in key or type(t) not in _NUMBER_TYPES:
                raise InvalidInput(
                    f"operator '{op_names[i]}' has \"time_s\" {_describe(v)}; expected seconds as a number, "
                    "or an object of device type -> seconds",
                    field=where,
                    code="invalid-node",
                )
            if not (0.0 <= float(t) <= MAX_NODE_TIME_S):
                raise InvalidInput(
                    f"operator '{op_names[i]}' has time_s = {t!r}; it must be a finite number of seconds "
                    f"from 0 to {MAX_NODE_TIME_S:g}",
                    field=where if key == "*" else f"{where}.{key}",
                    code="invalid-number",
                )
            keys[key] = None
    order = sorted(keys, key=lambda k: (k != "*", k))
    col = {k: j for j, k in enumerate(order)}
    out = np.full((len(nodes), len(order)), np.nan, dtype=np.float64)
    for i in given:
        v = values[i]
        for key, t in v.items() if isinstance(v, dict) else [("*", v)]:
            out[i, col[key]] = float(t)
    return out, tuple(order)


def _document_lists(doc: object) -> tuple[_JsonEntries, _JsonEntries, str]:
    """The document's ``nodes``, ``tensors`` and ``name``, or what is wrong with its outline."""
    if not isinstance(doc, dict):
        raise InvalidInput(
            'the graph must be a JSON object with "nodes" and "tensors"', field="graph", code="invalid-graph"
        )
    nodes = doc.get("nodes")
    tensors = doc.get("tensors", [])
    if not isinstance(nodes, list):
        raise InvalidInput('the graph needs "nodes": a list of operators', field="nodes", code="invalid-graph")
    if not isinstance(tensors, list):
        raise InvalidInput('"tensors" must be a list of tensors', field="tensors", code="invalid-graph")
    name = doc.get("name", "")
    if not isinstance(name, str):
        raise InvalidInput('"name" must be a string', field="name", code="invalid-graph")
    unknown = [key for key in doc if key not in _GRAPH_FIELDS]
    if unknown:
        _raise_unknown_field("the graph", unknown[0], "", _GRAPH_FIELDS[:3])
    return nodes, tensors, name


def _field_label(key: object) -> str:
    """A field name fit to quote in a message and a field path: short, printable text."""
    if isinstance(key, str) and len(key) <= 100 and key.isprintable():
        return key
    return _describe(key)


def _raise_unknown_field(owner: str, key: object, where: str, fields: tuple[str, ...]) -> None:
    label = _field_label(key)
    close = difflib.get_close_matches(label, fields, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    listed = ", ".join(f'"{f}"' for f in fields)
    raise InvalidInput(
        f'{owner} has an unknown field "{label}"{hint}; the fields are {listed}',
        field=f"{where}.{label}" if where else label,
        code="unknown-field",
    )


def _check_fields(nodes: _JsonEntries, tensors: _JsonEntries) -> None:
    """Reject a node or tensor field the graph form does not have, naming the first one.

    One C-level pass collects every key in use; only when one is unknown does a second
    pass find which entry holds it.
    """
    for entries, fields, section in ((tensors, _TENSOR_FIELDS, "tensors"), (nodes, _NODE_FIELDS, "nodes")):
        if set(chain.from_iterable(entries)) <= set(fields):
            continue
        for i, entry in enumerate(entries):
            unknown = [key for key in entry if key not in fields]
            if unknown:
                owner = f"{'tensor' if section == 'tensors' else 'operator'} '{_field_label(entry['name'])}'"
                _raise_unknown_field(owner, unknown[0], f"{section}[{i}]", fields)


def _check_graph_size(n_ops: int, n_tensors: int, max_ops: int | None, max_tensors: int | None) -> None:
    """The size limits, checked on list lengths before anything is built; an empty graph is an error too."""
    if max_ops is not None and n_ops > max_ops:
        raise InputTooLarge(
            f"the graph has {n_ops} operators; this service accepts at most {max_ops} per graph",
            field="nodes",
            code="too-many-ops",
        )
    if max_tensors is not None and n_tensors > max_tensors:
        raise InputTooLarge(
            f"the graph has {n_tensors} tensors; this service accepts at most {max_tensors} per graph",
            field="tensors",
            code="too-many-tensors",
        )
    if n_ops == 0:
        raise InvalidInput("the graph has no operators", field="nodes", code="empty-graph")


@dataclass
class _JsonColumns:
    """The JSON graph's lists read column by column, each column's value types checked.

    One C-level pass per column; any structural surprise (a missing key, a wrong
    type, a negative dimension) goes to :func:`_raise_entry_problem`, the slow
    locator that names the entry.
    """

    t_names: list[str]
    t_bytes: list[float]
    t_shapes: list[list[int | None] | None]
    t_dtypes: list[str | None]
    t_kinds: list[str | None]
    t_of: list[str | None]
    op_names: list[str]
    op_types: list[str]
    op_inputs: list[list[str]]
    op_outputs: list[list[str]]
    op_flops: list[float | None]
    op_params: list[float | None]
    op_devices: list[list[str] | None]
    op_roles: list[str | None]
    flops_types: set[type]
    params_types: set[type]
    device_types_types: set[type]
    kind_values: set[object]  # the kinds in use; a sentinel object() when one is not a string
    has_shapes: bool

    @classmethod
    def read(cls, nodes: _JsonEntries, tensors: _JsonEntries) -> _JsonColumns:
        try:
            t_names = [t["name"] for t in tensors]
            t_bytes = [t["bytes"] for t in tensors]
            t_shapes = [t.get("shape") for t in tensors]
            t_dtypes = [t.get("dtype") for t in tensors]
            t_kinds = [t.get("kind") for t in tensors]
            t_of = [t.get("of") for t in tensors]
            op_names = [n["name"] for n in nodes]
            op_types = [n["op"] for n in nodes]
            op_inputs = [n["inputs"] for n in nodes]
            op_outputs = [n["outputs"] for n in nodes]
            op_flops = [n.get("flops") for n in nodes]
            op_params = [n.get("param_bytes") for n in nodes]
            op_devices = [n.get("device_types") for n in nodes]
            op_roles = [n.get("role") for n in nodes]
        except (KeyError, TypeError, AttributeError):
            _raise_entry_problem(nodes, tensors)
        shape_types = _types(t_shapes)
        kind_values = set(t_kinds) if _types(t_kinds) <= {str, type(None)} else {object()}
        role_values = set(op_roles) if _types(op_roles) <= {str, type(None)} else {object()}
        flops_types = _types(op_flops)
        params_types = _types(op_params)
        device_types_types = _types(op_devices)
        if (
            not _types(t_names) <= {str}
            or not _types(t_bytes) <= _NUMBER_TYPES
            or not shape_types <= {list, type(None)}
            or not _types(t_dtypes) <= {str, type(None)}
            or not kind_values <= _TENSOR_KINDS.keys()
            or not _types(op_names) <= {str}
            or not _types(op_types) <= {str}
            or not _types(op_inputs) <= {list}
            or not _types(op_outputs) <= {list}
            or not flops_types <= _OPTIONAL_NUMBER_TYPES
            or not params_types <= _OPTIONAL_NUMBER_TYPES
            or not device_types_types <= {list, type(None)}
            or not _types(t_of) <= {str, type(None)}
            or not role_values <= _OP_ROLES.keys()
        ):
            _raise_entry_problem(nodes, tensors)

        # shapes: lists of non-negative ints
        has_shapes = list in shape_types
        if has_shapes:
            dims = list(chain.from_iterable(s for s in t_shapes if s is not None))
            dim_types = _types(dims)
            if type(None) in dim_types:  # null: a dimension the exporter could not resolve
                dims = [d for d in dims if d is not None]
            if not dim_types <= {int, type(None)} or (dims and (min(dims) < 0 or max(dims) > _MAX_DIM)):
                _raise_entry_problem(nodes, tensors)
        if list in device_types_types and (
            [] in op_devices or not _types(list(chain.from_iterable(d for d in op_devices if d is not None))) <= {str}
        ):
            _raise_entry_problem(nodes, tensors)
        return cls(
            t_names,
            t_bytes,
            t_shapes,
            t_dtypes,
            t_kinds,
            t_of,
            op_names,
            op_types,
            op_inputs,
            op_outputs,
            op_flops,
            op_params,
            op_devices,
            op_roles,
            flops_types,
            params_types,
            device_types_types,
            kind_values,
            has_shapes,
        )


def _unique_names(columns: _JsonColumns) -> dict[str, int]:
    """Tensor name -> index, once tensor and operator names are each known to be unique and
    non-empty (an empty name cannot be referred to, shown or told apart in a plan)."""
    t_names, op_names = columns.t_names, columns.op_names
    index = dict(zip(t_names, range(len(t_names))))
    if "" in index:
        i = t_names.index("")
        raise InvalidInput(
            f'tensors[{i}] has an empty "name"; every tensor needs a name',
            field=f"tensors[{i}].name",
            code="invalid-tensor",
        )
    op_name_set = set(op_names)
    if "" in op_name_set:
        i = op_names.index("")
        raise InvalidInput(
            f'nodes[{i}] has an empty "name"; every operator needs a name',
            field=f"nodes[{i}].name",
            code="invalid-node",
        )
    if len(index) != len(t_names):
        first, again = _first_duplicate(t_names)
        raise InvalidInput(
            f"tensor name '{t_names[again]}' is declared twice (tensors[{first}] and tensors[{again}])",
            field=f"tensors[{again}].name",
            code="duplicate-tensor",
        )
    if len(op_name_set) != len(op_names):
        first, again = _first_duplicate(op_names)
        raise InvalidInput(
            f"operator name '{op_names[again]}' is used twice (nodes[{first}] and nodes[{again}])",
            field=f"nodes[{again}].name",
            code="duplicate-op",
        )
    return index


def _absent(values: Sequence[object], value_types: set[type], count: int) -> npt.NDArray[np.bool_]:
    """Per entry, whether an optional number was left out (``None``)."""
    if type(None) not in value_types:
        return np.zeros(count, dtype=bool)
    return np.fromiter((v is None for v in values), dtype=bool, count=count)


def _object_vector(items: Sequence[object]) -> npt.NDArray[np.object_]:
    """A 1-D object array of ``items``, even when they are tuples numpy would stack into 2-D."""
    return np.fromiter(items, dtype=object, count=len(items))


def _writers_per_tensor(out_ptr: np.ndarray, out_ids: np.ndarray, columns: _JsonColumns) -> np.ndarray:
    """How many operators write each tensor; more than one is an error naming two of them."""
    op_names, t_names = columns.op_names, columns.t_names
    writes = np.bincount(out_ids, minlength=len(t_names))
    if (writes > 1).any():
        t = int(np.argmax(writes > 1))
        writers = np.repeat(np.arange(len(op_names)), np.diff(out_ptr))[out_ids == t]
        a, b = (op_names[int(w)] for w in writers[:2])
        detail = (
            f"tensor '{t_names[t]}' is written twice by operator '{a}'"
            if a == b
            else f"tensor '{t_names[t]}' is written by two operators, '{a}' and '{b}'; each tensor has one producer"
        )
        raise InvalidInput(detail, field=f"nodes[{int(writers[1])}].outputs", code="duplicate-producer")
    return writes


def _declared_parameters(columns: _JsonColumns, produced: np.ndarray) -> np.ndarray | None:
    """Which tensors are declared parameters (None when no tensor declares a kind),
    once every declared kind agrees with the structure."""
    if columns.kind_values == {None}:
        return None
    t_kinds, t_names = columns.t_kinds, columns.t_names
    kind_arr = _kind_codes(columns)
    resident: npt.NDArray[np.bool_] = (kind_arr == TENSOR_PARAMETER) | (kind_arr == _KIND_OPTIMIZER_STATE)
    wrong = (resident | (kind_arr == TENSOR_INPUT)) & produced
    wrong |= ((kind_arr == TENSOR_ACTIVATION) | (kind_arr == _KIND_GRADIENT)) & ~produced
    if wrong.any():
        t = int(np.argmax(wrong))
        if produced[t]:
            detail = f"tensor '{t_names[t]}' is declared kind \"{t_kinds[t]}\" but an operator writes it"
            if kind_arr[t] == _KIND_OPTIMIZER_STATE:
                detail += (
                    "; optimizer state is updated in place: list it among the update operator's inputs, "
                    "and give what the operator writes another name (or no output at all)"
                )
        else:
            what = "a gradient" if kind_arr[t] == _KIND_GRADIENT else "an activation"
            detail = f"tensor '{t_names[t]}' is declared {what} but no operator writes it"
        raise InvalidInput(detail, field=f"tensors[{t}].kind", code="kind-mismatch")
    return resident


def _kind_codes(columns: _JsonColumns) -> npt.NDArray[np.int8]:
    """Each tensor's declared kind as a code of ``_TENSOR_KINDS`` (-1: none declared)."""
    t_kinds = columns.t_kinds
    return np.fromiter(map(_TENSOR_KINDS.__getitem__, t_kinds), dtype=np.int8, count=len(t_kinds))


def _training_roles(
    columns: _JsonColumns, index: dict[str, int], is_param: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """``(op_role, tensor_role, tensor_of)`` of an exported training graph, each None when
    nothing of it is declared, once every ``"of"`` names a declared parameter."""
    op_role = None
    if set(columns.op_roles) != {None}:
        roles = columns.op_roles
        op_role = np.fromiter(map(_OP_ROLES.__getitem__, roles), dtype=np.int8, count=len(roles))
    if columns.kind_values.isdisjoint(("gradient", "optimizer_state")) and set(columns.t_of) == {None}:
        return op_role, None, None
    t_names, t_of = columns.t_names, columns.t_of
    kind_arr = _kind_codes(columns)
    tensor_role = np.full(len(t_names), ROLE_ABSENT, dtype=np.int8)
    tensor_role[kind_arr == _KIND_GRADIENT] = TENSOR_ROLE_GRADIENT
    tensor_role[kind_arr == _KIND_OPTIMIZER_STATE] = TENSOR_ROLE_OPTIMIZER_STATE
    tensor_of = np.full(len(t_names), -1, dtype=np.int64)
    given = np.fromiter((owner is not None for owner in t_of), dtype=bool, count=len(t_of))
    unowned = (tensor_role == TENSOR_ROLE_GRADIENT) & ~given
    if unowned.any():
        t = int(np.argmax(unowned))
        raise InvalidInput(
            f"tensor '{t_names[t]}' is declared a gradient and needs \"of\": the name of the "
            "parameter tensor it is the gradient of",
            field=f"tensors[{t}].of",
            code="invalid-tensor",
        )
    for t in np.flatnonzero(given).tolist():
        owner, role = str(t_of[t]), int(tensor_role[t])
        if role == ROLE_ABSENT:
            raise InvalidInput(
                f'tensor \'{t_names[t]}\' has "of" but is not declared kind "gradient" or '
                '"optimizer_state"; only those belong to a parameter',
                field=f"tensors[{t}].of",
                code="invalid-tensor",
            )
        p = index.get(owner)
        if p is None:
            raise InvalidInput(
                f"tensor '{t_names[t]}' is declared {_ROLE_LABEL[role]} of '{_field_label(owner)}', "
                'which is not a tensor of the graph; "of" names a tensor declared kind "parameter"',
                field=f"tensors[{t}].of",
                code="unknown-tensor",
            )
        if is_param is None or not is_param[p] or kind_arr[p] == _KIND_OPTIMIZER_STATE:
            raise InvalidInput(
                f"tensor '{t_names[t]}' is declared {_ROLE_LABEL[role]} of '{owner}', which is not a "
                f"parameter; declare '{owner}' kind \"parameter\" (a weight no operator writes)",
                field=f"tensors[{t}].of",
                code="kind-mismatch",
            )
        tensor_of[t] = p
    return op_role, tensor_role, tensor_of


_ROLE_LABEL = {TENSOR_ROLE_GRADIENT: "the gradient", TENSOR_ROLE_OPTIMIZER_STATE: "optimizer state"}


def _carried_warnings(value: object) -> list[str]:
    """Warnings a stored canonical document carries (``graph_to_json`` writes them)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise InvalidInput('"warnings" must be a list of strings', field="warnings", code="invalid-graph")
    return list(value)


def _estimate_missing_flops(
    flops: np.ndarray,
    missing: np.ndarray,
    op_types: list[str],
    in_ptr: np.ndarray,
    in_ids: np.ndarray,
    out_ptr: np.ndarray,
    out_ids: np.ndarray,
    shapes: list[Shape | None] | None,
    tensor_bytes: np.ndarray,
    warnings: list[str],
) -> None:
    """Fill ``flops[missing]`` in place from shapes (per operator) or output bytes."""
    todo = np.flatnonzero(missing)
    if shapes is not None:
        unknown_types: dict[str, int] = {}
        for op in todo.tolist():
            ins = [shapes[t] for t in in_ids[in_ptr[op] : in_ptr[op + 1]].tolist()]
            outs = [shapes[t] for t in out_ids[out_ptr[op] : out_ptr[op + 1]].tolist()]
            if all(s is None for s in outs) and all(s is None for s in ins):
                continue
            estimate = estimate_flops(op_types[op], ins, outs)
            flops[op] = estimate.flops
            if estimate.note is not None:
                unknown_types[op_types[op]] = unknown_types.get(op_types[op], 0) + 1
        for op_type, count in sorted(unknown_types.items()):
            warnings.append(
                f"no FLOP formula for operator type '{op_type}' or its shapes are incomplete "
                f"({count} operators): counted one FLOP per output element"
            )
    rest = todo[np.isnan(flops[todo])]
    if rest.size:
        out_bytes = np.zeros(flops.shape[0], dtype=np.float64)
        owners = np.repeat(np.arange(flops.shape[0]), np.diff(out_ptr))
        np.add.at(out_bytes, owners, tensor_bytes[out_ids])
        flops[rest] = out_bytes[rest] / _FALLBACK_ELEMENT_BYTES
        subject = "1 operator has" if rest.size == 1 else f"{rest.size} operators have"
        warnings.append(
            f'{subject} neither "flops" nor tensor shapes: estimated one FLOP per '
            f"{_FALLBACK_ELEMENT_BYTES:g} output bytes (one float32 element)"
        )
