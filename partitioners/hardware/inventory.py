"""The cluster a plan runs on: groups -> devices -> memory tiers, and the links between.

The hierarchy follows DESIGN.md: *groups* are the units joined by slow links (DGX
nodes, NVLink domains, racks); *devices* inside a group share a fast fabric
(NVSwitch, HCCS, PCIe); each device has *memory tiers* ordered outermost first
(tier 0 is the device's main memory: HBM, or GDDR on workstation cards; then L2,
then shared memory / SRAM).

Everything that scales with the device count is a numpy array so a 4096-node
cluster is a few arrays, not 32768 objects. Links are described per *link class*
(one :class:`~partitioners.hardware.collectives.LinkSpec` inside each group, one between
groups), which is how the fabrics are built: every GPU in an NVSwitch domain can
drive the same per-direction bandwidth to any peer, and every GPU owns one NIC rail
to the rest of the cluster. A full ``device x device`` bandwidth matrix may be given
instead for irregular topologies (small clusters only).

The presets (:data:`PRESETS`) are nodes of :mod:`partitioners.hardware.catalogue`, which holds
every GPU and node figure once, with its source; the 3D planner reads the same catalogue.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.hardware.catalogue import NODES as CATALOGUE_NODES
from partitioners.hardware.catalogue import Accelerator, Node
from partitioners.hardware.collectives import LinkSpec

__all__ = [
    "DEFAULT_DTYPE",
    "MAX_NODES",
    "MAX_DEVICES",
    "PLACEMENT_PRESET_NAMES",
    "PRESETS",
    "Inventory",
    "inventory_from_json",
    "inventory_to_json",
    "inventory_hash",
    "preset_inventory",
    "link_between",
    "link_class",
    "LINK_CLASS_NAMES",
    "LINK_LOCAL",
    "LINK_INTRA_GROUP",
    "LINK_INTER_GROUP",
    "link_class_ids",
    "device_index",
    "without_devices",
    "with_device_speed",
    "PEAK_FLOPS_RANGE",
    "BANDWIDTH_RANGE_BYTES_PER_S",
    "LATENCY_RANGE_S",
    "CAPACITY_RANGE_BYTES",
    "within",
]

#: The dtype whose peak FLOP/s ``device_peak_flops`` holds and the cost model uses.
DEFAULT_DTYPE = "bf16"
#: Upper bound on ``nodes`` in a preset request (the size of the largest public
#: training clusters, ~32k GPUs, in 8-GPU nodes).
MAX_NODES = 4096
#: Upper bound on devices in one inventory (4096 GB200 NVL72 racks would be 294912).
MAX_DEVICES = 300_000

#: Link classes, as small ints in arrays and as names in reports.
LINK_LOCAL = 0
LINK_INTRA_GROUP = 1
LINK_INTER_GROUP = 2
LINK_CLASS_NAMES: tuple[str, ...] = ("local", "intra-group", "inter-group")

_LOCAL_LINK = LinkSpec(bandwidth_bytes_per_s=math.inf, latency_s=0.0)


@dataclass(frozen=True, eq=False)
class Inventory:
    """A cluster as arrays: groups, devices, memory tiers, link classes.

    Attributes
    ----------
    name : str
    default_dtype : str
        Dtype whose peak ``device_peak_flops`` holds (``"bf16"`` unless the JSON says).
    group_names : numpy.ndarray of object, shape (n_groups,)
    group_link_bandwidth_bytes_per_s, group_link_latency_s : numpy.ndarray, shape (n_groups,)
        Intra-group fabric: per-direction bandwidth one device can drive to a peer in
        its group, and one-message latency.
    inter_link : LinkSpec
        Between groups, per device (one NIC rail per device).
    device_names, device_types : numpy.ndarray of object, shape (n_devices,)
    device_group : numpy.ndarray of int64, shape (n_devices,)
    device_peak_flops : numpy.ndarray of float64, shape (n_devices,)
        Dense peak FLOP/s in ``default_dtype``.
    device_peak_flops_by_dtype : dict[str, numpy.ndarray]
        Dense peak per dtype; NaN where the vendor publishes none (fp8 on A100).
    tier_names : tuple[str, ...]
        Union of tier names, in first-seen order.
    tier_capacity_bytes, tier_bandwidth_bytes_per_s : numpy.ndarray, shape (n_devices, n_tiers)
        0 where a device lacks that tier.
    device_main_tier : numpy.ndarray of int64, shape (n_devices,)
        Column of each device's main memory (the first tier its JSON lists: HBM, or
        GDDR6 on workstation cards).
    device_memory_bytes, device_memory_bandwidth_bytes_per_s : numpy.ndarray, shape (n_devices,)
        Main-memory capacity and bandwidth of each device (properties).
    bandwidth_matrix_bytes_per_s, latency_matrix_s : numpy.ndarray or None
        Optional full ``(n_devices, n_devices)`` override of the link classes.
    preset : str or None
        Preset this came from (informational).
    device_active_power_w, device_idle_power_w : numpy.ndarray of float64 or None, shape (n_devices,)
        Power running kernels and power held idle; NaN where the inventory gives none
        (:mod:`partitioners.costmodel.energy`). ``None``: no device has any.
    group_link_energy_j_per_byte : numpy.ndarray of float64 or None, shape (n_groups,)
        Energy per byte over each group's fabric; NaN where unknown.
    inter_link_energy_j_per_byte : float
        Energy per byte between groups; NaN when unknown.
    device_cost_model : dict[str, dict]
        Per device name, the ``cost_model`` entries its JSON (or its group's) carries
        where devices differ (launch overhead, efficiencies); read by
        :func:`partitioners.costmodel.profiles.resolve_cost_model`, which checks them.
    """

    name: str
    default_dtype: str
    group_names: npt.NDArray[np.object_]
    group_link_bandwidth_bytes_per_s: npt.NDArray[np.float64]
    group_link_latency_s: npt.NDArray[np.float64]
    inter_link: LinkSpec
    device_names: npt.NDArray[np.object_]
    device_types: npt.NDArray[np.object_]
    device_group: npt.NDArray[np.int64]
    device_peak_flops: npt.NDArray[np.float64]
    device_peak_flops_by_dtype: dict[str, npt.NDArray[np.float64]]
    tier_names: tuple[str, ...]
    tier_capacity_bytes: npt.NDArray[np.float64]
    tier_bandwidth_bytes_per_s: npt.NDArray[np.float64]
    device_main_tier: npt.NDArray[np.int64]
    bandwidth_matrix_bytes_per_s: npt.NDArray[np.float64] | None = None
    latency_matrix_s: npt.NDArray[np.float64] | None = None
    preset: str | None = None
    device_cost_model: dict[str, dict[str, Any]] = field(default_factory=dict)
    _index: dict[str, int] = field(default_factory=dict, repr=False)
    device_active_power_w: npt.NDArray[np.float64] | None = None
    device_idle_power_w: npt.NDArray[np.float64] | None = None
    group_link_energy_j_per_byte: npt.NDArray[np.float64] | None = None
    inter_link_energy_j_per_byte: float = math.nan

    @property
    def n_devices(self) -> int:
        return int(self.device_names.shape[0])

    @property
    def n_groups(self) -> int:
        return int(self.group_names.shape[0])

    @property
    def device_memory_bytes(self) -> npt.NDArray[np.float64]:
        """Main-memory capacity per device."""
        return self.tier_capacity_bytes[np.arange(self.n_devices), self.device_main_tier]

    @property
    def device_memory_bandwidth_bytes_per_s(self) -> npt.NDArray[np.float64]:
        """Main-memory bandwidth per device."""
        return self.tier_bandwidth_bytes_per_s[np.arange(self.n_devices), self.device_main_tier]

    def group_link(self, group: int) -> LinkSpec:
        """The intra-group link of ``group``."""
        return LinkSpec(
            bandwidth_bytes_per_s=float(self.group_link_bandwidth_bytes_per_s[group]),
            latency_s=float(self.group_link_latency_s[group]),
        )


# --------------------------------------------------------------------------- presets

#: The nodes of :data:`~partitioners.hardware.catalogue.NODES` a placement request may name as a
#: preset. Their figures (and sources) live in the catalogue, which the 3D planner reads too.
PLACEMENT_PRESET_NAMES: tuple[str, ...] = (
    "dgx-h100",
    "dgx-a100",
    "dgx-b200",
    "gb200-nvl72",
    "ascend-910b",
    "pcie-workstation",
)


def _device_doc(accelerator: Accelerator) -> dict[str, Any]:
    """One device of a preset as inventory JSON (less its name): type, peaks, memory tiers, power."""
    doc: dict[str, Any] = {
        "type": accelerator.device_type,
        "peak_flops": dict(accelerator.dense_peak_flops_per_s),
        "memory_tiers": [
            {
                "name": tier.name,
                "capacity_bytes": tier.capacity_bytes,
                "bandwidth_bytes_per_s": tier.bandwidth_bytes_per_s,
            }
            for tier in accelerator.memory_tiers
        ],
    }
    if accelerator.board_power_w is not None:
        doc["active_power_w"] = accelerator.board_power_w
        doc["idle_power_w"] = accelerator.idle_power_w
    return doc


def _link_doc(link: LinkSpec, energy_pj_per_bit: float | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "latency_s": link.latency_s}
    if energy_pj_per_bit is not None:
        doc["energy_pj_per_bit"] = energy_pj_per_bit
    return doc


def _preset_doc(node: Node) -> dict[str, Any]:
    """A catalogue node as the description of one group (node / NVLink domain) and its links."""
    return {
        "devices_per_group": node.devices_per_node,
        "group_prefix": node.group_prefix,
        "device_prefix": node.device_prefix,
        "device": _device_doc(node.accelerator),
        "link": _link_doc(node.intra_node_link, node.intra_node_energy_pj_per_bit),
        "inter_link": _link_doc(node.inter_node_link, node.inter_node_energy_pj_per_bit),
        "name": node.name,
    }


#: Preset name -> description of one group (node / NVLink domain) and its links, from the catalogue.
PRESETS: dict[str, dict[str, Any]] = {name: _preset_doc(CATALOGUE_NODES[name]) for name in PLACEMENT_PRESET_NAMES}


def preset_inventory(preset: str, nodes: int = 1) -> Inventory:
    """Expand a named preset into an :class:`Inventory` of ``nodes`` groups.

    Raises
    ------
    InvalidInput
        Unknown preset (the message lists the valid ones) or ``nodes`` out of range.
    """
    return inventory_from_json({"preset": preset, "nodes": nodes})


def _preset_to_doc(preset: Any, nodes: Any) -> dict[str, Any]:
    if not isinstance(preset, str) or preset not in PRESETS:
        raise InvalidInput(
            f"unknown inventory preset {preset!r}; valid presets are {', '.join(sorted(PRESETS))}",
            field="inventory.preset",
            code="unknown-preset",
        )
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise InvalidInput(
            f"inventory.nodes must be an integer from 1 to {MAX_NODES}, got {nodes!r}",
            field="inventory.nodes",
            code="out-of-range",
        )
    p = PRESETS[preset]
    groups = []
    for g in range(nodes):
        devices = [
            {"name": f"{p['group_prefix']}{g}/{p['device_prefix']}{i}", **p["device"]}
            for i in range(p["devices_per_group"])
        ]
        groups.append({"name": f"{p['group_prefix']}{g}", "devices": devices, "link": p["link"]})
    return {
        "name": f"{preset}x{nodes}",
        "groups": groups,
        "link": p["inter_link"],
        "_preset": preset,
    }


def _preset_dtype(preset: str, dtype: Any) -> Any:
    """A ``default_dtype`` asked of a preset, checked against the peaks its spec sheet gives.

    Anything but a name is left to the general check; a name the preset's devices have
    no peak for is a 422 naming the field and the dtypes that preset has.
    """
    published = PRESETS[preset]["device"]["peak_flops"]
    if isinstance(dtype, str) and dtype and dtype not in published:
        raise InvalidInput(
            f"preset {preset!r} publishes peaks for {', '.join(sorted(published))}, not {dtype!r}",
            field="inventory.default_dtype",
        )
    return dtype


# ----------------------------------------------------------------------- validation

# The figures a device or link may have: far beyond any real hardware on either side (a
# microcontroller's 1e6 FLOP/s, a GB200 NVL72 rack's 1.44e18 FP4 FLOP/s, NVIDIA GB200
# NVL72 datasheet; a serial line's 1e3 B/s, an H200's 4.8e12 B/s of HBM3e), and narrow
# enough that every time the cost model derives from them stays a finite number of
# seconds: a bandwidth of 1e-300 B/s would make every plan "infinitely" slow, not wrong in
# a way a caller can read. A latency above a second (a round trip across a continent is a
# tenth of one) is a unit mistake.
PEAK_FLOPS_RANGE = (1e6, 1e19)
BANDWIDTH_RANGE_BYTES_PER_S = (1e3, 1e16)
LATENCY_RANGE_S = (0.0, 1.0)
# A byte to an exabyte per memory tier (a GB200 NVL72 rack holds 13.5 TB of HBM): capacities
# are summed and compared, and 1.7e308 bytes summed over two devices is infinite.
CAPACITY_RANGE_BYTES = (1.0, 1e18)


def within(value: float, where: str, bounds: tuple[float, float], unit: str) -> float:
    """``value`` if it lies in ``bounds`` (inclusive), else the 4xx naming the field and the range."""
    low, high = bounds
    if not low <= value <= high:
        raise InvalidInput(
            f"{where} must be between {low:g} and {high:g} {unit}, got {value:g}", field=where, code="out-of-range"
        )
    return value


def _bandwidth(value: Any, where: str) -> float:
    return within(_positive(value, where), where, BANDWIDTH_RANGE_BYTES_PER_S, "B/s")


def _latency(value: Any, where: str) -> float:
    return within(_non_negative(value, where), where, LATENCY_RANGE_S, "s")


def _capacity(value: Any, where: str) -> float:
    return within(_positive(value, where), where, CAPACITY_RANGE_BYTES, "bytes")


def _peak_flops(value: Any, where: str) -> float:
    return within(_positive(value, where), where, PEAK_FLOPS_RANGE, "FLOP/s")


def _positive(value: Any, where: str, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{where} must be a positive number, got {value!r}", field=where)
    x = float(value)
    if not (x > 0) or (math.isinf(x) and not allow_inf) or math.isnan(x):
        raise InvalidInput(f"{where} must be a positive finite number, got {value!r}", field=where)
    return x


def _non_negative(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{where} must be a non-negative number, got {value!r}", field=where)
    x = float(value)
    if not (x >= 0) or math.isinf(x):
        raise InvalidInput(f"{where} must be a non-negative finite number, got {value!r}", field=where)
    return x


def _link(doc: Any, where: str) -> LinkSpec:
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{where} must be an object with bandwidth_bytes_per_s and latency_s", field=where)
    return LinkSpec(
        bandwidth_bytes_per_s=_bandwidth(doc.get("bandwidth_bytes_per_s"), f"{where}.bandwidth_bytes_per_s"),
        latency_s=_latency(doc.get("latency_s", 0.0), f"{where}.latency_s"),
    )


# Power per device and energy per bit: a GB200 superchip's 2.7 kW is the largest board there
# is; a link at 1e6 pJ/bit (a microjoule) is a unit mistake.
POWER_RANGE_W = (0.0, 1e5)
LINK_ENERGY_RANGE_PJ_PER_BIT = (0.0, 1e6)
_PJ_PER_BIT_TO_J_PER_BYTE = 8e-12


def _link_energy_j_per_byte(doc: Any, where: str) -> float:
    """``energy_pj_per_bit`` of a link document as joules per byte (NaN when absent)."""
    if not isinstance(doc, Mapping) or "energy_pj_per_bit" not in doc:
        return math.nan
    pj = _non_negative(doc["energy_pj_per_bit"], f"{where}.energy_pj_per_bit")
    return within(pj, f"{where}.energy_pj_per_bit", LINK_ENERGY_RANGE_PJ_PER_BIT, "pJ/bit") * _PJ_PER_BIT_TO_J_PER_BYTE


def _device_power_w(d: Mapping[str, Any], where: str) -> tuple[float, float]:
    """``(active, idle)`` power of a device document; NaN for both when it gives none."""
    has_active, has_idle = "active_power_w" in d, "idle_power_w" in d
    if not has_active and not has_idle:
        return math.nan, math.nan
    if has_active != has_idle:
        missing = "idle_power_w" if has_active else "active_power_w"
        raise InvalidInput(f"{where} gives one power figure without {missing}", field=f"{where}.{missing}")
    active = within(
        _non_negative(d["active_power_w"], f"{where}.active_power_w"), f"{where}.active_power_w", POWER_RANGE_W, "W"
    )
    idle = within(
        _non_negative(d["idle_power_w"], f"{where}.idle_power_w"), f"{where}.idle_power_w", POWER_RANGE_W, "W"
    )
    if idle > active:
        raise InvalidInput(
            f"{where}.idle_power_w ({idle:g} W) exceeds active_power_w ({active:g} W)", field=f"{where}.idle_power_w"
        )
    return active, idle


def inventory_from_json(doc: Mapping[str, Any]) -> Inventory:
    """Build an :class:`Inventory` from DESIGN.md's inventory JSON or a preset request.

    Parameters
    ----------
    doc : mapping
        Either ``{"preset": name, "nodes": n, "default_dtype"?}`` or ``{"name", "default_dtype"?, "groups": [{"name",
        "devices": [{"name", "type", "peak_flops", "memory_tiers": [{"name",
        "capacity_bytes", "bandwidth_bytes_per_s"}]}], "link": {...}}], "link": {...}}``.
        ``peak_flops`` is a number (dense FLOP/s in ``default_dtype``, default
        ``"bf16"``) or a ``{dtype: FLOP/s}`` object that includes ``default_dtype``;
        ``default_dtype`` is the dtype whose peak times every operator (a preset's
        devices publish several: ``"tf32"`` or ``"fp32"`` time an fp32 export as exported).
        Optional ``"bandwidth_matrix_bytes_per_s"`` / ``"latency_matrix_s"``: full
        ``n_devices x n_devices`` lists overriding the link classes (diagonal ignored).

    Raises
    ------
    InvalidInput
        With ``field`` naming the bad entry: unknown preset, nodes out of range, no
        groups or devices, duplicate group names or device names (across groups too),
        non-positive capacity, bandwidth or peak, malformed links.
    InputTooLarge
        More than :data:`MAX_DEVICES` devices.
    """
    if not isinstance(doc, Mapping):
        raise InvalidInput("inventory must be a JSON object", field="inventory")
    preset = None
    if "preset" in doc:
        preset = doc["preset"]
        expanded = _preset_to_doc(preset, doc.get("nodes", 1))
        if "default_dtype" in doc:
            expanded["default_dtype"] = _preset_dtype(preset, doc["default_dtype"])
        doc = expanded
    name = doc.get("name", "inventory")
    if not isinstance(name, str):
        raise InvalidInput("inventory.name must be a string", field="inventory.name")
    default_dtype = doc.get("default_dtype", DEFAULT_DTYPE)
    if not isinstance(default_dtype, str) or not default_dtype:
        raise InvalidInput("inventory.default_dtype must be a dtype name", field="inventory.default_dtype")
    groups = doc.get("groups")
    if not isinstance(groups, list) or not groups:
        raise InvalidInput("inventory.groups must be a non-empty list of device groups", field="inventory.groups")
    n_total = sum(len(g["devices"]) for g in groups if isinstance(g, Mapping) and isinstance(g.get("devices"), list))
    if n_total > MAX_DEVICES:
        raise InputTooLarge(f"inventory has {n_total} devices; the limit is {MAX_DEVICES}", field="inventory.groups")

    devices = _DeviceColumns()
    group_names: list[str] = []
    group_links: list[LinkSpec] = []
    group_energy: list[float] = []
    group_where: dict[str, str] = {}  # name -> where it was declared
    for gi, g in enumerate(groups):
        gwhere = f"inventory.groups[{gi}]"
        gname, members, link = _parse_group(g, gi, gwhere)
        if gname in group_where:
            # plans, traces and the plan view report traffic and devices by group name
            raise InvalidInput(
                f"group name '{gname}' appears twice ({group_where[gname]} and {gwhere}); names must be unique",
                field=f"{gwhere}.name",
                code="duplicate-name",
            )
        group_where[gname] = gwhere
        group_names.append(gname)
        group_links.append(link)
        group_energy.append(
            _link_energy_j_per_byte(g.get("link") if isinstance(g, Mapping) else None, f"{gwhere}.link")
        )
        group_cost = _cost_model_entry(g.get("cost_model"), f"{gwhere}.cost_model")
        for di, d in enumerate(members):
            devices.add(d, gi, f"{gwhere}.devices[{di}]", default_dtype, reuse_parsed=preset is not None)
            own = _cost_model_entry(d.get("cost_model"), f"{gwhere}.devices[{di}].cost_model")
            if group_cost or own:
                devices.cost_models[devices.names[-1]] = {**group_cost, **own}
    inter = _inter_group_link(doc, len(groups))
    inter_energy = _link_energy_j_per_byte(doc.get("link"), "inventory.link")
    active_w = np.array(devices.active_power_w, dtype=np.float64)
    idle_w = np.array(devices.idle_power_w, dtype=np.float64)
    has_power = bool(np.isfinite(active_w).any())

    n = len(devices.names)
    dtypes = sorted({k for p in devices.peaks for k in p})
    by_dtype = {k: np.array([p.get(k, np.nan) for p in devices.peaks], dtype=np.float64) for k in dtypes}
    tier_names, cap, bw, main_tier = _tier_arrays(devices.tiers)

    bmat = lmat = None
    if "bandwidth_matrix_bytes_per_s" in doc:
        bmat = _matrix(doc["bandwidth_matrix_bytes_per_s"], n, "inventory.bandwidth_matrix_bytes_per_s", True)
        lmat = (
            _matrix(doc["latency_matrix_s"], n, "inventory.latency_matrix_s", False)
            if "latency_matrix_s" in doc
            else None
        )
    inv = Inventory(
        name=name,
        default_dtype=default_dtype,
        group_names=np.array(group_names, dtype=object),
        group_link_bandwidth_bytes_per_s=np.array([g.bandwidth_bytes_per_s for g in group_links], dtype=np.float64),
        group_link_latency_s=np.array([g.latency_s for g in group_links], dtype=np.float64),
        inter_link=inter,
        device_names=np.array(devices.names, dtype=object),
        device_types=np.array(devices.types, dtype=object),
        device_group=np.array(devices.groups, dtype=np.int64),
        device_peak_flops=by_dtype[default_dtype].copy(),
        device_peak_flops_by_dtype=by_dtype,
        tier_names=tuple(tier_names),
        tier_capacity_bytes=cap,
        tier_bandwidth_bytes_per_s=bw,
        device_main_tier=main_tier,
        bandwidth_matrix_bytes_per_s=bmat,
        latency_matrix_s=lmat,
        preset=preset if isinstance(preset, str) else doc.get("_preset"),
        device_cost_model=devices.cost_models,
        _index={nm: i for i, nm in enumerate(devices.names)},
        device_active_power_w=active_w if has_power else None,
        device_idle_power_w=idle_w if has_power else None,
        group_link_energy_j_per_byte=np.array(group_energy, dtype=np.float64),
        inter_link_energy_j_per_byte=inter_energy,
    )
    return inv


def _cost_model_entry(value: Any, where: str) -> dict[str, Any]:
    """A device's or group's ``cost_model`` object (its keys and values are checked where it is resolved)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where} must be an object of cost-model parameters", field=where)
    return {str(k): v for k, v in value.items()}


