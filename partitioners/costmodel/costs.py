"""Analytic costs: roofline operator times, alpha-beta transfers, collectives over a topology.

An operator's time on a device is the roofline bound [1]_: it can go no faster than
its FLOPs at the device's achievable peak, nor than the bytes it touches at the
device's achievable memory bandwidth, and every kernel pays a launch overhead:

    t = max(flops / (peak * eff_class), bytes / (bw * eff_mem)) * calib[device, class] + launch

``eff_class`` is the fraction of peak an op class reaches in practice, ``eff_mem`` the
fraction of memory bandwidth a streaming kernel reaches; ``calib`` multipliers start
at 1.0 and are set by calibration against measured timelines (DESIGN.md, feedback).
An operator whose graph node carries its own ``time_s`` (measured or estimated by the
compiler, :attr:`~partitioners.graph.hypergraph.Hypergraph.op_time_s`) takes that time
in place of ``max(...) * calib`` and still pays ``launch``: node time, then
calibration, then the profile (:mod:`partitioners.costmodel.profiles`, where the
named parameter sets and the launch modes are). Transfers run at ``link_efficiency``
of each link's bandwidth.

View operators (``Reshape``, ``Squeeze``, ``Unsqueeze``, ``Flatten``, ``Identity``:
:data:`VIEW_OP_TYPES`) touch no bytes: their output is their input's buffer under
another shape [7]_. They still pay the per-operator overhead: a runtime dispatches them
like any other operator (torch.profiler shows ``aten::flatten`` at 3.1 us on a CPU,
an ``aten::add`` at 2.3 us: ``tests/fixtures/feedback/small_cnn.trace.json``), and
calibration fits that overhead from runtimes' timelines, views included.

Transfers use the alpha-beta model of :mod:`partitioners.hardware.collectives` on the link
:func:`partitioners.hardware.inventory.link_between` picks, times a per-link-class multiplier.

References
----------
.. [1] S. Williams, A. Waterman, D. Patterson, "Roofline: an insightful visual
   performance model for multicore architectures", CACM 52(4), 2009.
.. [2] NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning
   Performance docs, 2023): large GEMMs reach 70-80% of tensor-core peak.
.. [3] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
   Partitioning", 2023: 50-73% of peak on A100 forward; J. Shah et al.,
   "FlashAttention-3", 2024: up to 75% on H100.
.. [4] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
   Clusters Using Megatron-LM", SC 2021: 52% of peak end to end on A100 (convolution
   and other non-GEMM work lower still; 0.5 used for conv).
.. [5] Z. Jia, M. Maggioni, B. Staiger, D. Scarpazza, "Dissecting the NVIDIA Volta GPU
   Architecture via Microbenchmarking", 2018: streaming kernels reach ~80-90% of
   theoretical HBM bandwidth (0.8 used).
.. [6] NVIDIA CUDA C++ Best Practices Guide and e.g. Y. Zhang et al., "Understanding
   the Overheads of Launching CUDA Kernels", ICPP poster 2019: ~5 us per kernel launch.
.. [7] ONNX Runtime registers its Reshape, Squeeze, Unsqueeze, Flatten and Identity
   kernels with ``KernelDefBuilder().Alias(0, 0)`` (onnxruntime/core/providers/cpu/),
   so its allocation planner hands the output the input's buffer and nothing is
   copied; PyTorch's ``view``/``reshape`` of a contiguous tensor, which an ONNX tensor
   always is, is a view too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.collectives import (
    LinkSpec,
    allgather_time_s,
    allreduce_time_s,
    alltoall_time_s,
    hierarchical_allgather_time_s,
    hierarchical_allreduce_time_s,
    p2p_time_s,
)
from partitioners.hardware.inventory import (
    LINK_CLASS_NAMES,
    LINK_INTER_GROUP,
    LINK_INTRA_GROUP,
    LINK_LOCAL,
    Inventory,
    device_index,
    link_between,
    link_class_ids,
)

__all__ = [
    "OP_CLASS_NAMES",
    "OP_MATMUL",
    "OP_CONV",
    "OP_ATTENTION",
    "OP_NORM",
    "OP_ELEMENTWISE",
    "OP_REDUCTION",
    "OP_DATA_MOVEMENT",
    "OP_OTHER",
    "VIEW_OP_TYPES",
    "CostModel",
    "op_class_of",
    "is_view_op",
    "timing_dtype",
    "timing_dtype_note",
    "op_times_s",
    "op_times_by_profile_s",
    "node_time_columns",
    "node_times_for",
    "COST_SOURCES",
    "cost_sources",
    "LAUNCH_MODES",
    "transfer_time_s",
    "transfer_times_s",
    "link_time_tables",
    "collective_time_s",
    "cost_model_to_json",
    "cost_model_from_json",
]

OP_MATMUL, OP_CONV, OP_ATTENTION, OP_NORM, OP_ELEMENTWISE, OP_REDUCTION, OP_DATA_MOVEMENT, OP_OTHER = range(8)
#: Operator classes, indexed by the small ints :func:`op_class_of` returns.
OP_CLASS_NAMES: tuple[str, ...] = (
    "matmul",
    "conv",
    "attention",
    "norm",
    "elementwise",
    "reduction",
    "data-movement",
    "other",
)

_CLASS_OF_TYPE: dict[str, int] = {}
for _cls, _types in (
    (OP_MATMUL, "matmul gemm matmulinteger qlinearmatmul linear dense fc einsum bmm addmm mm baddbmm"),
    (OP_CONV, "conv convtranspose qlinearconv convinteger conv1d conv2d conv3d deformconv"),
    (
        OP_ATTENTION,
        "attention multiheadattention scaleddotproductattention sdpa flashattention "
        "groupqueryattention packedattention mha gqa",
    ),
    (
        OP_NORM,
        "layernormalization batchnormalization instancenormalization groupnormalization "
        "rmsnormalization simplifiedlayernormalization skiplayernormalization "
        "layernorm rmsnorm batchnorm groupnorm lrn lpnormalization meanvariancenormalization",
    ),
    (
        OP_ELEMENTWISE,
        "add sub mul div pow sqrt exp log abs neg relu gelu silu sigmoid tanh erf "
        "leakyrelu elu selu softplus hardsigmoid hardswish mish clip min max where "
        "equal less greater not and or cast dropout fastgelu biasgelu identity "
        "reciprocal floor ceil round sin cos sign quantizelinear dequantizelinear softmax "
        "logsoftmax prelu celu",
    ),
    (
        OP_REDUCTION,
        "reducesum reducemean reducemax reducemin reduceprod reducel2 reducel1 "
        "reducelogsumexp reducesumsquare argmax argmin topk cumsum globalaveragepool "
        "globalmaxpool averagepool maxpool lppool",
    ),
    (
        OP_DATA_MOVEMENT,
        "reshape transpose concat split slice gather gatherelements gathernd scatter "
        "scatterelements scatternd squeeze unsqueeze flatten expand tile pad "
        "resize shape size constant constantofshape range depthtospace spacetodepth "
        "copy memcpy send recv allreduce allgather reducescatter alltoall embedding",
    ),
):
    for _t in _types.split():
        _CLASS_OF_TYPE[_t] = _cls


#: Operators whose output aliases their input (lower-case type names): no bytes touched.
VIEW_OP_TYPES = frozenset({"reshape", "squeeze", "unsqueeze", "flatten", "identity"})


def _type_table(
    op_types: np.ndarray | Sequence[str],
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.bool_], npt.NDArray[np.intp]]:
    """``(class of each distinct type, whether it is a view, index of each operator's type)``.

    Types are mapped once per distinct name (``np.unique``), so 10^6 operators of a few
    dozen types cost one pass, and one such pass serves both questions.
    """
    arr = np.asarray(op_types, dtype=object)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int8), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(arr.astype(str), return_inverse=True)
    names = [str(u).lower().replace("_", "") for u in uniq]
    classes = np.array([_CLASS_OF_TYPE.get(n, OP_OTHER) for n in names], dtype=np.int8)
    views = np.array([n in VIEW_OP_TYPES for n in names], dtype=bool)
    return classes, views, inverse.reshape(-1)


def op_class_of(op_types: np.ndarray | Sequence[str]) -> npt.NDArray[np.int8]:
    """Op class (``OP_*`` int8) of each operator type, ONNX / PyTorch names, case-insensitive.

    Unknown types are ``OP_OTHER``.
    """
    classes, _, inverse = _type_table(op_types)
    return classes[inverse]


def is_view_op(op_types: np.ndarray | Sequence[str]) -> npt.NDArray[np.bool_]:
    """Whether each operator is a view (:data:`VIEW_OP_TYPES`, case-insensitive), as a bool array."""
    _, views, inverse = _type_table(op_types)
    return views[inverse]


def _default_efficiency() -> tuple[float, ...]:
    # matmul 0.75 [2]; conv 0.5 [4]; attention 0.6 [3]; norm, elementwise, reduction,
    # data movement are memory bound so their compute efficiency hardly matters: 0.3
    # keeps a FLOP-heavy elementwise op (e.g. erf-based GELU) from looking free;
    # other 0.5.
    return (0.75, 0.5, 0.6, 0.3, 0.3, 0.3, 0.3, 0.5)


@dataclass(frozen=True)
class CostModel:
    """Parameters of the analytic cost model (see the module docstring for the formula).

    Attributes
    ----------
    dtype : str or None
        Dtype of the peak to use; ``None`` = the inventory's default dtype.
    efficiency : tuple of float, one per :data:`OP_CLASS_NAMES`
        Achievable fraction of peak FLOP/s per op class.
    memory_efficiency : float
        Achievable fraction of main-memory bandwidth (0.8 [5]_).
    launch_overhead_s : float
        Fixed cost per operator (kernel launch, ~5 us [6]_).
    device_class_multiplier : mapping (device name, op class name) -> float
        Calibration multipliers on compute time, 1.0 when absent. A device name of
        ``"*"`` applies to every device; a device *type* also matches.
    link_class_multiplier : mapping link class name -> float
        Calibration multipliers on transfer time per :data:`~partitioners.hardware.inventory.LINK_CLASS_NAMES`.
    profile : str
        Name of the :mod:`~partitioners.costmodel.profiles` profile these parameters
        came from (echoed in plan summaries; the numbers above are what time a plan).
    launch : {"single-controller", "per-device"}
        Who pays the launch overhead: one host thread for every device (launches
        serialise across devices, as in PyTorch or ONNX Runtime driving several GPUs
        from one process), or one host thread per device.
    link_efficiency : float
        Achievable fraction of every link's nominal bandwidth (transfer times are
        divided by it).
    device_overrides : mapping device type or name -> mapping
        Per-device values of ``launch_overhead_s``, ``memory_efficiency`` and
        ``efficiency`` (a tuple per op class) where devices differ; a device name
        wins over its type.
    """

    dtype: str | None = None
    efficiency: tuple[float, ...] = field(default_factory=_default_efficiency)
    memory_efficiency: float = 0.8
    launch_overhead_s: float = 5e-6
    device_class_multiplier: Mapping[tuple[str, str], float] = field(default_factory=dict, hash=False)
    link_class_multiplier: Mapping[str, float] = field(default_factory=dict, hash=False)
    profile: str = "eager"
    launch: str = "single-controller"
    link_efficiency: float = 1.0
    device_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "efficiency", tuple(float(e) for e in self.efficiency))
        object.__setattr__(
            self, "device_class_multiplier", {tuple(k): float(v) for k, v in self.device_class_multiplier.items()}
        )
        object.__setattr__(self, "link_class_multiplier", {k: float(v) for k, v in self.link_class_multiplier.items()})
        if len(self.efficiency) != len(OP_CLASS_NAMES):
            raise InvalidInput(
                f"cost model efficiency needs {len(OP_CLASS_NAMES)} entries ({', '.join(OP_CLASS_NAMES)})",
                field="cost_model.efficiency",
            )
        if not all(0 < e <= 1 for e in self.efficiency):
            raise InvalidInput("cost model efficiencies must be in (0, 1]", field="cost_model.efficiency")
        if not 0 < self.memory_efficiency <= 1:
            raise InvalidInput("memory_efficiency must be in (0, 1]", field="cost_model.memory_efficiency")
        if not (self.launch_overhead_s >= 0 and math.isfinite(self.launch_overhead_s)):
            raise InvalidInput("launch_overhead_s must be >= 0", field="cost_model.launch_overhead_s")
        if self.launch not in LAUNCH_MODES:
            raise InvalidInput(f"launch must be one of {', '.join(LAUNCH_MODES)}", field="cost_model.launch")
        if not 0 < self.link_efficiency <= 1:
            raise InvalidInput("link_efficiency must be in (0, 1]", field="cost_model.link_efficiency")
        object.__setattr__(
            self, "device_overrides", {str(k): _checked_override(k, v) for k, v in self.device_overrides.items()}
        )
        for (dev, cls), m in self.device_class_multiplier.items():
            if cls not in OP_CLASS_NAMES:
                raise InvalidInput(
                    f"unknown op class {cls!r} in device_class_multiplier; use one of {', '.join(OP_CLASS_NAMES)}",
                    field="cost_model.device_class_multiplier",
                )
            if not (m > 0 and math.isfinite(m)):
                raise InvalidInput(
                    f"multiplier for ({dev!r}, {cls!r}) must be positive", field="cost_model.device_class_multiplier"
                )
        for cls, m in self.link_class_multiplier.items():
            if cls not in LINK_CLASS_NAMES:
                raise InvalidInput(
                    f"unknown link class {cls!r}; use one of {', '.join(LINK_CLASS_NAMES)}",
                    field="cost_model.link_class_multiplier",
                )
            if not (m > 0 and math.isfinite(m)):
                raise InvalidInput(
                    f"multiplier for link class {cls!r} must be positive", field="cost_model.link_class_multiplier"
                )

    def multiplier_matrix(self, inventory: Inventory) -> npt.NDArray[np.float64]:
        """``(n_devices, n_classes)`` calibration multipliers (1.0 where unset)."""
        out = np.ones((inventory.n_devices, len(OP_CLASS_NAMES)), dtype=np.float64)
        if not self.device_class_multiplier:
            return out
        col = {c: i for i, c in enumerate(OP_CLASS_NAMES)}
        names = inventory.device_names
        types = inventory.device_types
        # wildcard, then type, then name: the most specific entry wins
        for (dev, cls), m in self.device_class_multiplier.items():
            if dev == "*":
                out[:, col[cls]] = m
        for (dev, cls), m in self.device_class_multiplier.items():
            if dev != "*":
                out[types == dev, col[cls]] = m
        for (dev, cls), m in self.device_class_multiplier.items():
            if dev != "*":
                out[names == dev, col[cls]] = m
        return out

    def link_multipliers(self) -> npt.NDArray[np.float64]:
        """Multiplier per link class id (``LINK_LOCAL``, ``LINK_INTRA_GROUP``, ``LINK_INTER_GROUP``).

        Calibration's multiplier over the link efficiency: a link at 80% of its
        nominal bandwidth takes 1/0.8 of the nominal time.
        """
        return np.array(
            [self.link_class_multiplier.get(c, 1.0) / self.link_efficiency for c in LINK_CLASS_NAMES],
            dtype=np.float64,
        )

    def device_parameters(
        self, inventory: Inventory
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per device ``(efficiency (n_devices, n_classes), memory_efficiency, launch_overhead_s)``.

        The model's values, replaced where :attr:`device_overrides` names the device's
        type, then its name (the more specific wins).
        """
        n = inventory.n_devices
        eff = np.tile(np.asarray(self.efficiency, dtype=np.float64), (n, 1))
        mem = np.full(n, self.memory_efficiency, dtype=np.float64)
        launch = np.full(n, self.launch_overhead_s, dtype=np.float64)
        for column in (inventory.device_types, inventory.device_names):
            for key, o in self.device_overrides.items():
                rows = column == key
                if not rows.any():
                    continue
                if "efficiency" in o:
                    eff[rows] = np.asarray(o["efficiency"], dtype=np.float64)
                if "memory_efficiency" in o:
                    mem[rows] = o["memory_efficiency"]
                if "launch_overhead_s" in o:
                    launch[rows] = o["launch_overhead_s"]
        return eff, mem, launch


