"""Chrome trace-event export of a simulated schedule (opens in Perfetto and chrome://tracing).

Layout: one *process* per device group (``pid`` = group id, named after the group)
whose *threads* are its devices (``tid`` = device id), and one extra process
``"links"`` (``pid`` = number of groups) with one thread per directed device pair
that carries traffic. Operators and transfers are complete events (``ph: "X"``)
with ``ts``/``dur`` in microseconds; ``ph: "M"`` metadata events name every
process and thread and fix their order.

References
----------
.. [1] "Trace Event Format", Google (docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
   the format Perfetto's legacy JSON importer reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from partitioners.costmodel.simulator import SimulationResult, memory_timeline
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.inventory import LINK_CLASS_NAMES, Inventory, link_class_ids

__all__ = ["to_chrome_trace"]

_US_PER_S = 1e6


def _meta(
    kind: str, pid: int, name: str, tid: int | None = None, sort_index: int | None = None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    base: dict[str, Any] = {"ph": "M", "pid": pid}
    if tid is not None:
        base["tid"] = tid
    out.append({**base, "name": f"{kind}_name", "args": {"name": name}})
    if sort_index is not None:
        out.append({**base, "name": f"{kind}_sort_index", "args": {"sort_index": sort_index}})
    return out


def _device_tracks(inventory: Inventory) -> list[dict[str, Any]]:
    """A process per device group and a thread per device, named and in inventory order."""
    events: list[dict[str, Any]] = []
    group_names, device_group = inventory.group_names.tolist(), inventory.device_group.tolist()
    for g in range(inventory.n_groups):
        events += _meta("process", g, str(group_names[g]), sort_index=g)
    for d, name in enumerate(inventory.device_names.tolist()):
        events += _meta("thread", device_group[d], str(name), tid=d, sort_index=d)
    return events


def _operator_events(
    result: SimulationResult, graph: Hypergraph, inventory: Inventory, window: tuple[float, float] | None
) -> list[dict[str, Any]]:
    """One complete event per operator (overlapping ``window``) on its device's thread."""
    ops: range | list[int]
    if window is None:
        ops = range(graph.n_ops)
    else:
        ops = np.flatnonzero((result.op_end_s >= window[0]) & (result.op_start_s <= window[1])).tolist()
    op_dev, device_group = result.op_device.tolist(), inventory.device_group.tolist()
    start_us = (result.op_start_s * _US_PER_S).tolist()
    dur_us = ((result.op_end_s - result.op_start_s) * _US_PER_S).tolist()
    names, types, flops = graph.op_names.tolist(), graph.op_types.tolist(), graph.op_flops.tolist()
    return [
        {
            "name": str(names[op]),
            "cat": "op",
            "ph": "X",
            "ts": start_us[op],
            "dur": dur_us[op],
            "pid": device_group[op_dev[op]],
            "tid": op_dev[op],
            "args": {"op": str(names[op]), "op_type": str(types[op]), "flops": flops[op]},
        }
        for op in ops
    ]


def _memory_counter_events(
    result: SimulationResult, graph: Hypergraph, inventory: Inventory, window: tuple[float, float] | None
) -> list[dict[str, Any]]:
    """A counter sample per (device, instant) of the bytes in use, under the device's group."""
    m_dev, m_time, m_bytes = memory_timeline(graph, result)
    # one sample per (device, instant): the level after the instant's last event
    last = np.append((m_dev[1:] != m_dev[:-1]) | (m_time[1:] != m_time[:-1]), True)
    if window is not None:
        last &= (m_time >= window[0]) & (m_time <= window[1])
    device_names, device_group = inventory.device_names.tolist(), inventory.device_group.tolist()
    return [
        {
            "name": f"{device_names[d]} memory",
            "cat": "memory",
            "ph": "C",
            "ts": t,
            "pid": device_group[d],
            "args": {"bytes": b},
        }
        for d, t, b in zip(m_dev[last].tolist(), (m_time[last] * _US_PER_S).tolist(), m_bytes[last].tolist())
    ]