def _parse_group(g: Any, gi: int, gwhere: str) -> tuple[str, list[Any], LinkSpec]:
    """A group's name, its device list and the link between its devices (a lone device needs none)."""
    if not isinstance(g, Mapping):
        raise InvalidInput(f"{gwhere} must be an object", field=gwhere)
    gname = g.get("name", f"group{gi}")
    if not isinstance(gname, str) or not gname or "\x00" in gname:
        raise InvalidInput(f"{gwhere}.name must be a non-empty string", field=f"{gwhere}.name")
    members = g.get("devices")
    if not isinstance(members, list) or not members:
        raise InvalidInput(
            f"group '{gname}' has no devices; every group needs at least one",
            field=f"{gwhere}.devices",
        )
    if "link" in g:
        link = _link(g["link"], f"{gwhere}.link")
    elif len(members) == 1:
        link = _LOCAL_LINK
    else:
        raise InvalidInput(
            f"group '{gname}' has {len(members)} devices but no link between them",
            field=f"{gwhere}.link",
        )
    return gname, members, link


def _inter_group_link(doc: Mapping[str, Any], n_groups: int) -> LinkSpec:
    """The link between groups: required with several groups; none (local) with one."""
    if n_groups > 1 or "link" in doc:
        if "link" not in doc:
            raise InvalidInput(
                "inventory.link (between groups) is required when there are several groups",
                field="inventory.link",
            )
        return _link(doc["link"], "inventory.link")
    return _LOCAL_LINK