#: Where launch overhead is paid (:attr:`CostModel.launch`).
LAUNCH_MODES = ("single-controller", "per-device")
_OVERRIDE_KEYS = ("efficiency", "memory_efficiency", "launch_overhead_s")


def _checked_override(key: object, o: Mapping[str, Any]) -> dict[str, Any]:
    """One :attr:`CostModel.device_overrides` entry, checked like the model's own fields."""
    where = f"cost_model.device_overrides.{key}"
    if not isinstance(o, Mapping) or set(o) - set(_OVERRIDE_KEYS):
        raise InvalidInput(f"a device override may set {', '.join(_OVERRIDE_KEYS)}", field=where)
    out: dict[str, Any] = {}
    if "efficiency" in o:
        eff = tuple(float(e) for e in o["efficiency"])
        if len(eff) != len(OP_CLASS_NAMES) or not all(0 < e <= 1 for e in eff):
            raise InvalidInput("efficiencies must be in (0, 1], one per op class", field=f"{where}.efficiency")
        out["efficiency"] = eff
    if "memory_efficiency" in o:
        if not 0 < float(o["memory_efficiency"]) <= 1:
            raise InvalidInput("memory_efficiency must be in (0, 1]", field=f"{where}.memory_efficiency")
        out["memory_efficiency"] = float(o["memory_efficiency"])
    if "launch_overhead_s" in o:
        launch = float(o["launch_overhead_s"])
        if not (launch >= 0 and math.isfinite(launch)):
            raise InvalidInput("launch_overhead_s must be >= 0", field=f"{where}.launch_overhead_s")
        out["launch_overhead_s"] = launch
    return out


