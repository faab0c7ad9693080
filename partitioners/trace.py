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

from partitioners.graph import Hypergraph
from partitioners.inventory import LINK_CLASS_NAMES, Inventory, link_class_ids
from partitioners.simulate import SimulationResult, memory_timeline

__all__ = ["to_chrome_trace"]

_US_PER_S = 1e6


def _meta(kind: str, pid: int, name: str, tid: int | None = None, sort_index: int | None = None) -> list[dict]:
    out: list[dict[str, Any]] = []
    base: dict[str, Any] = {"ph": "M", "pid": pid}
    if tid is not None:
        base["tid"] = tid
    out.append({**base, "name": f"{kind}_name", "args": {"name": name}})
    if sort_index is not None:
        out.append({**base, "name": f"{kind}_sort_index", "args": {"sort_index": sort_index}})
    return out


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
        From :func:`partitioners.simulate.simulate` (transfers appear only when it ran
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
        (:func:`partitioners.simulate.memory_timeline`), under the device's group.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``;
        plain Python types only, ready for ``json.dumps``.
    """
    events: list[dict[str, Any]] = []
    n_groups = inventory.n_groups
    group_names = inventory.group_names.tolist()
    device_names = inventory.device_names.tolist()
    device_group = inventory.device_group.tolist()
    for g in range(n_groups):
        events += _meta("process", g, str(group_names[g]), sort_index=g)
    for d in range(inventory.n_devices):
        events += _meta("thread", device_group[d], str(device_names[d]), tid=d, sort_index=d)

    op_dev = result.op_device.tolist()
    start_us = (result.op_start_s * _US_PER_S).tolist()
    dur_us = ((result.op_end_s - result.op_start_s) * _US_PER_S).tolist()
    names = graph.op_names.tolist()
    types = graph.op_types.tolist()
    flops = graph.op_flops.tolist()
    if window_s is None:
        ops = range(graph.n_ops)
        keep_tr = np.ones(result.transfer_tensor.size, dtype=bool)
    else:
        lo, hi = float(window_s[0]), float(window_s[1])
        ops = np.flatnonzero((result.op_end_s >= lo) & (result.op_start_s <= hi)).tolist()
        keep_tr = (result.transfer_end_s >= lo) & (result.transfer_start_s <= hi)
    for op in ops:
        d = op_dev[op]
        events.append(
            {
                "name": str(names[op]),
                "cat": "op",
                "ph": "X",
                "ts": start_us[op],
                "dur": dur_us[op],
                "pid": device_group[d],
                "tid": d,
                "args": {"op": str(names[op]), "op_type": str(types[op]), "flops": flops[op]},
            }
        )

    if memory_counters and graph.n_ops:
        m_dev, m_time, m_bytes = memory_timeline(graph, result)
        # one sample per (device, instant): the level after the instant's last event
        last = np.append((m_dev[1:] != m_dev[:-1]) | (m_time[1:] != m_time[:-1]), True)
        if window_s is not None:
            last &= (m_time >= window_s[0]) & (m_time <= window_s[1])
        for d, t, b in zip(m_dev[last].tolist(), (m_time[last] * _US_PER_S).tolist(), m_bytes[last].tolist()):
            events.append(
                {
                    "name": f"{device_names[d]} memory",
                    "cat": "memory",
                    "ph": "C",
                    "ts": t,
                    "pid": device_group[d],
                    "args": {"bytes": b},
                }
            )

    if include_transfers and result.transfer_tensor.size:
        links_pid = n_groups
        events += _meta("process", links_pid, "links", sort_index=n_groups)
        n_dev = inventory.n_devices
        pair = result.transfer_src * n_dev + result.transfer_dst
        upair, tid_of = np.unique(pair, return_inverse=True)
        classes = link_class_ids(inventory, upair // n_dev, upair % n_dev).tolist()
        for k, p in enumerate(upair.tolist()):
            s, d = divmod(p, n_dev)
            label = f"{device_names[s]} -> {device_names[d]} ({LINK_CLASS_NAMES[classes[k]]})"
            events += _meta("thread", links_pid, label, tid=k, sort_index=k)
        tnames = graph.tensor_names.tolist()
        t_ids = result.transfer_tensor.tolist()
        t_src = result.transfer_src.tolist()
        t_dst = result.transfer_dst.tolist()
        t_bytes = result.transfer_bytes.tolist()
        t_start = (result.transfer_start_s * _US_PER_S).tolist()
        t_dur = ((result.transfer_end_s - result.transfer_start_s) * _US_PER_S).tolist()
        tids = tid_of.reshape(-1).tolist()
        for i in np.flatnonzero(keep_tr).tolist():
            t = t_ids[i]
            events.append(
                {
                    "name": str(tnames[t]),
                    "cat": "transfer",
                    "ph": "X",
                    "ts": t_start[i],
                    "dur": t_dur[i],
                    "pid": links_pid,
                    "tid": tids[i],
                    "args": {
                        "tensor": str(tnames[t]),
                        "bytes": t_bytes[i],
                        "src": str(device_names[t_src[i]]),
                        "dst": str(device_names[t_dst[i]]),
                    },
                }
            )

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