@dataclass
class _DeviceColumns:
    """Devices as they are read, one list per column; names checked unique across groups."""

    names: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    peaks: list[dict[str, float]] = field(default_factory=list)
    tiers: list[list[tuple[str, float, float]]] = field(default_factory=list)
    active_power_w: list[float] = field(default_factory=list)
    idle_power_w: list[float] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)  # name -> where it was declared
    cost_models: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> cost_model overrides
    # presets repeat one device spec: validate it once, reuse the parsed form
    parsed: dict[int, tuple[dict[str, float], list[tuple[str, float, float]]]] = field(default_factory=dict)

    def add(self, d: Any, group: int, dwhere: str, default_dtype: str, *, reuse_parsed: bool) -> None:
        if not isinstance(d, Mapping):
            raise InvalidInput(f"{dwhere} must be an object", field=dwhere)
        dname = d.get("name")
        if not isinstance(dname, str) or not dname or "\x00" in dname:
            raise InvalidInput(f"{dwhere}.name must be a non-empty string", field=f"{dwhere}.name")
        if dname in self.seen:
            raise InvalidInput(
                f"device name '{dname}' appears twice ({self.seen[dname]} and {dwhere}); names must be unique",
                field=f"{dwhere}.name",
                code="duplicate-name",
            )
        self.seen[dname] = dwhere
        dtype_ = d.get("type", "device")
        if not isinstance(dtype_, str):
            raise InvalidInput(f"{dwhere}.type must be a string", field=f"{dwhere}.type")
        peak_src, tiers_src = d.get("peak_flops"), d.get("memory_tiers")
        key = id(tiers_src) if reuse_parsed else None
        if key is not None and key in self.parsed:
            peak, tier_list = self.parsed[key]
        else:
            peak = _parse_peak(peak_src, f"{dwhere}.peak_flops", default_dtype)
            tier_list = _parse_tiers(tiers_src, f"{dwhere}.memory_tiers")
            if key is not None:
                self.parsed[key] = (peak, tier_list)
        self.names.append(dname)
        self.types.append(dtype_)
        self.groups.append(group)
        self.peaks.append(peak)
        self.tiers.append(tier_list)
        active, idle = _device_power_w(d, dwhere)
        self.active_power_w.append(active)
        self.idle_power_w.append(idle)


