"""Runtime feedback: measured timelines, calibration, accuracy and re-plans (shapes under /v1)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from partitioners.feedback.calibration import MAX_DEVICE_SLOWDOWN, MIN_DEVICE_SLOWDOWN
from partitioners.feedback.timeline import MAX_STEP, MAX_TIMELINE_SPAN_S, MAX_TIMESTAMP_S
from service.schemas.common import Name, RequestModel, Text
from service.schemas.plans import Answer, PlanRead, ReplanSummary

__all__ = [
    "FeedbackMapping",
    "FeedbackCreate",
    "MatchReport",
    "FeedbackRead",
    "CalibrationRead",
    "ErrorStats",
    "MemoryAccuracy",
    "AccuracyRead",
    "LoadReport",
    "ReplanCreate",
    "ReplanSummary",
    "ReplanRead",
]

MAX_MAPPING = 200_000


class FeedbackMapping(RequestModel):
    """Names in the timeline that differ from the plan's."""

    ops: dict[Name, Name] = Field(
        default_factory=dict,
        max_length=MAX_MAPPING,
        description="Measured operator (or tensor) name -> plan operator (or tensor) name.",
    )
    devices: dict[Name, Name] = Field(
        default_factory=dict,
        max_length=4096,
        description="'pid:tid', 'pid', thread name, process name or measured device name -> inventory device name.",
    )


class FeedbackCreate(RequestModel):
    """A measured timeline of one run of a plan, with the run's metadata."""

    format: Literal["auto", "chrome", "simple"] = Field(
        "auto",
        description="chrome: trace-event JSON (torch.profiler export_chrome_trace); simple: {ops: [...]}; "
        "auto: by shape.",
    )
    timeline: dict[str, Any] | list[Any] = Field(
        description="The timeline document, stored in full (compressed). See docs/feedback.md for both forms. "
        f"Times are finite and non-negative: timestamps up to {MAX_TIMESTAMP_S:g} s, each duration and the whole "
        f"timeline (first start to last end) up to {MAX_TIMELINE_SPAN_S:g} s (one week); steps (and "
        f"ProfilerStep#N) are integers up to {MAX_STEP}."
    )
    mapping: FeedbackMapping = Field(default_factory=FeedbackMapping)
    match: Literal["auto", "name", "order"] = Field(
        "auto",
        description="name: event names (after mapping) are plan operator names; order: names first, then the rest "
        "aligned by operator class in topological order per device and step; auto: name, or order when names match "
        "nothing.",
    )
    measured_at: datetime | None = Field(None, strict=False, description="When the run happened (ISO 8601).")
    hardware_notes: Text = Field("", description="Driver, clocks, anything that explains the numbers.")
    step_index: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = Field(
        None, description="Training/inference step the run was."
    )


class MatchReport(Answer):
    rule: Literal["name", "order"]
    matched_events: int
    unmatched_events: int
    nested_events: int
    ignored_events: dict[str, int]
    unmatched_names: list[tuple[str, int]]
    ops_matched: int
    ops_total: int
    ops_on_other_device: int
    transfers_matched: int
    steps: int
    step_makespans_s: dict[str, float]


class CalibrationRead(Answer):
    inventory_hash: str
    version: int
    n_timelines: int
    updated_at: datetime
    factors: dict[str, Any]


class FeedbackRead(Answer):
    id: str
    plan_id: str
    model_hash: str
    inventory_hash: str
    source_format: str
    step_index: int | None = None
    hardware_notes: str = ""
    measured_at: datetime | None = None
    created_at: datetime
    matched_events: int
    unmatched_events: int
    measured_makespan_s: float | None = None
    match: MatchReport | None = None
    calibration: CalibrationRead | None = None
    timeline: dict[str, Any] | list[Any] | None = None
    links: dict[str, str] = Field(default_factory=dict)


class ErrorStats(Answer):
    op_median_rel_error: float | None
    op_p90_rel_error: float | None
    n_ops: int
    makespan_rel_error: float | None
    predicted_makespan_s: float
    measured_makespan_s: float


class MemoryAccuracy(Answer):
    device: str
    measured_bytes: float = Field(description="Median over the timelines' peaks.")
    predicted_bytes: float | None = Field(description="The plan's predicted peak; null for a device it does not use.")
    rel_error: float | None


class AccuracyRead(Answer):
    plan_id: str
    n_timelines: int
    n_steps: int
    calibration: CalibrationRead | None
    before: ErrorStats = Field(description="The cost model the plan was made with.")
    after: ErrorStats = Field(description="The tenant's current calibration for this inventory.")
    memory: list[MemoryAccuracy] = Field(
        default_factory=list, description="Measured vs predicted peak memory per device."
    )


class LoadReport(RequestModel):
    slow_devices: dict[
        Name, Annotated[float, Field(ge=MIN_DEVICE_SLOWDOWN, le=MAX_DEVICE_SLOWDOWN, allow_inf_nan=False)]
    ] = Field(
        default_factory=dict,
        max_length=100_000,
        description="Device -> how many times slower than the model says (1.6 = 60% slower, 0.5 = twice as "
        f"fast), from {MIN_DEVICE_SLOWDOWN:g} to {MAX_DEVICE_SLOWDOWN:g}: a device 1000x off the model is an "
        "error in the report, and a factor near zero would draw every operator onto that device.",
    )
    gone_devices: list[Name] = Field(
        default_factory=list, max_length=100_000, description="Devices that are no longer available."
    )


class ReplanCreate(RequestModel):
    load_report: LoadReport = Field(default_factory=LoadReport)
    use_calibration: bool = Field(True, description="Plan with the tenant's calibration for the parent's inventory.")
    minimal_movement: bool = Field(False, description="Keep as many operators in place as the gain allows.")
    gain_tolerance_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Share of the predicted gain minimal movement may give up.",
    )
    min_gain_fraction: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Keep the parent's placement (moving only operators of gone devices) unless the new one is "
        "predicted this much faster: a gain within the calibrated model's error may be a loss.",
    )


class ReplanRead(PlanRead):
    replan: ReplanSummary | None = None