def _peak(inventory: Inventory, cost_model: CostModel) -> np.ndarray:
    dtype = timing_dtype(inventory, cost_model)
    peak = inventory.device_peak_flops_by_dtype.get(dtype)
    if peak is None or np.isnan(peak).any():
        have = ", ".join(sorted(inventory.device_peak_flops_by_dtype))
        raise InvalidInput(
            f"not every device publishes a peak for dtype {dtype!r} (known dtypes: {have})",
            field="cost_model.dtype",
        )
    if dtype == inventory.default_dtype:
        return inventory.device_peak_flops  # carries with_device_speed scaling
    return peak


#: Tensor dtype names (ONNX's, lower-case, as ingestion keeps them, and the short ones a
#: JSON graph may use) -> the name a device's peak FLOP/s goes by.
_PEAK_NAME_OF_TENSOR_DTYPE = {
    "float32": "fp32",
    "fp32": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float64": "fp64",
    "fp64": "fp64",
    "float8e4m3fn": "fp8",
    "float8e4m3fnuz": "fp8",
    "float8e5m2": "fp8",
    "float8e5m2fnuz": "fp8",
    "fp8": "fp8",
}


def timing_dtype(inventory: Inventory, cost_model: CostModel | None = None) -> str:
    """The dtype whose peak FLOP/s times every operator: the cost model's, else the inventory's default."""
    return (cost_model.dtype if cost_model is not None else None) or inventory.default_dtype


