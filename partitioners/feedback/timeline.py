"""Measured timelines: parse Chrome traces and the simple JSON form, match them to a plan.

Two input forms (``docs/feedback.md`` has examples):

* **Chrome trace-event JSON** [1]_ as ``torch.profiler`` writes it
  (``export_chrome_trace``) and as :mod:`partitioners.costmodel.trace` exports a simulated
  plan: complete events (``ph: "X"``) with ``ts``/``dur`` in microseconds. An
  event's device comes from ``args.device``, from a device mapping keyed by
  ``"pid:tid"``, ``"pid"``, thread name or process name, or from a thread/process
  name that *is* a device name. ``ProfilerStep#N`` events (torch.profiler's step
  annotations) split the trace into steps. Events with ``args.src`` and
  ``args.dst`` are transfers. GPU kernels (``cat`` ``kernel``, ``gpu_memcpy``,
  ``gpu_memset``) carry the ``External id`` of the CPU operator that launched them:
  their busy time is attributed to that operator's outermost enclosing operator
  (the device time of ``aten::linear`` is its ``addmm`` kernel's), on the kernel's
  device; a kernel no CPU operator claims stays an event of its own. Python-stack, CUDA-runtime and profiler-overhead
  categories are counted as *ignored*, never silently dropped. ONNX Runtime's profile
  (a bare array) reads the same way: ``<node>_kernel_time`` is the node, fences are
  ignored, and each ``model_run`` is a step.
* **Simple JSON**: ``{"ops": [{"name", "device"?, "start_s", "duration_s",
  "step"?}], "peak_memory_bytes"?: {device: bytes}, "transfers"?: [{"tensor",
  "src", "dst", "duration_s", "step"?}]}``.

Every number is checked where it is read: times and durations finite and
non-negative, timestamps up to :data:`MAX_TIMESTAMP_S`, durations and the whole
timeline's span up to :data:`MAX_TIMELINE_SPAN_S` (one week), steps integers up to
:data:`MAX_STEP`, peak memory up to :data:`MAX_PEAK_MEMORY_BYTES`. Anything else is
:class:`~partitioners.errors.InvalidInput` naming the field.

Matching (:func:`match_timeline`) pairs events with the plan's operators:

``name``
    An event named like a plan operator (after an optional name mapping) is that
    operator. Without step annotations, the k-th occurrence of an operator is step k.
``order``
    For profilers whose names differ from the graph's (``aten::addmm`` for an ONNX
    ``Gemm``), names are first matched as above; the remaining *top-level* events
    (not nested inside another event of the same thread) of each device and step
    are aligned with the plan's remaining operators on that device, in topological
    order, by operator class (:func:`partitioners.costmodel.costs.op_class_of`, with PyTorch
    ATen names normalised), using longest-matching-block alignment [2]_ so that an
    operator the profiler does not show (an ONNX ``Shape``) or an event the graph
    does not have (``aten::t``) costs one gap, not a misalignment.
``auto``
    ``name``, and ``order`` when names match nothing.

Everything is plain Python over lists and numpy arrays: no I/O, no clocks.

References
----------
.. [1] "Trace Event Format", Google (docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
.. [2] J. W. Ratcliff, D. E. Metzener, "Pattern Matching: The Gestalt Approach",
   Dr. Dobb's Journal, 1988 (the algorithm of Python's ``difflib.SequenceMatcher``).
.. [3] ONNX Runtime, "Profiling tools",
   https://onnxruntime.ai/docs/performance/tune-performance/profiling-tools.html.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, TypedDict

import numpy as np

from partitioners.costmodel.costs import OP_CLASS_NAMES, op_class_of
from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.hardware.inventory import CAPACITY_RANGE_BYTES

__all__ = [
    "MATCH_RULES",
    "MAX_STEP",
    "MAX_TIMESTAMP_S",
    "MAX_TIMELINE_SPAN_S",
    "MAX_PEAK_MEMORY_BYTES",
    "MeasuredTransfer",
    "TimelineEvents",
    "TimelineMatch",
    "parse_timeline",
    "parse_chrome_trace",
    "parse_simple_timeline",
    "normalize_op_name",
    "match_timeline",
    "step_makespans_s",
]

MATCH_RULES = ("auto", "name", "order")
_US = 1e-6
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: Largest step number: the bound of the plan's ``step_index`` (an SQL ``INTEGER``). Steps go
#: into int64 arrays and the stored observations; 2^31 steps is far beyond any real run.
MAX_STEP = 2**31 - 1
#: Largest timestamp (``start_s``, a trace event's ``ts``). Traces keep their clock's own
#: origin: torch.profiler writes microseconds of a monotonic or Unix-epoch clock (~1.8e9 s
#: today); 1e10 s is the year 2286 as Unix time. Beyond it the number is a wrong unit
#: (nanoseconds sent as microseconds) or garbage, and float64 resolves no better than
#: microseconds there.
MAX_TIMESTAMP_S = 1e10
#: Longest duration of one event and longest span of a whole timeline (first start to
#: last end): one week. A profiler records a few steps, seconds to minutes; even a trace
#: of a multi-day run fills the event limit long before. A longer timeline is not a
#: runtime trace (a unit error, or made-up numbers) and would only poison calibration.
MAX_TIMELINE_SPAN_S = 7 * 24 * 3600.0
#: Largest peak memory a device may report: the largest capacity an inventory accepts.
MAX_PEAK_MEMORY_BYTES = CAPACITY_RANGE_BYTES[1]
#: Chrome-trace categories that are not operators (Python stack, CUDA API calls, profiler bookkeeping).
IGNORED_CATEGORIES = frozenset(
    {
        "python_function",
        "cuda_runtime",
        "cuda_driver",
        "overhead",
        "trace",
        "ac2g",
        "flow",
        "python",
        "cpu_instant_event",
    }
)
#: Chrome-trace categories of device-side work launched by a CPU operator (torch.profiler with CUDA).
KERNEL_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: ONNX Runtime's profiler (``SessionOptions.enable_profiling``) [3]_: a node's kernel is
#: ``<node>_kernel_time`` in category ``Node``, between zero-length ``_fence_before`` and
#: ``_fence_after`` events; each ``InferenceSession.run`` is a ``model_run`` in ``Session``.
_ORT_NODE, _ORT_SESSION, _ORT_KERNEL_SUFFIX = "node", "session", "_kernel_time"
_ORT_FENCES = ("_fence_before", "_fence_after")
#: ATen / PyTorch names whose normalised form :func:`op_class_of` would not know.
_ALIASES = {
    "maxpool1d": "maxpool",
    "maxpool2d": "maxpool",
    "maxpool3d": "maxpool",
    "maxpool2dwithindices": "maxpool",
    "adaptiveavgpool1d": "globalaveragepool",
    "adaptiveavgpool2d": "globalaveragepool",
    "adaptivemaxpool2d": "globalmaxpool",
    "avgpool2d": "averagepool",
    "avgpool1d": "averagepool",
    "view": "reshape",
    "unsafeview": "reshape",
    "t": "transpose",
    "permute": "transpose",
    "cat": "concat",
    "stack": "concat",
    "contiguous": "copy",
    "clone": "copy",
    "to": "cast",
    "todtype": "cast",
    "select": "gather",
    "indexselect": "gather",
    "index": "gather",
    "convolution": "conv",
    "mkldnnconvolution": "conv",
    "cudnnconvolution": "conv",
    "nativelayernorm": "layernorm",
    "nativebatchnorm": "batchnorm",
    "softmaxbackward": "softmax",
    "scaleddotproductflashattention": "attention",
    "scaleddotproductefficientattention": "attention",
    "flashattentionforward": "attention",
    "addcmul": "mul",
    "addcdiv": "div",
    "rsqrt": "sqrt",
    "mean": "reducemean",
    "sum": "reducesum",
    "amax": "reducemax",
}


class MeasuredTransfer(TypedDict):
    """One measured transfer of a timeline, as parsed (device and tensor names not yet resolved)."""

    tensor: str
    src: str
    dst: str
    start_s: float
    duration_s: float
    step: int  # -1 when a Chrome trace's transfer lies in no profiler step


# A device kernel to attribute to its CPU operator: (External id, start_s, duration_s,
# labels its device may go by, name, thread key).
_KernelRow = tuple[Any, float, float, tuple[str, ...], str, str]


@dataclass(frozen=True)
class TimelineEvents:
    """A measured timeline, normalised: one row per operator event.

    Attributes
    ----------
    source_format : {"chrome", "simple"}
    name : list of str
        Event (operator) names as measured.
    device : list of tuple of str
        Labels that may name the event's device, most specific first (``args.device``,
        ``"pid:tid"``, ``"pid"``, thread name, process name); resolved against the
        inventory and the device mapping by :func:`match_timeline`. Empty when the
        timeline does not say.
    thread : list of str
        Grouping key of the event's timeline row (``"pid:tid"``, or the device).
    start_s, duration_s : numpy.ndarray of float64
    step : numpy.ndarray of int64
        Step index, ``-1`` when the timeline has no step annotations.
    parent : numpy.ndarray of int64
        Index of the innermost event of the same thread that encloses this one
        (``aten::addmm`` under ``aten::linear``), ``-1`` for a top-level event.
    transfers : list of MeasuredTransfer
        ``{"tensor", "src", "dst", "start_s", "duration_s", "step"}`` per measured transfer.
    peak_memory_bytes : dict
        Measured peak memory per device, when the timeline reports it.
    ignored : dict
        Events left out and why (``{"python_function": 812, "metadata": 6}``).
    """

    source_format: str
    name: list[str]
    device: list[tuple[str, ...]]
    thread: list[str]
    start_s: np.ndarray
    duration_s: np.ndarray
    step: np.ndarray
    parent: np.ndarray
    transfers: list[MeasuredTransfer] = field(default_factory=list)
    peak_memory_bytes: dict[str, float] = field(default_factory=dict)
    ignored: dict[str, int] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return len(self.name)

    @property
    def nested(self) -> np.ndarray:
        """Inside another event of the same thread."""
        return self.parent >= 0


@dataclass(frozen=True)
class TimelineMatch:
    """Events paired with plan operators (one row per matched event).

    Attributes
    ----------
    op : numpy.ndarray of int64
        Plan operator index of each matched event.
    device : numpy.ndarray of int64
        Inventory device the operator ran on (the event's, or the plan's when the
        event does not say).
    step : numpy.ndarray of int64
        Step index (>= 0; occurrence order when the timeline had no steps).
    start_s, duration_s : numpy.ndarray of float64
    transfer_tensor, transfer_src, transfer_dst, transfer_step : numpy.ndarray of int64
    transfer_duration_s : numpy.ndarray of float64
    matched_events : int
        Operator and transfer events matched.
    unmatched_events : int
        Events that are neither matched nor nested inside a matched event.
    nested_events : int
        Events inside a matched event (their time is part of the parent's).
    unmatched_names : list of (str, int)
        The most frequent unmatched names, for the caller to add to the mapping.
    ops_on_other_device : int
        Matched events whose device differs from the plan's.
    rule : str
        The rule that produced the match (``name`` or ``order``).
    """

    op: np.ndarray
    device: np.ndarray
    step: np.ndarray
    start_s: np.ndarray
    duration_s: np.ndarray
    transfer_tensor: np.ndarray
    transfer_src: np.ndarray
    transfer_dst: np.ndarray
    transfer_step: np.ndarray
    transfer_duration_s: np.ndarray
    matched_events: int
    unmatched_events: int
    nested_events: int
    unmatched_names: list[tuple[str, int]]
    ops_on_other_device: int
    rule: str


# ----------------------------------------------------------------------------- parsing


def _finite(
    value: Any, where: str, *, minimum: float = 0.0, maximum: float = MAX_TIMESTAMP_S, unit: str = "s"
) -> float:
    """``value`` as a float in ``[minimum, maximum]``, or :class:`InvalidInput` naming ``where``.

    JSON integers are unbounded in Python: one with hundreds of digits overflows
    ``float()``, and is as out of range as ``1e308``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{where} must be a number", field=where)
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not (math.isfinite(out) and minimum <= out <= maximum):
        raise InvalidInput(f"{where} must be a finite number from {minimum:g} to {maximum:g} {unit}", field=where)
    return out


def _seconds(value: Any, where: str) -> float:
    """A duration in seconds: finite, from 0 to :data:`MAX_TIMELINE_SPAN_S`."""
    return _finite(value, where, maximum=MAX_TIMELINE_SPAN_S)


def _step(value: Any, where: str) -> int:
    """A step number: an integer from 0 to :data:`MAX_STEP`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        raise InvalidInput(f"{where} must be an integer from 0 to {MAX_STEP}", field=where)
    return value


def _check_span(starts: np.ndarray, ends: np.ndarray, where: str) -> None:
    """A timeline from first start to last end within :data:`MAX_TIMELINE_SPAN_S`."""
    span_s = float(np.max(ends) - np.min(starts)) if starts.size else 0.0
    if span_s > MAX_TIMELINE_SPAN_S:
        raise InvalidInput(
            f"the timeline spans {span_s:.6g} s from its first start to its last end; a runtime trace spans at "
            f"most {MAX_TIMELINE_SPAN_S:g} s (one week): are the times in the right unit?",
            field=where,
        )


def _text(value: Any, where: str) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InvalidInput(f"{where} must be a string", field=where)
    return str(value)


def _parents(thread: list[str], start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """Innermost enclosing event of the same thread (``-1`` when none): one sweep with a stack."""
    n = len(thread)
    parent = np.full(n, -1, dtype=np.int64)
    order = sorted(range(n), key=lambda i: (thread[i], start_s[i], -end_s[i], i))
    stack: list[int] = []
    current = None
    for i in order:
        if thread[i] != current:
            stack, current = [], thread[i]
        while stack and end_s[stack[-1]] < start_s[i] + 1e-12:
            stack.pop()
        if stack and end_s[i] <= end_s[stack[-1]] + 1e-12:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _attribute_kernels(
    kernels: list[tuple[Any, float, float, tuple[str, ...], str, str]],
    external: list[Any],
    parent: np.ndarray,
    devices: list[tuple[str, ...]],
    start_s: np.ndarray,
    duration_s: np.ndarray,
) -> tuple[int, list[tuple[Any, float, float, tuple[str, ...], str, str]]]:
    """Give each outermost CPU operator the busy time, first start and device of its kernels.

    ``kernels`` rows are ``(external id, start_s, duration_s, device labels, name,
    thread)``. Returns how many were attributed and the rows no CPU operator claims.
    ``devices``, ``start_s`` and ``duration_s`` are updated in place.
    """
    by_external: dict[Any, int] = {}
    for event_index, ext in enumerate(external):
        if ext is not None:
            by_external.setdefault(ext, event_index)
    busy: dict[int, float] = {}
    first: dict[int, float] = {}
    device: dict[int, tuple[str, ...]] = {}
    unclaimed: list[_KernelRow] = []
    for row in kernels:
        ext, ts, dur, candidates = row[:4]
        i = by_external.get(ext)
        if i is None:
            unclaimed.append(row)
            continue
        while parent[i] >= 0:
            i = int(parent[i])
        busy[i] = busy.get(i, 0.0) + dur
        first[i] = min(first.get(i, ts), ts)
        device.setdefault(i, candidates)
    for i, total in busy.items():
        start_s[i] = first[i]
        duration_s[i] = total
        devices[i] = device[i]
    return len(kernels) - len(unclaimed), unclaimed


def _trace_events(document: Any, max_events: int) -> list[Any]:
    """The trace's event list: ``traceEvents`` of an object, or a bare array."""
    if isinstance(document, dict):
        events = document.get("traceEvents")
        if not isinstance(events, list):
            raise InvalidInput("a Chrome trace needs a 'traceEvents' array", field="timeline.traceEvents")
    elif isinstance(document, list):
        events = document
    else:
        raise InvalidInput("a Chrome trace is a JSON object with 'traceEvents' or a JSON array", field="timeline")
    if len(events) > max_events:
        raise InputTooLarge(
            f"the trace has {len(events)} events; at most {max_events} are accepted", field="timeline.traceEvents"
        )
    return events


def _split_metadata(
    events: list[Any], ignored: Counter[str]
) -> tuple[dict[str, str], dict[str, str], list[tuple[int, dict[str, Any]]]]:
    """Process and thread names from the metadata events (``ph: M``), and the complete
    events (``ph: X``) with their index; other phases are counted as ignored."""
    process_name: dict[str, str] = {}
    thread_name: dict[str, str] = {}
    complete: list[tuple[int, dict[str, Any]]] = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise InvalidInput(f"trace event {i} is not an object", field=f"timeline.traceEvents[{i}]")
        ph = ev.get("ph")
        if ph == "M":
            raw_args = ev.get("args")
            args = raw_args if isinstance(raw_args, dict) else {}
            label = args.get("name")
            if isinstance(label, str):
                if ev.get("name") == "process_name":
                    process_name[str(ev.get("pid"))] = label
                elif ev.get("name") == "thread_name":
                    thread_name[f"{ev.get('pid')}:{ev.get('tid')}"] = label
            ignored["metadata"] += 1
        elif ph == "X":
            complete.append((i, ev))
        else:
            ignored[f"phase {ph}"] += 1
    return process_name, thread_name, complete


@dataclass
class _CompleteEvents:
    """Complete events sorted into what they are: profiler steps (windows), transfers
    (``args`` with ``src`` and ``dst``), device kernels to attribute to their operator
    (``External id``), and operator events, one column per field."""

    names: list[str] = field(default_factory=list)
    devices: list[tuple[str, ...]] = field(default_factory=list)  # labels the event's device may go by
    external: list[Any] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    kernels: list[_KernelRow] = field(default_factory=list)
    step_windows: list[tuple[float, float, int]] = field(default_factory=list)
    run_windows: list[tuple[float, float]] = field(default_factory=list)  # ONNX Runtime's model_run events
    transfers: list[MeasuredTransfer] = field(default_factory=list)

    def add(
        self,
        i: int,
        ev: dict[str, Any],
        process_name: dict[str, str],
        thread_name: dict[str, str],
        ignored: Counter[str],
    ) -> None:
        where = f"timeline.traceEvents[{i}]"
        name = ev.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"complete event {i} has no name", field=f"{where}.name")
        ts = _finite(ev.get("ts"), f"{where}.ts", maximum=MAX_TIMESTAMP_S / _US, unit="us") * _US
        dur = _finite(ev.get("dur", 0.0), f"{where}.dur", maximum=MAX_TIMELINE_SPAN_S / _US, unit="us") * _US
        step_match = _STEP_RE.match(name)
        if step_match:
            digits = step_match.group(1).lstrip("0") or "0"
            # the length first: int() of a megabyte of digits is slow, or refused outright
            if len(digits) > len(str(MAX_STEP)) or int(digits) > MAX_STEP:
                raise InvalidInput(
                    f"complete event {i} is {name[:40]!r}: profiler step numbers go up to {MAX_STEP}",
                    field=f"{where}.name",
                )
            self.step_windows.append((ts, ts + dur, int(digits)))
            return
        category = str(ev.get("cat", "")).lower()
        if category in IGNORED_CATEGORIES:
            ignored[category] += 1
            return
        if category == _ORT_SESSION:
            if name == "model_run":
                self.run_windows.append((ts, ts + dur))
            ignored["onnxruntime session"] += 1
            return
        if category == _ORT_NODE:
            if name.endswith(_ORT_FENCES):
                ignored["onnxruntime fence"] += 1
                return
            name = name.removesuffix(_ORT_KERNEL_SUFFIX)
        raw_args = ev.get("args")
        args = raw_args if isinstance(raw_args, dict) else {}
        pid, tid = str(ev.get("pid", "")), str(ev.get("tid", ""))
        key = f"{pid}:{tid}"
        if "src" in args and "dst" in args:
            self.transfers.append(
                {
                    "tensor": str(args.get("tensor", name)),
                    "src": _text(args["src"], f"{where}.args.src"),
                    "dst": _text(args["dst"], f"{where}.args.dst"),
                    "start_s": ts,
                    "duration_s": dur,
                    "step": -1,
                }
            )
            return
        device = args.get("device")
        candidates = [str(device)] if isinstance(device, (str, int)) and not isinstance(device, bool) else []
        candidates += [key, pid]
        for label in (thread_name.get(key), process_name.get(pid)):
            if label:
                candidates.append(label)
        ext = args.get("External id")
        ext = ext if isinstance(ext, (int, str)) and not isinstance(ext, bool) else None
        if category in KERNEL_CATEGORIES and ext is not None:
            self.kernels.append((ext, ts, dur, tuple(candidates), name, key))
            return
        self.names.append(name)
        self.devices.append(tuple(candidates))
        self.external.append(ext)
        self.threads.append(key)
        self.starts.append(ts)
        self.durations.append(dur)


