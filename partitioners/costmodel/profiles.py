"""Named cost-model profiles and the spec a caller sends: :class:`CostModelSpec` -> :class:`CostModel`.

Which cost model is right only hardware can say, so the model is an input. A
caller names a *profile* (a coherent set of parameters with its sources) and may
override any parameter; :func:`resolve_cost_model` gives the
:class:`~partitioners.costmodel.costs.CostModel` that times the plan, and a plan
echoes it (``summary.cost_model``).

Profiles
--------
``roofline``
    Peak compute and bandwidth, no launch overhead, every efficiency 1: the model
    partitioner papers and baselines use (e.g. the roofline [1]_), so plans can be
    compared on equal terms with them.
``eager`` (the default)
    A runtime that launches every operator as its own kernel from the host, as
    PyTorch eager and ONNX Runtime's CUDA execution provider do: ~5 us per launch
    [4]_, achievable efficiencies from published measurements (GEMM 0.75 [2]_,
    attention 0.6 [3]_, convolution 0.5 [5]_, streaming memory 0.8 [6]_), links at
    nominal bandwidth. It is the model this service has always used, under a name
    that says what it stands for; it stays the default because a graph exported
    from a framework runs this way unless its compiler says otherwise.
``cuda-graphs``
    A compiled runtime that captures the step once and replays it as CUDA graphs
    (``torch.compile(mode="reduce-overhead")``, TensorRT, ONNX Runtime's
    ``enable_cuda_graph``): the host issues one graph launch per device and step,
    and each kernel node costs ~0.5 us on the device [7]_. Efficiencies as ``eager``;
    launches ``per-device`` (the device, not one host thread, pays them).

Launch modes
------------
``single-controller``: one host thread issues every device's kernels, so launches
of all devices serialise on the host: spreading 3,000 tiny operators over 16 GPUs
does not parallelise their launches (PyTorch and ONNX Runtime driving several GPUs
from one process do this [8]_ [9]_; the default). ``per-device``: one process (or
a captured graph) per device, launches per device in parallel.
:mod:`partitioners.costmodel.simulator` models both.

References
----------
.. [1] S. Williams, A. Waterman, D. Patterson, "Roofline: an insightful visual
   performance model for multicore architectures", CACM 52(4), 2009.
.. [2] NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning
   Performance docs, 2023): large GEMMs reach 70-80% of tensor-core peak.
.. [3] T. Dao, "FlashAttention-2", 2023: 50-73% of peak on A100 forward;
   J. Shah et al., "FlashAttention-3", 2024: up to 75% on H100.
.. [4] Y. Zhang et al., "Understanding the Overheads of Launching CUDA Kernels",
   ICPP poster 2019, and NVIDIA's CUDA C++ Best Practices Guide: ~5 us per launch.
.. [5] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
   Clusters Using Megatron-LM", SC 2021: 52% of peak end to end on A100.
.. [6] Z. Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
   Microbenchmarking", 2018: streaming kernels reach ~80-90% of HBM bandwidth.
.. [7] A. Gray, "Getting Started with CUDA Graphs", NVIDIA Technical Blog, 2019:
   20 short kernels (2.9 us each) take 3.8 us per kernel launched one by one on a
   stream and 3.4 us per kernel launched as one graph: ~0.5 us per kernel node.
.. [8] PyTorch, "CUDA semantics" (docs): operations are queued on each device's
   stream by the calling host thread; one Python thread drives every device of a
   process.
.. [9] ONNX Runtime, "Threading" (docs): ``execution_mode`` defaults to
   ``ORT_SEQUENTIAL``, one thread issuing the graph's nodes in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from partitioners.costmodel.costs import LAUNCH_MODES, OP_CLASS_NAMES, CostModel
from partitioners.errors import InvalidInput
from partitioners.hardware.inventory import Inventory

__all__ = [
    "DEFAULT_PROFILE",
    "MAX_LAUNCH_OVERHEAD_S",
    "MIN_EFFICIENCY",
    "PROFILES",
    "PROFILE_NAMES",
    "SPEC_KEYS",
    "CostModelSpec",
    "cost_model_spec_from_json",
    "resolve_cost_model",
]

# compute efficiency per op class (OP_CLASS_NAMES order): matmul 0.75 [2]; conv 0.5 [5];
# attention 0.6 [3]; norm, elementwise, reduction, data movement are memory bound, so
# their compute efficiency hardly matters: 0.3 keeps a FLOP-heavy elementwise op (an
# erf-based GELU) from looking free; other 0.5.
_MEASURED_EFFICIENCY = (0.75, 0.5, 0.6, 0.3, 0.3, 0.3, 0.3, 0.5)

#: Every named profile: peak-only ``roofline``, launch-per-kernel ``eager``, captured ``cuda-graphs``.
PROFILES: dict[str, CostModel] = {
    "roofline": CostModel(
        efficiency=(1.0,) * len(OP_CLASS_NAMES),
        memory_efficiency=1.0,
        launch_overhead_s=0.0,  # [1]: peak compute and bandwidth only
        profile="roofline",
        launch="per-device",  # no launch cost to place
        link_efficiency=1.0,
    ),
    "eager": CostModel(
        efficiency=_MEASURED_EFFICIENCY,
        memory_efficiency=0.8,  # [6]
        launch_overhead_s=5e-6,  # [4]
        profile="eager",
        launch="single-controller",  # [8] [9]
        link_efficiency=1.0,
    ),
    "cuda-graphs": CostModel(
        efficiency=_MEASURED_EFFICIENCY,
        memory_efficiency=0.8,  # [6]
        launch_overhead_s=0.5e-6,  # [7]
        profile="cuda-graphs",
        launch="per-device",  # one graph launch per device and step [7]
        link_efficiency=1.0,
    ),
}
PROFILE_NAMES = tuple(PROFILES)
#: The profile a plan is timed with when the request names none.
DEFAULT_PROFILE = "eager"
#: Lowest efficiency a caller may set: 0.1% of peak. Lower is a unit mistake, and a
#: fraction near zero would make operator times overflow to infinity.
MIN_EFFICIENCY = 1e-3
#: Longest launch overhead a caller may set: a second (a CUDA launch takes microseconds).
MAX_LAUNCH_OVERHEAD_S = 1.0
#: What a spec (``options.cost_model``, an inventory device's ``cost_model``) may set.
SPEC_KEYS = ("profile", "launch_overhead_s", "compute_efficiency", "memory_efficiency", "link_efficiency", "launch")
#: What a device's or group's ``cost_model`` in an inventory may set (properties of a device).
DEVICE_SPEC_KEYS = ("launch_overhead_s", "compute_efficiency", "memory_efficiency")


@dataclass(frozen=True)
class CostModelSpec:
    """What a caller asks of the cost model: a profile, and parameters that override it.

    Attributes
    ----------
    profile : str
        One of :data:`PROFILE_NAMES`.
    launch_overhead_s : float or None
        Seconds per operator launch (>= 0).
    compute_efficiency : tuple of (op class, fraction) pairs
        Achievable fraction of peak per op class
        (:data:`~partitioners.costmodel.costs.OP_CLASS_NAMES`, in
        [:data:`MIN_EFFICIENCY`, 1]); classes
        left out keep the profile's.
    memory_efficiency, link_efficiency : float or None
        Achievable fraction of memory and link bandwidth, in [:data:`MIN_EFFICIENCY`, 1].
    launch : {"single-controller", "per-device"} or None
        Who pays launches (module docstring).
    """

    profile: str = DEFAULT_PROFILE
    launch_overhead_s: float | None = None
    compute_efficiency: tuple[tuple[str, float], ...] = field(default=())
    memory_efficiency: float | None = None
    link_efficiency: float | None = None
    launch: str | None = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise InvalidInput(
                f"unknown cost model profile {self.profile!r}; use one of {', '.join(PROFILE_NAMES)}",
                field="options.cost_model.profile",
            )
        _check_parameters(
            "options.cost_model",
            self.launch_overhead_s,
            self.compute_efficiency,
            self.memory_efficiency,
        )
        if self.link_efficiency is not None and not (MIN_EFFICIENCY <= self.link_efficiency <= 1):
            raise InvalidInput(
                f"link_efficiency must be in [{MIN_EFFICIENCY:g}, 1]", field="options.cost_model.link_efficiency"
            )
        if self.launch is not None and self.launch not in LAUNCH_MODES:
            raise InvalidInput(f"launch must be one of {', '.join(LAUNCH_MODES)}", field="options.cost_model.launch")
        object.__setattr__(
            self, "compute_efficiency", tuple(sorted((str(c), float(e)) for c, e in self.compute_efficiency))
        )


def _check_parameters(
    where: str,
    launch_overhead_s: float | None,
    compute_efficiency: tuple[tuple[str, float], ...],
    memory_efficiency: float | None,
) -> None:
    if launch_overhead_s is not None and not (0 <= launch_overhead_s <= MAX_LAUNCH_OVERHEAD_S):
        raise InvalidInput(
            f"launch_overhead_s must be from 0 to {MAX_LAUNCH_OVERHEAD_S:g} s", field=f"{where}.launch_overhead_s"
        )
    for cls, eff in compute_efficiency:
        if cls not in OP_CLASS_NAMES:
            raise InvalidInput(
                f"unknown op class {cls!r}; use one of {', '.join(OP_CLASS_NAMES)}",
                field=f"{where}.compute_efficiency",
            )
        if not MIN_EFFICIENCY <= eff <= 1:
            raise InvalidInput(
                f"compute efficiency of {cls!r} must be in [{MIN_EFFICIENCY:g}, 1]",
                field=f"{where}.compute_efficiency.{cls}",
            )
    if memory_efficiency is not None and not (MIN_EFFICIENCY <= memory_efficiency <= 1):
        raise InvalidInput(f"memory_efficiency must be in [{MIN_EFFICIENCY:g}, 1]", field=f"{where}.memory_efficiency")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{where} must be a number", field=where)
    return float(value)


def _efficiency_pairs(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where} must map op class -> fraction of peak", field=where)
    return tuple((str(c), _number(e, f"{where}.{c}")) for c, e in value.items())


def cost_model_spec_from_json(doc: Mapping[str, Any] | str | None) -> CostModelSpec:
    """A spec from its JSON form: a profile name, or ``{"profile"?, parameters...}``; None is the default.

    Raises
    ------
    InvalidInput
        An unknown key or profile, a parameter out of range, naming the field.
    """
    if doc is None:
        return CostModelSpec()
    if isinstance(doc, str):
        return CostModelSpec(profile=doc)
    if not isinstance(doc, Mapping):
        raise InvalidInput("cost_model must be a profile name or an object", field="options.cost_model")
    unknown = sorted(set(doc) - set(SPEC_KEYS))
    if unknown:
        raise InvalidInput(
            f"unknown cost_model field {unknown[0]!r}; the fields are {', '.join(SPEC_KEYS)}",
            field=f"options.cost_model.{unknown[0]}",
        )
    where = "options.cost_model"

    def opt(key: str) -> float | None:
        return None if doc.get(key) is None else _number(doc[key], f"{where}.{key}")

    return CostModelSpec(
        profile=str(doc.get("profile") or DEFAULT_PROFILE),
        launch_overhead_s=opt("launch_overhead_s"),
        compute_efficiency=_efficiency_pairs(doc.get("compute_efficiency") or {}, f"{where}.compute_efficiency"),
        memory_efficiency=opt("memory_efficiency"),
        link_efficiency=opt("link_efficiency"),
        launch=doc.get("launch"),
    )


def device_overrides_of(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """The inventory's per-device ``cost_model`` entries as :attr:`CostModel.device_overrides` (by device name).

    Raises
    ------
    InvalidInput
        An unknown key or a value out of range, naming the device.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, doc in inventory.device_cost_model.items():
        where = f"inventory.devices.{name}.cost_model"
        unknown = sorted(set(doc) - set(DEVICE_SPEC_KEYS))
        if unknown:
            raise InvalidInput(
                f"unknown cost_model field {unknown[0]!r} for a device; the fields are {', '.join(DEVICE_SPEC_KEYS)}",
                field=f"{where}.{unknown[0]}",
            )
        entry: dict[str, Any] = {}
        if doc.get("launch_overhead_s") is not None:
            entry["launch_overhead_s"] = _number(doc["launch_overhead_s"], f"{where}.launch_overhead_s")
        if doc.get("memory_efficiency") is not None:
            entry["memory_efficiency"] = _number(doc["memory_efficiency"], f"{where}.memory_efficiency")
        pairs = _efficiency_pairs(doc.get("compute_efficiency") or {}, f"{where}.compute_efficiency")
        _check_parameters(where, entry.get("launch_overhead_s"), pairs, entry.get("memory_efficiency"))
        if pairs:
            entry["efficiency"] = dict(pairs)
        out[name] = entry
    return out