def _tier_arrays(
    tiers: list[list[tuple[str, float, float]]],
) -> tuple[list[str], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Tier names in first-seen order, capacity and bandwidth per (device, tier) (0: the
    device has no such tier), and each device's main-memory tier (the first it lists)."""
    tier_names: list[str] = []
    for tl in tiers:
        for tn, _, _ in tl:
            if tn not in tier_names:
                tier_names.append(tn)
    n = len(tiers)
    cap = np.zeros((n, len(tier_names)), dtype=np.float64)
    bw = np.zeros((n, len(tier_names)), dtype=np.float64)
    col = {t: i for i, t in enumerate(tier_names)}
    main_tier = np.empty(n, dtype=np.int64)
    for i, tl in enumerate(tiers):
        main_tier[i] = col[tl[0][0]]  # the first tier listed is main memory
        for tn, c, b in tl:
            cap[i, col[tn]] = c
            bw[i, col[tn]] = b
    return tier_names, cap, bw, main_tier


def _parse_peak(value: Any, where: str, default_dtype: str) -> dict[str, float]:
    if isinstance(value, Mapping):
        if not value:
            raise InvalidInput(f"{where} must name at least one dtype", field=where)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                raise InvalidInput(f"{where} keys must be dtype names", field=where)
            out[k] = _peak_flops(v, f"{where}.{k}")
        if default_dtype not in out:
            raise InvalidInput(
                f"{where} has no entry for the default dtype '{default_dtype}' (has {', '.join(sorted(out))})",
                field=where,
            )
        return out
    return {default_dtype: _peak_flops(value, where)}


def _parse_tiers(value: Any, where: str) -> list[tuple[str, float, float]]:
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"{where} must list at least one memory tier (main memory first)", field=where)
    out = []
    names = set()
    for ti, t in enumerate(value):
        twhere = f"{where}[{ti}]"
        if not isinstance(t, Mapping):
            raise InvalidInput(f"{twhere} must be an object", field=twhere)
        tn = t.get("name")
        if not isinstance(tn, str) or not tn:
            raise InvalidInput(f"{twhere}.name must be a non-empty string", field=f"{twhere}.name")
        if tn in names:
            raise InvalidInput(f"memory tier '{tn}' appears twice in {where}", field=f"{twhere}.name")
        names.add(tn)
        out.append(
            (
                tn,
                _capacity(t.get("capacity_bytes"), f"{twhere}.capacity_bytes"),
                _bandwidth(t.get("bandwidth_bytes_per_s"), f"{twhere}.bandwidth_bytes_per_s"),
            )
        )
    return out