def _steps_of(
    step_windows: list[tuple[float, float, int]], start_s: np.ndarray, transfers: list[MeasuredTransfer]
) -> np.ndarray:
    """Per event, the profiler step whose window holds its start (-1: none); transfers get
    theirs written into their ``step``."""
    step = np.full(start_s.size, -1, dtype=np.int64)
    if not step_windows:
        return step
    step_windows = sorted(step_windows)
    lo = np.array([w[0] for w in step_windows])
    hi = np.array([w[1] for w in step_windows])
    number = np.array([w[2] for w in step_windows], dtype=np.int64)
    if start_s.size:
        k = np.searchsorted(lo, start_s, side="right") - 1
        inside = (k >= 0) & (start_s <= hi[np.clip(k, 0, None)] + 1e-12)
        step[inside] = number[k[inside]]
    for tr in transfers:
        w = int(np.searchsorted(lo, tr["start_s"], side="right")) - 1
        if w >= 0 and tr["start_s"] <= hi[w] + 1e-12:
            tr["step"] = int(number[w])
    return step


def parse_chrome_trace(document: Any, *, max_events: int = 2_000_000) -> TimelineEvents:
    """Normalise Chrome trace-event JSON (object with ``traceEvents``, or a bare array).

    Parameters
    ----------
    document : dict or list
    max_events : int
        Upper bound on trace events.

    Returns
    -------
    TimelineEvents

    Raises
    ------
    InvalidInput
        Not a trace; a complete event without a name, with a ``ts``/``dur`` that is not
        a finite number in range (:data:`MAX_TIMESTAMP_S`, :data:`MAX_TIMELINE_SPAN_S`),
        or a ``ProfilerStep#N`` with ``N`` over :data:`MAX_STEP`; events spanning more
        than :data:`MAX_TIMELINE_SPAN_S`.
    InputTooLarge
        More than ``max_events`` events.
    """
    events = _trace_events(document, max_events)
    ignored: Counter[str] = Counter()
    process_name, thread_name, complete = _split_metadata(events, ignored)
    read = _CompleteEvents()
    for i, ev in complete:
        read.add(i, ev, process_name, thread_name, ignored)
    names, devices, threads, kernels, transfers = read.names, read.devices, read.threads, read.kernels, read.transfers
    # without ProfilerStep annotations, each ONNX Runtime run is a step, in time order
    windows = read.step_windows or [(a, b, k) for k, (a, b) in enumerate(sorted(read.run_windows))]
    start_s = np.asarray(read.starts, dtype=np.float64)
    duration_s = np.asarray(read.durations, dtype=np.float64)
    others = np.array(
        [(k[1], k[1] + k[2]) for k in kernels]
        + [(t["start_s"], t["start_s"] + t["duration_s"]) for t in transfers]
        + [w[:2] for w in windows],
        dtype=np.float64,
    ).reshape(-1, 2)
    _check_span(
        np.concatenate([start_s, others[:, 0]]),
        np.concatenate([start_s + duration_s, others[:, 1]]),
        "timeline.traceEvents",
    )
    # nesting and steps from the CPU side; then device time from the kernels, if any
    parent = _parents(threads, start_s, start_s + duration_s)
    step = _steps_of(windows, start_s, transfers)
    if kernels:
        attributed, extra = _attribute_kernels(kernels, read.external, parent, devices, start_s, duration_s)
        if attributed:
            ignored["kernel attributed to its operator"] += attributed
        if extra:  # unclaimed kernels stay events of their own, top-level on their stream
            names += [k[4] for k in extra]
            devices += [k[3] for k in extra]
            threads += [k[5] for k in extra]
            start_s = np.concatenate([start_s, [k[1] for k in extra]])
            duration_s = np.concatenate([duration_s, [k[2] for k in extra]])
            parent = np.concatenate([parent, np.full(len(extra), -1, dtype=np.int64)])
            step = np.concatenate([step, np.full(len(extra), -1, dtype=np.int64)])
    return TimelineEvents(
        source_format="chrome",
        name=names,
        device=devices,
        thread=threads,
        start_s=start_s,
        duration_s=duration_s,
        step=step,
        parent=parent,
        transfers=transfers,
        ignored=dict(ignored),
    )