def resolve_cost_model(spec: CostModelSpec | None = None, inventory: Inventory | None = None) -> CostModel:
    """The :class:`CostModel` a spec stands for: its profile, overridden by its parameters, then
    by the inventory's per-device ``cost_model`` entries where devices differ.

    Parameters
    ----------
    spec : CostModelSpec, optional
        Defaults to the :data:`DEFAULT_PROFILE`.
    inventory : Inventory, optional
        Its devices' ``cost_model`` entries become per-device overrides.

    Returns
    -------
    CostModel
    """
    spec = spec or CostModelSpec()
    base = PROFILES[spec.profile]
    eff = list(base.efficiency)
    for cls, e in spec.compute_efficiency:
        eff[OP_CLASS_NAMES.index(cls)] = e
    model = replace(
        base,
        efficiency=tuple(eff),
        launch_overhead_s=base.launch_overhead_s if spec.launch_overhead_s is None else spec.launch_overhead_s,
        memory_efficiency=base.memory_efficiency if spec.memory_efficiency is None else spec.memory_efficiency,
        link_efficiency=base.link_efficiency if spec.link_efficiency is None else spec.link_efficiency,
        launch=base.launch if spec.launch is None else spec.launch,
    )
    if inventory is None or not inventory.device_cost_model:
        return model
    overrides: dict[str, dict[str, Any]] = {}
    for name, entry in device_overrides_of(inventory).items():
        o = dict(entry)
        if "efficiency" in o:
            row = list(model.efficiency)
            for cls, e in o["efficiency"].items():
                row[OP_CLASS_NAMES.index(cls)] = e
            o["efficiency"] = tuple(row)
        overrides[name] = o
    return replace(model, device_overrides=overrides)