def _matrix(value: Any, n: int, where: str, positive: bool) -> npt.NDArray[np.float64]:
    if n > 4096:
        raise InputTooLarge(f"{where} is only accepted up to 4096 devices", field=where)
    try:
        m = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInput(f"{where} must be a list of {n} lists of {n} numbers", field=where) from None
    if m.shape != (n, n):
        raise InvalidInput(f"{where} must be {n} x {n}, got shape {m.shape}", field=where)
    off = ~np.eye(n, dtype=bool)
    bad = ~np.isfinite(m[off]) | ((m[off] <= 0) if positive else (m[off] < 0))
    if bad.any():
        raise InvalidInput(
            f"{where} off-diagonal entries must be {'positive' if positive else 'non-negative'} finite numbers",
            field=where,
        )
    bounds, unit = (BANDWIDTH_RANGE_BYTES_PER_S, "B/s") if positive else (LATENCY_RANGE_S, "s")
    outside = (m[off] < bounds[0]) | (m[off] > bounds[1])
    if outside.any():
        within(float(m[off][outside][0]), where, bounds, unit)
    return m


# ------------------------------------------------------------------ serialisation


def inventory_to_json(inv: Inventory) -> dict[str, Any]:
    """Canonical JSON form (full group/device listing) that :func:`inventory_from_json` reads back.

    Canonical means: every device spelled out with ``peak_flops`` as a dtype object,
    tiers in the device's order, numbers as floats. Two inventories describing the
    same cluster (a preset and its expansion) give the same document.
    """
    names = inv.tier_names
    by_dtype = inv.device_peak_flops_by_dtype
    groups: list[dict[str, Any]] = []
    for g in range(inv.n_groups):
        group: dict[str, Any] = {"name": str(inv.group_names[g]), "devices": []}
        # a one-device group may have no link (infinite bandwidth), which JSON cannot hold
        if math.isfinite(inv.group_link_bandwidth_bytes_per_s[g]):
            group["link"] = {
                "bandwidth_bytes_per_s": float(inv.group_link_bandwidth_bytes_per_s[g]),
                "latency_s": float(inv.group_link_latency_s[g]),
            }
            energy = inv.group_link_energy_j_per_byte
            if energy is not None and math.isfinite(energy[g]):
                group["link"]["energy_pj_per_bit"] = float(energy[g]) / _PJ_PER_BIT_TO_J_PER_BYTE
        groups.append(group)
    for i in range(inv.n_devices):
        main = int(inv.device_main_tier[i])
        order = [main] + [k for k in range(len(names)) if k != main and inv.tier_capacity_bytes[i, k] > 0]
        tiers = [
            {
                "name": names[k],
                "capacity_bytes": float(inv.tier_capacity_bytes[i, k]),
                "bandwidth_bytes_per_s": float(inv.tier_bandwidth_bytes_per_s[i, k]),
            }
            for k in order
        ]
        peak = {k: float(v[i]) for k, v in sorted(by_dtype.items()) if not np.isnan(v[i])}
        device: dict[str, Any] = {
            "name": str(inv.device_names[i]),
            "type": str(inv.device_types[i]),
            "peak_flops": peak,
            "memory_tiers": tiers,
        }
        if inv.device_active_power_w is not None and inv.device_idle_power_w is not None:
            if math.isfinite(inv.device_active_power_w[i]):
                device["active_power_w"] = float(inv.device_active_power_w[i])
                device["idle_power_w"] = float(inv.device_idle_power_w[i])
        if str(inv.device_names[i]) in inv.device_cost_model:
            device["cost_model"] = dict(inv.device_cost_model[str(inv.device_names[i])])
        groups[int(inv.device_group[i])]["devices"].append(device)
    out: dict[str, Any] = {"name": inv.name, "default_dtype": inv.default_dtype, "groups": groups}
    if inv.n_groups > 1 or math.isfinite(inv.inter_link.bandwidth_bytes_per_s):
        out["link"] = {
            "bandwidth_bytes_per_s": float(inv.inter_link.bandwidth_bytes_per_s),
            "latency_s": float(inv.inter_link.latency_s),
        }
        if math.isfinite(inv.inter_link_energy_j_per_byte):
            out["link"]["energy_pj_per_bit"] = inv.inter_link_energy_j_per_byte / _PJ_PER_BIT_TO_J_PER_BYTE
    if inv.bandwidth_matrix_bytes_per_s is not None:
        out["bandwidth_matrix_bytes_per_s"] = inv.bandwidth_matrix_bytes_per_s.tolist()
        if inv.latency_matrix_s is not None:
            out["latency_matrix_s"] = inv.latency_matrix_s.tolist()
    return out