def parse_simple_timeline(document: Any, *, max_events: int = 2_000_000) -> TimelineEvents:
    """Normalise the simple JSON form (module docstring).

    Raises
    ------
    InvalidInput
        Missing ``ops``; a time, duration or peak memory that is negative, not finite
        or over its bound (:data:`MAX_TIMESTAMP_S`, :data:`MAX_TIMELINE_SPAN_S`,
        :data:`MAX_PEAK_MEMORY_BYTES`); a step that is not an integer from 0 to
        :data:`MAX_STEP`; operators and transfers spanning more than
        :data:`MAX_TIMELINE_SPAN_S`.
    InputTooLarge
        More than ``max_events`` operator events.
    """
    if not isinstance(document, dict) or not isinstance(document.get("ops"), list):
        raise InvalidInput("the simple timeline form is an object with an 'ops' array", field="timeline.ops")
    ops = document["ops"]
    if len(ops) > max_events:
        raise InputTooLarge(
            f"the timeline has {len(ops)} operator events; at most {max_events} are accepted", field="timeline.ops"
        )
    names: list[str] = []
    devices: list[tuple[str, ...]] = []
    threads: list[str] = []
    starts: list[float] = []
    durations: list[float] = []
    steps: list[int] = []
    for i, op in enumerate(ops):
        where = f"timeline.ops[{i}]"
        if not isinstance(op, dict):
            raise InvalidInput(f"{where} is not an object", field=where)
        name = op.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{where} needs a 'name'", field=f"{where}.name")
        device = op.get("device")
        if device is not None:
            device = _text(device, f"{where}.device")
        step = _step(op.get("step", 0), f"{where}.step")
        names.append(name)
        devices.append((device,) if device is not None else ())
        threads.append(device or "")
        starts.append(_finite(op.get("start_s", 0.0), f"{where}.start_s"))
        durations.append(_seconds(op.get("duration_s"), f"{where}.duration_s"))
        steps.append(step)
    peak: dict[str, float] = {}
    raw_peak = document.get("peak_memory_bytes", {}) or {}
    if not isinstance(raw_peak, dict):
        raise InvalidInput("peak_memory_bytes must map device names to bytes", field="timeline.peak_memory_bytes")
    for dev, n_bytes in raw_peak.items():
        peak[str(dev)] = _finite(
            n_bytes, f"timeline.peak_memory_bytes[{dev!r}]", maximum=MAX_PEAK_MEMORY_BYTES, unit="bytes"
        )
    transfers: list[MeasuredTransfer] = []
    raw_transfers = document.get("transfers", []) or []
    if not isinstance(raw_transfers, list):
        raise InvalidInput("transfers must be an array", field="timeline.transfers")
    for i, tr in enumerate(raw_transfers):
        where = f"timeline.transfers[{i}]"
        if not isinstance(tr, dict):
            raise InvalidInput(f"{where} is not an object", field=where)
        step = _step(tr.get("step", 0), f"{where}.step")
        transfers.append(
            {
                "tensor": _text(tr.get("tensor"), f"{where}.tensor"),
                "src": _text(tr.get("src"), f"{where}.src"),
                "dst": _text(tr.get("dst"), f"{where}.dst"),
                "start_s": _finite(tr.get("start_s", 0.0), f"{where}.start_s"),
                "duration_s": _seconds(tr.get("duration_s"), f"{where}.duration_s"),
                "step": step,
            }
        )
    start_s = np.asarray(starts, dtype=np.float64)
    duration_s = np.asarray(durations, dtype=np.float64)
    transfer_start_s = np.array([t["start_s"] for t in transfers], dtype=np.float64)
    transfer_end_s = transfer_start_s + np.array([t["duration_s"] for t in transfers], dtype=np.float64)
    _check_span(
        np.concatenate([start_s, transfer_start_s]),
        np.concatenate([start_s + duration_s, transfer_end_s]),
        "timeline",
    )
    return TimelineEvents(
        source_format="simple",
        name=names,
        device=devices,
        thread=threads,
        start_s=start_s,
        duration_s=duration_s,
        step=np.asarray(steps, dtype=np.int64),
        parent=np.full(len(names), -1, dtype=np.int64),
        transfers=transfers,
        peak_memory_bytes=peak,
    )


