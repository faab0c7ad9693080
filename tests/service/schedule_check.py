"""An independent replay of a plan's returned ``schedule`` (docs/api.md "The schedule").

Written from the document's contract, not from the planner: it reads only the graph
(which operator reads and writes which tensor), the inventory's tier capacities and the
plan's JSON (``ops`` and ``schedule``), and states what a runtime following the
schedule relies on. ``violations`` returns every broken rule as a sentence (empty: the
schedule is valid).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict

__all__ = ["GraphShape", "violations"]


class GraphShape:
    """Which tensors each operator reads and writes, and who produces each tensor (by name)."""

    def __init__(self, reads: dict[str, list[str]], writes: dict[str, list[str]]) -> None:
        self.reads = reads
        self.writes = writes
        self.producer = {t: op for op, outs in writes.items() for t in outs}

    @classmethod
    def of_hypergraph(cls, graph) -> GraphShape:
        ops = graph.op_names.tolist()
        names = graph.tensor_names.tolist()
        reads = {ops[i]: [names[t] for t in graph.inputs_of(i).tolist()] for i in range(graph.n_ops)}
        writes = {ops[i]: [names[t] for t in graph.outputs_of(i).tolist()] for i in range(graph.n_ops)}
        return cls(reads, writes)

    @classmethod
    def of_json(cls, graph: dict) -> GraphShape:
        return cls(
            {n["name"]: list(n["inputs"]) for n in graph["nodes"]},
            {n["name"]: list(n["outputs"]) for n in graph["nodes"]},
        )


def _covers(holding: dict | None, start: float, end: float) -> bool:
    return holding is not None and holding["live_from_s"] <= start and holding["live_until_s"] >= end


def _tier_overlaps(holdings: list[dict], capacity: dict[tuple[str, str], float]) -> list[str]:
    """Holdings of one (device, tier) that share an address while both live, or pass the capacity.

    A sweep over time (a range is released at ``live_until_s`` before one taken at the
    same instant) keeps the live ranges sorted by offset; a new range is checked
    against its neighbours, which suffices while the live ranges are disjoint.
    """
    out: list[str] = []
    by_tier: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for h in holdings:
        if h["tier"] is None:
            continue
        key = (h["device"], h["tier"])
        if h["offset_bytes"] < 0 or h["offset_bytes"] + h["size_bytes"] > capacity[key]:
            out.append(f"{h['tensor']} on {key} at [{h['offset_bytes']}, +{h['size_bytes']}) is outside the tier")
        if h["size_bytes"] > 0 and h["live_from_s"] < h["live_until_s"]:
            by_tier[key].append(h)
    for key, group in by_tier.items():
        events = sorted(
            [(h["live_until_s"], 0, i) for i, h in enumerate(group)]
            + [(h["live_from_s"], 1, i) for i, h in enumerate(group)]
        )
        live: list[tuple[int, int, int]] = []  # (offset, end, index), disjoint, sorted
        for _, is_start, i in events:
            h = group[i]
            item = (h["offset_bytes"], h["offset_bytes"] + h["size_bytes"], i)
            if not is_start:
                live.remove(item)
                continue
            at = bisect_left(live, item)
            for j in (at - 1, at):
                if 0 <= j < len(live) and live[j][0] < item[1] and item[0] < live[j][1]:
                    other = group[live[j][2]]
                    out.append(f"{h['tensor']} and {other['tensor']} overlap in {key} while both are live")
            insort(live, item)
    return out


def violations(plan: dict, shape: GraphShape, capacity: dict[tuple[str, str], float]) -> list[str]:
    """Every rule of the schedule contract that ``plan`` breaks.

    ``capacity`` maps ``(device, tier)`` to the tier's bytes. Rules: every placed
    operator runs exactly once, on its device; each device runs one operator at a time
    in the listed order; an operator starts once each input is on its device (made
    there by an earlier operator, or a transfer to it has ended; graph inputs and
    parameters are resident); a transfer leaves after its tensor is made; every
    tensor an operator or a transfer touches has a holding on that device live for
    as long; holdings of one tier never share an address while both are live.
    """
    out: list[str] = []
    schedule = plan["schedule"]
    where: dict[str, str] = {}
    position: dict[str, int] = {}
    times: dict[str, tuple[float, float]] = {}
    for device in schedule["devices"]:
        previous_end = float("-inf")
        for i, entry in enumerate(device["ops"]):
            op = entry["op"]
            if op in where:
                out.append(f"{op} is scheduled twice")
            where[op], position[op], times[op] = device["device"], i, (entry["start_s"], entry["end_s"])
            if entry["end_s"] < entry["start_s"]:
                out.append(f"{op} ends before it starts")
            if entry["start_s"] < previous_end:
                out.append(f"{op} starts on {device['device']} before the operator before it ends")
            previous_end = max(previous_end, entry["end_s"])
    if where != plan["ops"]:
        missing = set(plan["ops"]) - set(where)
        out.append(f"the schedule's operators are not the plan's ({len(missing)} missing or moved)")
        return out
    holding = {(h["tensor"], h["device"]): h for h in schedule["holdings"]}
    arrival: dict[tuple[str, str], float] = {}
    for tr in schedule["transfers"]:
        produced_by = shape.producer.get(tr["tensor"])
        if produced_by is None or where[produced_by] != tr["src"]:
            out.append(f"transfer of {tr['tensor']} does not leave from its producer's device")
            continue
        if tr["start_s"] < times[produced_by][1] or tr["end_s"] < tr["start_s"]:
            out.append(f"transfer of {tr['tensor']} starts before its tensor is made")
        if not _covers(holding.get((tr["tensor"], tr["src"])), tr["start_s"], tr["end_s"]):
            out.append(f"{tr['tensor']} is not held on {tr['src']} while it is sent")
        for dst in tr["dst"]:
            arrival[(tr["tensor"], dst)] = min(arrival.get((tr["tensor"], dst), float("inf")), tr["end_s"])
            h = holding.get((tr["tensor"], dst))
            if h is None or h["live_from_s"] > tr["start_s"] or h["live_until_s"] < tr["end_s"]:
                out.append(f"{tr['tensor']} has no buffer on {dst} while it arrives")
    for op, device in where.items():
        start, end = times[op]
        for t in shape.reads[op]:
            produced_by = shape.producer.get(t)
            if produced_by is not None:
                if where[produced_by] == device:
                    if position[produced_by] >= position[op] or times[produced_by][1] > start:
                        out.append(f"{op} reads {t} before {produced_by} has made it on {device}")
                elif arrival.get((t, device), float("inf")) > start:
                    out.append(f"{op} starts on {device} before {t} has arrived")
            if not _covers(holding.get((t, device)), start, end):
                out.append(f"{op} reads {t} on {device} outside its holding's live interval")
        for t in shape.writes[op]:
            if not _covers(holding.get((t, device)), start, end):
                out.append(f"{op} writes {t} on {device} outside its holding's live interval")
    out.extend(_tier_overlaps(schedule["holdings"], capacity))
    return out