def inventory_hash(inv: Inventory) -> str:
    """sha256 hex digest of the canonical JSON (sorted keys, no whitespace).

    The name is excluded so renaming a cluster does not invalidate stored plans.
    """
    doc = inventory_to_json(inv)
    doc.pop("name", None)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------- links


def device_index(inv: Inventory, device: int | str) -> int:
    """Device id from an id or a name (raises :class:`InvalidInput` for unknown ones)."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        if 0 <= int(device) < inv.n_devices:
            return int(device)
        raise InvalidInput(f"device id {device} is out of range 0..{inv.n_devices - 1}", field="device")
    idx = inv._index.get(device) if isinstance(device, str) else None
    if idx is None and isinstance(device, str) and not inv._index:
        # an Inventory built by hand without the name index
        hits = np.flatnonzero(inv.device_names == device)
        idx = int(hits[0]) if hits.size else None
    if idx is None:
        raise InvalidInput(f"unknown device {device!r}", field="device")
    return idx


def link_between(inv: Inventory, src_device: int | str, dst_device: int | str) -> LinkSpec:
    """The link a transfer from ``src_device`` to ``dst_device`` uses.

    Same device: infinite bandwidth and zero latency. Same group: that group's
    fabric. Otherwise: the inter-group link (per-device NIC rail). A bandwidth
    matrix, when given, overrides the class figures for the pair.
    """
    s = device_index(inv, src_device)
    d = device_index(inv, dst_device)
    if s == d:
        return _LOCAL_LINK
    if inv.bandwidth_matrix_bytes_per_s is not None:
        lat = inv.latency_matrix_s
        same_group = inv.device_group[s] == inv.device_group[d]
        base = inv.group_link(int(inv.device_group[s])) if same_group else inv.inter_link
        return LinkSpec(
            bandwidth_bytes_per_s=float(inv.bandwidth_matrix_bytes_per_s[s, d]),
            latency_s=float(lat[s, d]) if lat is not None else base.latency_s,
        )
    if inv.device_group[s] == inv.device_group[d]:
        return inv.group_link(int(inv.device_group[s]))
    return inv.inter_link


def link_class(inv: Inventory, src_device: int | str, dst_device: int | str) -> str:
    """``"local"``, ``"intra-group"`` or ``"inter-group"`` for a device pair."""
    s = device_index(inv, src_device)
    d = device_index(inv, dst_device)
    return LINK_CLASS_NAMES[int(link_class_ids(inv, np.array([s]), np.array([d]))[0])]


def link_class_ids(inv: Inventory, src: npt.ArrayLike, dst: npt.ArrayLike) -> npt.NDArray[np.int8]:
    """Vectorised link class (``LINK_LOCAL`` / ``LINK_INTRA_GROUP`` / ``LINK_INTER_GROUP``)."""
    src_ids = np.asarray(src, dtype=np.int64)
    dst_ids = np.asarray(dst, dtype=np.int64)
    same_group = inv.device_group[src_ids] == inv.device_group[dst_ids]
    out = np.where(same_group, LINK_INTRA_GROUP, LINK_INTER_GROUP).astype(np.int8)
    out[src_ids == dst_ids] = LINK_LOCAL
    return out


# ------------------------------------------------------------------ re-planning


def _resolve(inv: Inventory, names: Iterable[int | str]) -> npt.NDArray[np.int64]:
    return np.array(sorted({device_index(inv, n) for n in names}), dtype=np.int64)


def without_devices(inv: Inventory, names: Iterable[int | str]) -> Inventory:
    """The inventory with some devices removed (failed GPUs, drained nodes).

    Groups left empty disappear; device ids are renumbered densely in the old order.

    Raises
    ------
    InvalidInput
        Unknown device, or removing every device.
    """
    drop = _resolve(inv, names)
    keep = np.ones(inv.n_devices, dtype=bool)
    keep[drop] = False
    if not keep.any():
        raise InvalidInput("removing these devices would leave the inventory empty", field="devices")
    kept_groups = np.unique(inv.device_group[keep])
    remap = np.full(inv.n_groups, -1, dtype=np.int64)
    remap[kept_groups] = np.arange(kept_groups.size)
    names_kept = inv.device_names[keep]
    return replace(
        inv,
        group_names=inv.group_names[kept_groups],
        group_link_bandwidth_bytes_per_s=inv.group_link_bandwidth_bytes_per_s[kept_groups],
        group_link_latency_s=inv.group_link_latency_s[kept_groups],
        device_names=names_kept,
        device_types=inv.device_types[keep],
        device_group=remap[inv.device_group[keep]],
        device_peak_flops=inv.device_peak_flops[keep],
        device_peak_flops_by_dtype={k: v[keep] for k, v in inv.device_peak_flops_by_dtype.items()},
        tier_capacity_bytes=inv.tier_capacity_bytes[keep],
        tier_bandwidth_bytes_per_s=inv.tier_bandwidth_bytes_per_s[keep],
        device_main_tier=inv.device_main_tier[keep],
        bandwidth_matrix_bytes_per_s=(
            None if inv.bandwidth_matrix_bytes_per_s is None else inv.bandwidth_matrix_bytes_per_s[np.ix_(keep, keep)]
        ),
        latency_matrix_s=None if inv.latency_matrix_s is None else inv.latency_matrix_s[np.ix_(keep, keep)],
        preset=None,
        _index={str(nm): i for i, nm in enumerate(names_kept)},
        device_active_power_w=None if inv.device_active_power_w is None else inv.device_active_power_w[keep],
        device_idle_power_w=None if inv.device_idle_power_w is None else inv.device_idle_power_w[keep],
        group_link_energy_j_per_byte=(
            None if inv.group_link_energy_j_per_byte is None else inv.group_link_energy_j_per_byte[kept_groups]
        ),
    )


def with_device_speed(inv: Inventory, scale: Mapping[int | str, float] | npt.NDArray[np.floating[Any]]) -> Inventory:
    """The inventory with device peak FLOP/s multiplied by ``scale`` (all dtypes).

    Used when load reports show a device running slower than its datasheet
    (thermal throttling, a noisy neighbour): ``{"node0/gpu3": 0.5}`` halves it.

    Raises
    ------
    InvalidInput
        Unknown device, or a non-positive / non-finite factor.
    """
    factors = np.ones(inv.n_devices, dtype=np.float64)
    if isinstance(scale, np.ndarray):
        if scale.shape != (inv.n_devices,):
            raise InvalidInput(f"speed scale must have one factor per device ({inv.n_devices})", field="scale")
        factors = scale.astype(np.float64)
    else:
        for k, v in scale.items():
            factors[device_index(inv, k)] = _positive(v, f"scale[{k!r}]")
    if not np.all(np.isfinite(factors) & (factors > 0)):
        raise InvalidInput("speed scale factors must be positive finite numbers", field="scale")
    return replace(
        inv,
        device_peak_flops=inv.device_peak_flops * factors,
        device_peak_flops_by_dtype={k: v * factors for k, v in inv.device_peak_flops_by_dtype.items()},
        preset=None,
    )