def parse_timeline(document: Any, source_format: str = "auto", *, max_events: int = 2_000_000) -> TimelineEvents:
    """Parse either form; ``auto`` picks Chrome for ``traceEvents`` or an array, simple for ``ops``."""
    if source_format == "auto":
        if isinstance(document, list) or (isinstance(document, dict) and "traceEvents" in document):
            source_format = "chrome"
        elif isinstance(document, dict) and "ops" in document:
            source_format = "simple"
        else:
            raise InvalidInput(
                "cannot tell the timeline's format: send a Chrome trace ('traceEvents') or the simple form ('ops')",
                field="timeline",
            )
    if source_format == "chrome":
        return parse_chrome_trace(document, max_events=max_events)
    if source_format == "simple":
        return parse_simple_timeline(document, max_events=max_events)
    raise InvalidInput("format must be one of auto, chrome, simple", field="format")


# ----------------------------------------------------------------------------- matching


def normalize_op_name(name: str) -> str:
    """An event name as an operator type :func:`~partitioners.costmodel.costs.op_class_of` knows.

    ``"aten::max_pool2d"`` -> ``"maxpool"``, ``"aten::relu_"`` -> ``"relu"``,
    ``"aten::linear"`` -> ``"linear"``; names without a namespace pass through.
    """
    base = name.rsplit("::", 1)[-1].strip().lower()
    base = base.strip("_").replace("_", "")
    return _ALIASES.get(base, base)