def _transfer_events(
    result: SimulationResult, graph: Hypergraph, inventory: Inventory, window: tuple[float, float] | None
) -> list[dict[str, Any]]:
    """The "links" process: a thread per directed device pair with traffic, an event per transfer."""
    links_pid, n_dev = inventory.n_groups, inventory.n_devices
    device_names = inventory.device_names.tolist()
    events = _meta("process", links_pid, "links", sort_index=links_pid)
    pair = result.transfer_src * n_dev + result.transfer_dst
    upair, tid_of = np.unique(pair, return_inverse=True)
    classes = link_class_ids(inventory, upair // n_dev, upair % n_dev).tolist()
    for k, p in enumerate(upair.tolist()):
        s, d = divmod(p, n_dev)
        label = f"{device_names[s]} -> {device_names[d]} ({LINK_CLASS_NAMES[classes[k]]})"
        events += _meta("thread", links_pid, label, tid=k, sort_index=k)
    if window is None:
        keep = np.ones(result.transfer_tensor.size, dtype=bool)
    else:
        keep = (result.transfer_end_s >= window[0]) & (result.transfer_start_s <= window[1])
    tnames = graph.tensor_names.tolist()
    t_ids, t_src, t_dst = result.transfer_tensor.tolist(), result.transfer_src.tolist(), result.transfer_dst.tolist()
    t_bytes = result.transfer_bytes.tolist()
    t_start = (result.transfer_start_s * _US_PER_S).tolist()
    t_dur = ((result.transfer_end_s - result.transfer_start_s) * _US_PER_S).tolist()
    tids = tid_of.reshape(-1).tolist()
    events += [
        {
            "name": str(tnames[t_ids[i]]),
            "cat": "transfer",
            "ph": "X",
            "ts": t_start[i],
            "dur": t_dur[i],
            "pid": links_pid,
            "tid": tids[i],
            "args": {
                "tensor": str(tnames[t_ids[i]]),
                "bytes": t_bytes[i],
                "src": str(device_names[t_src[i]]),
                "dst": str(device_names[t_dst[i]]),
            },
        }
        for i in np.flatnonzero(keep).tolist()
    ]
    return events


def to_chrome_trace(
    result: SimulationResult,
    graph: Hypergraph,
    inventory: Inventory,
    *,
    include_transfers: bool = True,
    window_s: tuple[float, float] | None = None,
    memory_counters: bool = False,
) -> dict[str, Any]:
    """The simulated timeline as Chrome trace-event JSON.

    Parameters
    ----------
    result : SimulationResult
        From :func:`partitioners.costmodel.simulator.simulate` (transfers appear only when it ran
        with ``record_timeline=True``).
    graph, inventory
        The graph and inventory that were simulated (for names).
    include_transfers : bool
        Emit the link tracks.
    window_s : (float, float), optional
        Keep only operators and transfers that overlap ``[start, end]`` seconds: a
        10^6-operator step is ~10^6 events (hundreds of MB of JSON), more than a
        browser opens comfortably, so callers page through long steps.
    memory_counters : bool
        Add a counter track (``ph: "C"``) per device with the bytes in use over time
        (:func:`partitioners.costmodel.simulator.memory_timeline`), under the device's group.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``;
        plain Python types only, ready for ``json.dumps``.
    """
    window = None if window_s is None else (float(window_s[0]), float(window_s[1]))
    events = _device_tracks(inventory) + _operator_events(result, graph, inventory, window)
    if memory_counters and graph.n_ops:
        events += _memory_counter_events(result, graph, inventory, window)
    if include_transfers and result.transfer_tensor.size:
        events += _transfer_events(result, graph, inventory, window)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "graph": graph.name,
            "inventory": inventory.name,
            "makespan_s": float(result.makespan_s),
            "comm_bytes": float(result.comm_bytes),
        },
    }