def timing_dtype_note(graph: Hypergraph, inventory: Inventory, cost_model: CostModel | None = None) -> str | None:
    """A plan note when most of the graph's floating-point bytes are of another dtype than the one timing it.

    Every operator is timed at one peak (:func:`timing_dtype`), as if a compiler lowered
    the graph to that precision; an fp32 export run as exported on an H100 computes at
    its TF32 or FP32 peak, 2x and 15x below the BF16 one the presets time with. Returns
    None when the graph declares no floating-point dtypes, or when the dtype holding the
    most bytes is the timing one (fp32 tensors timed at the ``tf32`` peak count as such).
    """
    if not graph.tensor_dtypes:
        return None
    # one lookup per distinct dtype name, as op_class_of does for operator types (None: undeclared)
    declared, of_tensor = np.unique(np.asarray(graph.tensor_dtypes, dtype=object).astype(str), return_inverse=True)
    peak_name = np.array([_PEAK_NAME_OF_TENSOR_DTYPE.get(d.lower(), "") for d in declared.tolist()], dtype=object)
    names, name_of_declared = np.unique(peak_name.astype(str), return_inverse=True)
    bytes_by_name = np.bincount(
        name_of_declared.reshape(-1)[of_tensor.reshape(-1)], weights=graph.tensor_bytes, minlength=names.size
    )
    bytes_by_name[names == ""] = 0.0  # integers, booleans, undeclared
    total = float(bytes_by_name.sum())
    if total <= 0.0:
        return None
    dominant = str(names[int(np.argmax(bytes_by_name))])
    timing = timing_dtype(inventory, cost_model)
    if dominant == timing or (dominant == "fp32" and timing == "tf32"):
        return None
    share = float(bytes_by_name.max()) / total
    published = sorted(k for k, v in inventory.device_peak_flops_by_dtype.items() if not np.isnan(v).any())
    options = [k for k in ([dominant, "tf32"] if dominant == "fp32" else [dominant]) if k in published]
    advice = (
        f"set the inventory's default_dtype to {' or '.join(repr(k) for k in options)} to time it as it runs"
        if options
        else f"its devices publish no {dominant} peak"
    )
    whose = " (the inventory's default_dtype)" if timing == inventory.default_dtype else ""
    return (
        f"operators are timed at the {timing} peak{whose}, as if compiled to {timing}; {share:.0%} of the bytes "
        f"of the graph's tensors that declare a floating-point dtype are {dominant}: a runtime that computes in "
        f"{dominant} is slower than predicted ({advice})"
    )