def _resolve_device(labels: tuple[str, ...], device_index: Mapping[str, int], device_mapping: Mapping[str, str]) -> int:
    for candidate in labels:
        target = device_mapping.get(candidate, candidate)
        if target in device_index:
            return device_index[target]
    return -1


def _align(event_keys: list[str], op_keys: list[str]) -> list[tuple[int, int]]:
    """Pairs ``(event position, op position)`` of equal keys along the longest matching blocks."""
    matcher = SequenceMatcher(None, event_keys, op_keys, autojunk=False)
    pairs = []
    for block in matcher.get_matching_blocks():
        pairs += [(block.a + k, block.b + k) for k in range(block.size)]
    return pairs


def match_timeline(
    events: TimelineEvents,
    op_names: Sequence[str],
    op_types: Sequence[str],
    op_device: np.ndarray,
    device_names: Sequence[str],
    tensor_names: Sequence[str] = (),
    *,
    op_rank: np.ndarray | None = None,
    op_mapping: Mapping[str, str] | None = None,
    device_mapping: Mapping[str, str] | None = None,
    rule: str = "auto",
) -> TimelineMatch:
    """Pair measured events with the plan's operators and transfers (module docstring).

    Parameters
    ----------
    events : TimelineEvents
    op_names, op_types : sequence of str, length n_ops
        The placed graph's operator names and types.
    op_device : numpy.ndarray of int64, shape (n_ops,)
        The plan's device per operator.
    device_names : sequence of str
        The inventory's device names (ids are positions).
    tensor_names : sequence of str
        The placed graph's tensor names (for transfers).
    op_rank : numpy.ndarray, optional
        Position of each operator in the order the ``order`` rule aligns against
        (a topological order); operator index order when omitted.
    op_mapping : mapping, optional
        Measured name -> plan operator name.
    device_mapping : mapping, optional
        ``"pid:tid"`` / ``"pid"`` / thread or process name / measured device name ->
        inventory device name.
    rule : {"auto", "name", "order"}

    Returns
    -------
    TimelineMatch

    Raises
    ------
    InvalidInput
        Unknown rule, or a mapping onto an operator or device the plan does not have.
    """
    if rule not in MATCH_RULES:
        raise InvalidInput(f"match must be one of {', '.join(MATCH_RULES)}", field="match")
    op_mapping = dict(op_mapping or {})
    device_mapping = dict(device_mapping or {})
    op_index = {str(n): i for i, n in enumerate(op_names)}
    dev_index = {str(n): i for i, n in enumerate(device_names)}
    _check_mappings(op_mapping, device_mapping, op_index, dev_index)
    op_device = np.asarray(op_device, dtype=np.int64)
    ev_device = np.array([_resolve_device(d, dev_index, device_mapping) for d in events.device], dtype=np.int64)

    ev_op = _match_by_name(events, op_index, op_mapping)
    used_rule = "name"
    if rule == "order" or (rule == "auto" and not (ev_op >= 0).any()):
        used_rule = "order"
        _match_by_order(events, ev_op, ev_device, op_types, op_device, op_rank)
    step = _steps(events, ev_op)
    keep = _first_per_operator_step(events, ev_op, step)
    rows = np.flatnonzero(keep)
    device = np.where(ev_device[rows] >= 0, ev_device[rows], op_device[ev_op[rows]])

    # events inside a matched event are part of its time, not unmatched
    inside = _inside_matched(events, keep)
    unmatched_mask = ~keep & ~inside
    unmatched_names = Counter(events.name[i] for i in np.flatnonzero(unmatched_mask).tolist())
    transfers, unmatched_transfers = _match_transfers(events, tensor_names, dev_index, op_mapping, device_mapping)
    for name in unmatched_transfers:
        unmatched_names[f"transfer {name}"] += 1
    tt, ts_, td, tstep, tdur = transfers
    return TimelineMatch(
        op=ev_op[rows],
        device=device.astype(np.int64),
        step=step[rows],
        start_s=events.start_s[rows],
        duration_s=events.duration_s[rows],
        transfer_tensor=np.asarray(tt, dtype=np.int64),
        transfer_src=np.asarray(ts_, dtype=np.int64),
        transfer_dst=np.asarray(td, dtype=np.int64),
        transfer_step=np.asarray(tstep, dtype=np.int64),
        transfer_duration_s=np.asarray(tdur, dtype=np.float64),
        matched_events=int(rows.size) + len(tt),
        unmatched_events=int(unmatched_mask.sum()) + len(unmatched_transfers),
        nested_events=int(inside.sum()),
        unmatched_names=unmatched_names.most_common(20),
        ops_on_other_device=int((device != op_device[ev_op[rows]]).sum()),
        rule=used_rule,
    )