def node_time_columns(graph: Hypergraph, inventory: Inventory) -> npt.NDArray[np.int64]:
    """Per device, the column of ``graph.op_time_s`` keyed by its type, or -1.

    See :func:`node_times_for`: an operator without a time for the device's type
    falls back to its ``"*"`` column (a node's plain number).
    """
    cols = np.full(inventory.n_devices, -1, dtype=np.int64)
    if graph.op_time_s is None:
        return cols
    for j, key in enumerate(graph.op_time_keys):
        if key != "*":
            cols[inventory.device_types == key] = j
    return cols


def node_times_for(graph: Hypergraph, type_column: int) -> npt.NDArray[np.float64]:
    """Every operator's own time on a device whose type has column ``type_column`` (-1: none).

    The type's time where the node gives one, else the node's plain number, else NaN
    (the roofline times it).
    """
    out = np.full(graph.n_ops, np.nan, dtype=np.float64)
    if graph.op_time_s is None:
        return out
    if "*" in graph.op_time_keys:
        out[:] = graph.op_time_s[:, graph.op_time_keys.index("*")]
    if type_column >= 0:
        typed = graph.op_time_s[:, type_column]
        np.copyto(out, typed, where=~np.isnan(typed))
    return out


def op_times_by_profile_s(
    graph: Hypergraph, inventory: Inventory, cost_model: CostModel | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Operator times per *device profile*: ``(times (n_ops, n_profiles), device_profile (n_devices,))``.

    Devices with identical peak, memory bandwidth, calibration row, cost-model
    overrides and node-time column share a profile, so a 16-GPU DGX pair costs one
    column instead of 16: ``times[:, device_profile[d]]`` is the time of every op on
    device ``d``. Use this for 10^6-operator graphs on large clusters (memory
    ``n_ops x n_profiles``). An operator with a node time (``graph.op_time_s``, not
    NaN, in the column that applies to the device) takes it instead of its roofline
    and calibration, plus the launch overhead.
    """
    cm = cost_model or CostModel()
    peak = _peak(inventory, cm)
    mem_bw = inventory.device_memory_bandwidth_bytes_per_s
    mult = cm.multiplier_matrix(inventory)
    d_eff, d_mem, d_launch = cm.device_parameters(inventory)
    node_cols = node_time_columns(graph, inventory)
    signature = np.column_stack([peak, mem_bw, d_mem, d_launch, node_cols, mult, d_eff])
    profiles, device_profile = np.unique(signature, axis=0, return_inverse=True)
    device_profile = device_profile.reshape(-1).astype(np.int64)
    n_cls = len(OP_CLASS_NAMES)

    type_classes, type_views, type_of_op = _type_table(graph.op_types)
    classes = type_classes[type_of_op]
    flops = graph.op_flops
    # a view's output is its input's buffer: it reads and writes nothing
    touched = np.where(type_views[type_of_op], 0.0, graph.op_input_bytes() + graph.op_output_bytes())
    times = np.empty((graph.n_ops, profiles.shape[0]), dtype=np.float64)
    for p in range(profiles.shape[0]):
        p_peak, p_bw, p_mem, p_launch, p_col = profiles[p, :5]
        p_mult = profiles[p, 5 : 5 + n_cls][classes]
        eff = profiles[p, 5 + n_cls :][classes]
        compute = flops / (p_peak * eff)
        memory = touched / (p_bw * p_mem)
        np.maximum(compute, memory, out=times[:, p])
        times[:, p] *= p_mult
        if graph.op_time_s is not None:
            given = node_times_for(graph, int(p_col))
            np.copyto(times[:, p], given, where=~np.isnan(given))
        times[:, p] += p_launch
    return times, device_profile


#: How an operator was timed, in precedence order (:func:`cost_sources`).
COST_SOURCES = ("node_time_s", "calibration", "roofline")


def cost_sources(
    graph: Hypergraph, inventory: Inventory, cost_model: CostModel, placement: np.ndarray
) -> dict[str, int]:
    """How many operators were timed each way on their placed devices.

    ``node_time_s``: the node's own time for that device's type (or for every
    device); else ``calibration``: a calibration multiplier other than 1 applies to
    its class on that device; else ``roofline``: the profile's roofline formula.
    Every operator counts once; the counts add up to ``graph.n_ops``.
    """
    placement = np.asarray(placement, dtype=np.int64)
    given = np.zeros(graph.n_ops, dtype=bool)
    if graph.op_time_s is not None:
        cols = node_time_columns(graph, inventory)[placement]
        for col in np.unique(cols).tolist():
            on = cols == col
            given[on] = ~np.isnan(node_times_for(graph, col)[on])
    mult = cost_model.multiplier_matrix(inventory)[placement, op_class_of(graph.op_types)]
    calibrated = ~given & (mult != 1.0)
    n_given, n_cal = int(given.sum()), int(calibrated.sum())
    return {"node_time_s": n_given, "calibration": n_cal, "roofline": graph.n_ops - n_given - n_cal}


def op_times_s(graph: Hypergraph, inventory: Inventory, cost_model: CostModel | None = None) -> npt.NDArray[np.float64]:
    """Roofline time of every operator on every device, shape ``(n_ops, n_devices)``.

    ``max(flops / (peak * eff_class), (input + output bytes) / (bw * eff_mem))``
    times the calibration multiplier, plus the launch overhead (module docstring); a
    view operator touches no bytes.
    10^6 operators x 16 devices is 128 MB; for larger clusters use
    :func:`op_times_by_profile_s`.

    Parameters
    ----------
    graph : Hypergraph
    inventory : Inventory
    cost_model : CostModel, optional

    Returns
    -------
    numpy.ndarray of float64, shape (n_ops, n_devices)

    Raises
    ------
    InvalidInput
        The cost model's dtype has no published peak on some device.
    """
    times, device_profile = op_times_by_profile_s(graph, inventory, cost_model)
    return np.ascontiguousarray(times[:, device_profile])


def link_time_tables(
    inventory: Inventory, cost_model: CostModel | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per device pair ``(latency_s, seconds_per_byte)``, each ``(n_devices, n_devices)``.

    Diagonal is zero (same device). Includes link-class calibration multipliers.
    Meant for small and mid-size clusters (the simulator uses it up to 4096 devices).
    """
    cm = cost_model or CostModel()
    n = inventory.n_devices
    grp = inventory.device_group
    same = grp[:, None] == grp[None, :]
    if inventory.bandwidth_matrix_bytes_per_s is not None:
        bw = inventory.bandwidth_matrix_bytes_per_s.copy()
        if inventory.latency_matrix_s is not None:
            lat = inventory.latency_matrix_s.copy()
        else:
            lat = np.where(same, inventory.group_link_latency_s[grp][:, None], inventory.inter_link.latency_s)
    else:
        bw = np.where(
            same, inventory.group_link_bandwidth_bytes_per_s[grp][:, None], inventory.inter_link.bandwidth_bytes_per_s
        )
        lat = np.where(same, inventory.group_link_latency_s[grp][:, None], inventory.inter_link.latency_s)
    mult = cm.link_multipliers()[np.where(same, LINK_INTRA_GROUP, LINK_INTER_GROUP)]
    eye = np.eye(n, dtype=bool)
    # a bandwidth matrix may hold 0 on its diagonal (no link to itself): never divided by
    per_byte = np.divide(mult, bw, out=np.zeros_like(mult, dtype=np.float64), where=~eye)
    lat = lat * mult
    lat[eye] = 0.0
    return lat.astype(np.float64), per_byte.astype(np.float64)


def transfer_time_s(
    n_bytes: float,
    inventory: Inventory,
    src: int | str,
    dst: int | str,
    cost_model: CostModel | None = None,
) -> float:
    """Uncontended point-to-point time ``alpha + n / bandwidth`` on the pair's link.

    Zero for the same device or for zero bytes; scaled by the link class's
    calibration multiplier.
    """
    s = device_index(inventory, src)
    d = device_index(inventory, dst)
    if s == d or n_bytes <= 0:
        return 0.0
    cm = cost_model or CostModel()
    cls = int(link_class_ids(inventory, np.array([s]), np.array([d]))[0])
    return p2p_time_s(n_bytes, link_between(inventory, s, d)) * float(cm.link_multipliers()[cls])


def transfer_times_s(
    n_bytes: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    inventory: Inventory,
    cost_model: CostModel | None = None,
) -> npt.NDArray[np.float64]:
    """Vectorised :func:`transfer_time_s` over arrays of sizes and device ids."""
    cm = cost_model or CostModel()
    n_bytes = np.asarray(n_bytes, dtype=np.float64)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    cls = link_class_ids(inventory, src, dst)
    out: npt.NDArray[np.float64]
    if inventory.bandwidth_matrix_bytes_per_s is not None:
        lat_t, per_byte_t = link_time_tables(inventory, cm)
        out = lat_t[src, dst] + n_bytes * per_byte_t[src, dst]
    else:
        grp = inventory.device_group
        intra = cls == LINK_INTRA_GROUP
        bw = np.where(
            intra, inventory.group_link_bandwidth_bytes_per_s[grp[src]], inventory.inter_link.bandwidth_bytes_per_s
        )
        lat = np.where(intra, inventory.group_link_latency_s[grp[src]], inventory.inter_link.latency_s)
        out = (lat + n_bytes / bw) * cm.link_multipliers()[cls]
    out[(cls == LINK_LOCAL) | (n_bytes <= 0)] = 0.0
    return out


_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall")


def collective_time_s(
    kind: str,
    n_bytes: float,
    inventory: Inventory,
    devices: Sequence[int | str] | np.ndarray,
    cost_model: CostModel | None = None,
    algorithm: str = "ring",
) -> float:
    """Time of a collective over ``devices``, hierarchical when they span several groups.

    ``n_bytes`` is the per-rank buffer for all-reduce and all-to-all and the gathered
    total for all-gather / reduce-scatter (as in :mod:`partitioners.hardware.collectives`).

    * One group: the flat ring/tree formula on that group's link [1]_ of
      :mod:`partitioners.hardware.collectives`.
    * Several groups with ``r`` ranks in the largest group and ``g`` groups:
      all-reduce = reduce-scatter inside groups, all-reduce of the ``1/r`` shard
      across groups on ``r`` parallel rails, all-gather inside groups
      (:func:`~partitioners.hardware.collectives.hierarchical_allreduce_time_s`);
      all-gather = all-gather of each rail's ``n/r`` across groups then of ``n``
      inside groups (reduce-scatter is its mirror, same cost); all-to-all = the
      intra-group share ``(r-1)/p`` of each rank's buffer on the fast fabric plus the
      inter-group share ``(p-r)/p`` on its NIC rail, run concurrently, so the slower
      of the two.

    The slowest intra-group link among the spanned groups is used (a ring runs at
    its slowest hop). Link-class calibration multipliers apply per level.

    Raises
    ------
    InvalidInput
        Unknown ``kind`` or device.
    """
    if kind not in _COLLECTIVES:
        raise InvalidInput(f"unknown collective {kind!r}; use one of {', '.join(_COLLECTIVES)}", field="kind")
    cm = cost_model or CostModel()
    ids = np.unique(np.array([device_index(inventory, d) for d in devices], dtype=np.int64))
    p = int(ids.size)
    if p <= 1 or n_bytes <= 0:
        return 0.0
    lm = cm.link_multipliers()
    groups, counts = np.unique(inventory.device_group[ids], return_counts=True)
    intra_bw = float(inventory.group_link_bandwidth_bytes_per_s[groups].min())
    intra_lat = float(inventory.group_link_latency_s[groups].max())
    intra = LinkSpec(intra_bw / lm[LINK_INTRA_GROUP], intra_lat * lm[LINK_INTRA_GROUP])
    inter = LinkSpec(
        inventory.inter_link.bandwidth_bytes_per_s / lm[LINK_INTER_GROUP],
        inventory.inter_link.latency_s * lm[LINK_INTER_GROUP],
    )
    g = int(groups.size)
    r = int(counts.max())
    if g == 1:
        if kind == "allreduce":
            return allreduce_time_s(n_bytes, p, intra, algorithm)
        if kind == "alltoall":
            return alltoall_time_s(n_bytes, p, intra)
        return allgather_time_s(n_bytes, p, intra)
    if kind == "allreduce":
        return hierarchical_allreduce_time_s(n_bytes, r, g, intra, inter, algorithm)
    if kind in ("allgather", "reduce_scatter"):
        return hierarchical_allgather_time_s(n_bytes, r, g, intra, inter)
    # all-to-all over the actual rank count p (groups may be unevenly filled)
    inside = (r - 1) * intra.latency_s + (r - 1) / p * n_bytes / intra.bandwidth_bytes_per_s if r > 1 else 0.0
    outside = (p - r) * inter.latency_s + (p - r) / p * n_bytes / inter.bandwidth_bytes_per_s
    return max(inside, outside)


def cost_model_to_json(cost_model: CostModel) -> dict[str, Any]:
    """Plain-JSON form of a cost model (stored with calibrated plans, echoed in plan summaries).

    ``device_class_multiplier`` becomes ``{device: {op class: multiplier}}``;
    efficiencies (the model's and each device override's) are keyed by op class.
    """
    nested: dict[str, dict[str, float]] = {}
    for (dev, cls), m in sorted(cost_model.device_class_multiplier.items()):
        nested.setdefault(dev, {})[cls] = m
    overrides: dict[str, dict[str, Any]] = {}
    for key, o in sorted(cost_model.device_overrides.items()):
        doc = dict(o)
        if "efficiency" in doc:
            doc["efficiency"] = dict(zip(OP_CLASS_NAMES, doc["efficiency"]))
        overrides[key] = doc
    return {
        "profile": cost_model.profile,
        "launch": cost_model.launch,
        "dtype": cost_model.dtype,
        "efficiency": dict(zip(OP_CLASS_NAMES, cost_model.efficiency)),
        "memory_efficiency": cost_model.memory_efficiency,
        "link_efficiency": cost_model.link_efficiency,
        "launch_overhead_s": cost_model.launch_overhead_s,
        "device_overrides": overrides,
        "device_class_multiplier": nested,
        "link_class_multiplier": dict(sorted(cost_model.link_class_multiplier.items())),
    }


def _efficiency_tuple(doc: Any, base: Sequence[float], where: str) -> tuple[float, ...]:
    """Efficiencies keyed by op class over ``base`` (the classes left out keep theirs)."""
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{where} must map op class -> fraction", field=where)
    eff = list(base)
    for cls, v in doc.items():
        if cls not in OP_CLASS_NAMES:
            raise InvalidInput(f"unknown op class {cls!r}; use one of {', '.join(OP_CLASS_NAMES)}", field=where)
        eff[OP_CLASS_NAMES.index(cls)] = v
    return tuple(eff)


def cost_model_from_json(doc: Mapping[str, Any]) -> CostModel:
    """Inverse of :func:`cost_model_to_json`; missing keys take the defaults.

    Raises
    ------
    InvalidInput
        Unknown op or link class, out-of-range efficiency, non-positive multiplier,
        naming the field (``cost_model.<key>``).
    """
    if not isinstance(doc, Mapping):
        raise InvalidInput("cost_model must be an object", field="cost_model")
    unknown = set(doc) - {
        "profile",
        "launch",
        "dtype",
        "efficiency",
        "memory_efficiency",
        "link_efficiency",
        "launch_overhead_s",
        "device_overrides",
        "device_class_multiplier",
        "link_class_multiplier",
    }
    if unknown:
        raise InvalidInput(f"unknown cost model keys: {', '.join(sorted(unknown))}", field="cost_model")
    default = CostModel()
    eff = _efficiency_tuple(doc.get("efficiency", {}), default.efficiency, "cost_model.efficiency")
    dcm_doc = doc.get("device_class_multiplier", {})
    if not isinstance(dcm_doc, Mapping) or not all(isinstance(v, Mapping) for v in dcm_doc.values()):
        raise InvalidInput(
            "cost_model.device_class_multiplier must map device -> {op class: multiplier}",
            field="cost_model.device_class_multiplier",
        )
    over_doc = doc.get("device_overrides", {})
    if not isinstance(over_doc, Mapping) or not all(isinstance(v, Mapping) for v in over_doc.values()):
        raise InvalidInput(
            "cost_model.device_overrides must map device -> overrides", field="cost_model.device_overrides"
        )
    overrides = {
        key: {
            **o,
            **(
                {"efficiency": _efficiency_tuple(o["efficiency"], eff, f"cost_model.device_overrides.{key}.efficiency")}
                if "efficiency" in o
                else {}
            ),
        }
        for key, o in over_doc.items()
    }
    try:
        return CostModel(
            dtype=doc.get("dtype"),
            efficiency=eff,
            memory_efficiency=doc.get("memory_efficiency", default.memory_efficiency),
            launch_overhead_s=doc.get("launch_overhead_s", default.launch_overhead_s),
            device_class_multiplier={(d, c): m for d, row in dcm_doc.items() for c, m in row.items()},
            link_class_multiplier=dict(doc.get("link_class_multiplier", {})),
            profile=str(doc.get("profile", default.profile)),
            launch=doc.get("launch", default.launch),
            link_efficiency=doc.get("link_efficiency", default.link_efficiency),
            device_overrides=overrides,
        )
    except TypeError as exc:
        raise InvalidInput(f"cost model values must be numbers ({exc})", field="cost_model") from None