def _check_mappings(
    op_mapping: Mapping[str, str],
    device_mapping: Mapping[str, str],
    op_index: Mapping[str, int],
    dev_index: Mapping[str, int],
) -> None:
    """A mapping may only name operators and devices the plan has."""
    for measured, target in op_mapping.items():
        if target not in op_index:
            raise InvalidInput(
                f"the mapping sends {measured!r} to {target!r}, which is not an operator of this plan",
                field="mapping.ops",
            )
    for measured, target in device_mapping.items():
        if target not in dev_index:
            raise InvalidInput(
                f"the device mapping sends {measured!r} to {target!r}, which is not a device of this plan's inventory",
                field="mapping.devices",
            )


def _match_by_name(events: TimelineEvents, op_index: Mapping[str, int], op_mapping: Mapping[str, str]) -> np.ndarray:
    """Each event's operator by its name (through the mapping), ``-1`` where none is called so."""
    ev_op = np.full(events.n_events, -1, dtype=np.int64)
    for i, name in enumerate(events.name):
        j = op_index.get(op_mapping.get(name, name))
        if j is not None:
            ev_op[i] = j
    return ev_op


def _steps(events: TimelineEvents, ev_op: np.ndarray) -> np.ndarray:
    """Each event's step: as annotated, else the how-many-th run of its operator it is (in time order)."""
    step = events.step.copy()
    matched = np.flatnonzero(ev_op >= 0)
    if matched.size and (step[matched] < 0).all():
        order = matched[np.lexsort((matched, events.start_s[matched], ev_op[matched]))]
        seen: Counter[int] = Counter()
        for i in order.tolist():
            step[i] = seen[ev_op[i]]
            seen[ev_op[i]] += 1
    step[step < 0] = 0
    return step


def _first_per_operator_step(events: TimelineEvents, ev_op: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The matched events kept: the earliest per (operator, step); later duplicates count as unmatched."""
    matched = np.flatnonzero(ev_op >= 0)
    keep = np.zeros(events.n_events, dtype=bool)
    first: set[tuple[int, int]] = set()
    for i in matched[np.lexsort((matched, events.start_s[matched]))].tolist():
        key = (int(ev_op[i]), int(step[i]))
        if key not in first:
            first.add(key)
            keep[i] = True
    return keep


def _match_transfers(
    events: TimelineEvents,
    tensor_names: Sequence[str],
    dev_index: Mapping[str, int],
    op_mapping: Mapping[str, str],
    device_mapping: Mapping[str, str],
) -> tuple[tuple[list[int], list[int], list[int], list[int], list[float]], list[str]]:
    """Measured transfers of the plan's tensors between two of its devices as columns
    ``(tensor, src, dst, step, duration_s)``, and the tensor names of the rest."""
    t_index = {str(t): k for k, t in enumerate(tensor_names)}
    tensor_col: list[int] = []
    src_col: list[int] = []
    dst_col: list[int] = []
    step_col: list[int] = []
    duration_col: list[float] = []
    unmatched: list[str] = []
    for tr in events.transfers:
        k = t_index.get(op_mapping.get(tr["tensor"], tr["tensor"]))
        s = dev_index.get(device_mapping.get(tr["src"], tr["src"]))
        d = dev_index.get(device_mapping.get(tr["dst"], tr["dst"]))
        if k is None or s is None or d is None or s == d:
            unmatched.append(tr["tensor"])
            continue
        tensor_col.append(k)
        src_col.append(s)
        dst_col.append(d)
        step_col.append(max(int(tr["step"]), 0))
        duration_col.append(float(tr["duration_s"]))
    return (tensor_col, src_col, dst_col, step_col, duration_col), unmatched


def _inside_matched(events: TimelineEvents, keep: np.ndarray) -> np.ndarray:
    """Unmatched events with a matched event among their enclosing events."""
    inside = np.zeros(events.n_events, dtype=bool)
    if not keep.any():
        return inside
    parent = events.parent
    for i in np.flatnonzero(~keep & (parent >= 0)).tolist():
        j = int(parent[i])
        while j >= 0 and not keep[j]:
            j = int(parent[j])
        inside[i] = j >= 0
    return inside


def _match_by_order(
    events: TimelineEvents,
    ev_op: np.ndarray,
    ev_device: np.ndarray,
    op_types: Sequence[str],
    op_device: np.ndarray,
    op_rank: np.ndarray | None,
) -> None:
    """Align unmatched top-level events with unmatched operators by class, per device and step."""
    n_ops = len(op_types)
    rank = np.arange(n_ops) if op_rank is None else np.asarray(op_rank)
    op_class = [OP_CLASS_NAMES[c] for c in op_class_of(list(op_types)).tolist()] if n_ops else []
    ev_class = (
        [OP_CLASS_NAMES[c] for c in op_class_of([normalize_op_name(nm) for nm in events.name]).tolist()]
        if events.n_events
        else []
    )
    taken_by_step: dict[int, set[int]] = {}
    for i in np.flatnonzero(ev_op >= 0).tolist():
        taken_by_step.setdefault(int(events.step[i]), set()).add(int(ev_op[i]))
    candidates = np.flatnonzero((ev_op < 0) & ~events.nested)
    groups: dict[tuple[int, tuple[str, int | str]], list[int]] = {}
    for i in candidates.tolist():
        where: tuple[str, int | str] = (
            ("device", int(ev_device[i])) if ev_device[i] >= 0 else ("thread", events.thread[i])
        )
        groups.setdefault((int(events.step[i]), where), []).append(i)
    by_rank = np.argsort(rank, kind="stable")
    for (step, where), members in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        members.sort(key=lambda i: (events.start_s[i], i))
        taken = taken_by_step.setdefault(step, set())
        pool = []
        if where[0] == "device":
            pool = [j for j in by_rank.tolist() if op_device[j] == where[1] and j not in taken]
        if not pool:  # a thread that names no device, or a device the plan did not use: every operator left
            pool = [j for j in by_rank.tolist() if j not in taken]
        pairs = _align([ev_class[i] for i in members], [op_class[j] for j in pool])
        for a, b in pairs:
            ev_op[members[a]] = pool[b]
            taken.add(pool[b])


def step_makespans_s(step: np.ndarray, start_s: np.ndarray, duration_s: np.ndarray) -> dict[int, float]:
    """Measured makespan of each step: last end minus first start of its matched events."""
    out: dict[int, float] = {}
    if step.size == 0:
        return out
    end = start_s + duration_s
    for s in np.unique(step).tolist():
        mask = step == s
        out[int(s)] = float(end[mask].max() - start_s[mask].min())
    return out
