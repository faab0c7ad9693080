"""Runtime feedback use cases: store a measured timeline, report accuracy, re-plan.

* ``submit_feedback``: parse the timeline (Chrome trace or simple JSON), match it to
  the plan's placed operators, store it in full with the matched observations
  (measured time next to what the uncalibrated model predicts for that run), then
  refit the tenant's calibration for the plan's inventory from its newest timelines.
  Where the plan was timed with memory tiers, the prediction is the roofline with or
  without the tiers' speed-ups, whichever the run bears out (:func:`~partitioners.feedback.calibration.tiers_realized`):
  a runtime that lays tensors out as planned gets them, an eager framework does not.
  Either way a tier speed-up is never learnt as a faster operator class.
* ``plan_accuracy``: prediction error of the model the plan was made with and of
  the current calibration, against every stored timeline of the plan.
* ``replan``: plan again with the calibration (and a load report: slow devices,
  gone devices), optionally with minimal movement, stored as a child plan.

Domain code only flushes; the request's session commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from partitioners.costmodel.costs import CostModel, op_class_of, transfer_times_s
from partitioners.costmodel.simulator import simulate
from partitioners.errors import InvalidInput
from partitioners.feedback.calibration import calibrated_cost_model, prediction_error, tiers_realized
from partitioners.feedback.replan import minimal_movement, placement_result
from partitioners.feedback.timeline import (
    TimelineEvents,
    TimelineMatch,
    match_timeline,
    parse_timeline,
    step_makespans_s,
)
from partitioners.graph.hypergraph import Hypergraph, topological_order
from partitioners.hardware.inventory import Inventory, inventory_to_json, link_class_ids, without_devices
from partitioners.placement.engine import PlacementOptions, PlacementResult, place
from service.domain.calibration import (
    CALIBRATION_WINDOW,
    PlanCalibration,
    calibration_in_use,
    calibration_read,
    plan_cost_model,
    refit_calibration,
)
from service.domain.compute_slots import ComputeSlots
from service.domain.idempotency import (
    StoredAnswer,
    check_idempotency_key,
    forget_idempotency_key,
    remember_idempotency_key,
)
from service.domain.ingest import canonical_hash
from service.domain.plan_document import plan_document
from service.domain.planning import PlanSubmission, SubmitOutcome, placement_options, submit_plan
from service.domain.stored_plan import PlanContext, plan_context, plan_op_times_s, plan_predictions
from service.errors import Conflict, NotFound, UnprocessableInput
from service.native_output import native_stdout_to_stderr
from service.schemas.feedback import FeedbackCreate, ReplanCreate
from service.settings import Settings
from service.storage import feedback as feedback_repo
from service.storage import plans as plans_repo
from service.storage.models import Feedback, utcnow

__all__ = ["submit_feedback", "feedback_read", "plan_accuracy", "replan", "REPLAN_ROUTE", "FEEDBACK_ROUTE"]

log = structlog.get_logger("hyperplace.feedback")
REPLAN_ROUTE = "POST /v1/plans/{plan_id}/replan"
FEEDBACK_ROUTE = "POST /v1/plans/{plan_id}/feedback"
#: Timelines with more events than this are refused (the body limit usually answers first).
MAX_TIMELINE_EVENTS = 2_000_000


def _topological_rank(graph: Hypergraph) -> np.ndarray:
    rank = np.empty(graph.n_ops, dtype=np.int64)
    rank[topological_order(graph)] = np.arange(graph.n_ops)
    return rank


# ----------------------------------------------------------------------------- feedback


def submit_feedback(
    session: Session, tenant_id: str, plan_id: str, request: FeedbackCreate, *, idempotency_key: str | None = None
) -> tuple[dict, int]:
    """Match, store and calibrate: ``(record with match report and new calibration, status code)``.

    A retried request with the same ``Idempotency-Key`` answers the stored record (200)
    without storing the timeline twice.
    """
    fingerprint = canonical_hash({"plan": plan_id, "request": request.model_dump(mode="json")})
    earlier = check_idempotency_key(session, tenant_id, idempotency_key, FEEDBACK_ROUTE, fingerprint)
    if earlier is not None:
        row = feedback_repo.get_feedback(session, tenant_id, earlier.resource_id)
        if row is not None:
            calibration = feedback_repo.get_calibration(session, tenant_id, row.inventory_hash)
            return feedback_read(row, detail=True, calibration=calibration_read(calibration)), 200
    ctx = plan_context(session, tenant_id, plan_id)
    if earlier is not None:  # the timeline it stored went with its plan: the key is free again
        forget_idempotency_key(session, tenant_id, idempotency_key, earlier)
    events = parse_timeline(request.timeline, request.format, max_events=MAX_TIMELINE_EVENTS)
    match = _match_or_explain(events, ctx, request)
    step_spans = step_makespans_s(match.step, match.start_s, match.duration_s)
    measured_makespan = float(np.median(list(step_spans.values()))) if step_spans else None
    report = _match_report(match, events, ctx.graph.n_ops, step_spans)
    derived = {
        "format": events.source_format,
        "mapping": request.mapping.model_dump(),
        "match": report,
        **_observations(match, ctx),
        "peak_memory_bytes": dict(events.peak_memory_bytes),
    }
    try:
        blob = feedback_repo.pack_timeline(derived, request.timeline)
    except ValueError:
        raise UnprocessableInput("The timeline holds NaN or infinity somewhere; JSON numbers must be finite.") from None
    row = _feedback_row(ctx, events, request, match, measured_makespan, blob)
    try:
        row = feedback_repo.insert_feedback(session, tenant_id, row)
    except IntegrityError:  # the plan's delete committed since plan_context read it
        if plans_repo.get_plan(session, tenant_id, ctx.plan_id) is None:
            raise NotFound(f"No plan with id {plan_id}; it was deleted while its timeline was being stored.") from None
        raise
    answer = remember_idempotency_key(
        session,
        tenant_id,
        idempotency_key,
        FEEDBACK_ROUTE,
        fingerprint,
        StoredAnswer(201, row.id, f"/v1/feedback/{row.id}"),
    )
    if answer.resource_id != row.id:  # a concurrent retry stored first: this insert rolls back with the request
        raise Conflict("A request with this Idempotency-Key is being processed; retry shortly.")
    calibration = refit_calibration(session, tenant_id, ctx.inventory_hash, ctx.inventory)
    log.info(
        "feedback stored",
        plan_id=ctx.plan_id,
        feedback_id=row.id,
        matched=match.matched_events,
        unmatched=match.unmatched_events,
    )
    return feedback_read(row, match=report, calibration=calibration_read(calibration)), 201


def _feedback_row(
    ctx: PlanContext,
    events: TimelineEvents,
    request: FeedbackCreate,
    match: TimelineMatch,
    measured_makespan_s: float | None,
    blob: bytes,
) -> Feedback:
    return Feedback(
        plan_id=ctx.plan_id,
        model_hash=ctx.model_hash,
        inventory_hash=ctx.inventory_hash,
        source_format=events.source_format,
        step_index=request.step_index,
        hardware_notes=request.hardware_notes,
        measured_at=request.measured_at,
        matched_events=match.matched_events,
        unmatched_events=match.unmatched_events,
        measured_makespan_s=measured_makespan_s,
        timeline=blob,
        created_at=utcnow(),
    )


def _match_or_explain(events: TimelineEvents, ctx: PlanContext, request: FeedbackCreate) -> TimelineMatch:
    """Match the timeline's events to the plan's operators, or say why none matched and how to fix it."""
    g, inv = ctx.graph, ctx.inventory
    match = match_timeline(
        events,
        g.op_names.tolist(),
        g.op_types.tolist(),
        ctx.placement,
        inv.device_names.tolist(),
        g.tensor_names.tolist(),
        op_rank=_topological_rank(g),
        op_mapping=request.mapping.ops,
        device_mapping=request.mapping.devices,
        rule=request.match,
    )
    if match.matched_events == 0:
        common = ", ".join(f"{name!r} x{count}" for name, count in match.unmatched_names[:5]) or "none"
        raise UnprocessableInput(
            f"The timeline matches none of the plan's {g.n_ops} operators ({events.n_events} operator events; "
            f"most frequent unmatched names: {common}). Name events after the plan's operators, send mapping.ops "
            "{measured name: plan operator}, or use match='order' to align by operator class."
        )
    return match


def _match_report(match: TimelineMatch, events: TimelineEvents, n_ops: int, step_spans: dict[int, float]) -> dict:
    """What matched and what did not, for the caller (the ``match`` of the answer)."""
    return {
        "rule": match.rule,
        "matched_events": match.matched_events,
        "unmatched_events": match.unmatched_events,
        "nested_events": match.nested_events,
        "ignored_events": dict(events.ignored),
        "unmatched_names": [[n, c] for n, c in match.unmatched_names],
        "ops_matched": int(np.unique(match.op).size),
        "ops_total": int(n_ops),
        "ops_on_other_device": match.ops_on_other_device,
        "transfers_matched": int(match.transfer_tensor.size),
        "steps": len(step_spans),
        "step_makespans_s": {str(k): v for k, v in sorted(step_spans.items())},
    }


def _observations(match: TimelineMatch, ctx: PlanContext) -> dict:
    """The matched operator runs and transfers, each beside what the uncalibrated cost model
    predicts for it: what calibration fits (stored, so refits never re-read the timeline)."""
    g, inv = ctx.graph, ctx.inventory
    base = plan_cost_model(ctx.options, None, inv)  # the plan's own profile, uncalibrated
    classes = op_class_of(g.op_types)
    main, tiered = plan_op_times_s(ctx, base, match.op, match.device)
    realized = tiers_realized(match.duration_s, main, tiered, match.device, classes[match.op])
    roofline = (tiered if realized else main) - base.device_parameters(inv)[2][match.device]
    device_names = inv.device_names
    t_bytes = g.tensor_bytes[match.transfer_tensor]
    t_pred = transfer_times_s(t_bytes, match.transfer_src, match.transfer_dst, inv, base)
    t_cls = link_class_ids(inv, match.transfer_src, match.transfer_dst)
    return {
        "observations": {
            "op": g.op_names[match.op].tolist(),
            "device": device_names[match.device].tolist(),
            "op_class": classes[match.op].astype(int).tolist(),
            "step": match.step.tolist(),
            "start_s": match.start_s.tolist(),
            "duration_s": match.duration_s.tolist(),
            "roofline_s": roofline.tolist(),
            # the roofline above includes the plan's tier speed-ups (the run got them)
            "tiers_realized": realized,
        },
        "transfers": {
            "tensor": g.tensor_names[match.transfer_tensor].tolist(),
            "src": device_names[match.transfer_src].tolist(),
            "dst": device_names[match.transfer_dst].tolist(),
            "step": match.transfer_step.tolist(),
            "link_class": t_cls.astype(int).tolist(),
            "predicted_s": t_pred.tolist(),
            "duration_s": match.transfer_duration_s.tolist(),
        },
    }


def feedback_read(
    row: Feedback,
    *,
    match: dict | None = None,
    calibration: dict | None = None,
    detail: bool = False,
    include_timeline: bool = False,
) -> dict:
    """The API shape of a stored timeline; ``detail`` adds the match report, ``include_timeline`` the document."""
    derived = feedback_repo.unpack_derived(row.timeline) if detail and match is None else {}
    out = {
        "id": row.id,
        "plan_id": row.plan_id,
        "model_hash": row.model_hash,
        "inventory_hash": row.inventory_hash,
        "source_format": row.source_format,
        "step_index": row.step_index,
        "hardware_notes": row.hardware_notes,
        "measured_at": row.measured_at.isoformat() if row.measured_at else None,
        "created_at": row.created_at.isoformat(),
        "matched_events": row.matched_events,
        "unmatched_events": row.unmatched_events,
        "measured_makespan_s": row.measured_makespan_s,
        "match": match if match is not None else derived.get("match"),
        "calibration": calibration,
        "timeline": feedback_repo.unpack_posted(row.timeline) if include_timeline else None,
        "links": {
            "self": f"/v1/feedback/{row.id}",
            "plan": f"/v1/plans/{row.plan_id}",
            "accuracy": f"/v1/plans/{row.plan_id}/accuracy",
            "replan": f"/v1/plans/{row.plan_id}/replan",
        },
    }
    return out


# ----------------------------------------------------------------------------- accuracy


def plan_accuracy(session: Session, tenant_id: str, plan_id: str) -> dict:
    """Prediction error before (the plan's model) and after (current calibration), against its timelines."""
    ctx = plan_context(session, tenant_id, plan_id)
    rows = feedback_repo.list_feedback_for_plan(session, tenant_id, plan_id, limit=CALIBRATION_WINDOW)
    if not rows:
        raise Conflict(
            f"Plan {plan_id} has no feedback yet; POST a measured timeline to /v1/plans/{plan_id}/feedback first."
        )
    op_index = {str(n): i for i, n in enumerate(ctx.graph.op_names)}
    dev_index = {str(n): i for i, n in enumerate(ctx.inventory.device_names)}
    samples: dict[tuple[int, int], list[float]] = {}
    spans: list[float] = []
    memory: dict[str, list[float]] = {}
    realized_votes = 0
    for row in rows:
        doc = feedback_repo.unpack_derived(row.timeline)
        obs = doc.get("observations", {})
        realized_votes += 1 if obs.get("tiers_realized") else -1
        for name, device, duration in zip(obs.get("op", []), obs.get("device", []), obs.get("duration_s", [])):
            if name in op_index and device in dev_index:
                samples.setdefault((op_index[name], dev_index[device]), []).append(float(duration))
        spans += [float(v) for v in doc.get("match", {}).get("step_makespans_s", {}).values()]
        for device, n_bytes in doc.get("peak_memory_bytes", {}).items():
            memory.setdefault(device, []).append(float(n_bytes))
    keys = sorted(samples)
    op = np.array([k[0] for k in keys], dtype=np.int64)
    device = np.array([k[1] for k in keys], dtype=np.int64)
    measured = np.array([float(np.median(samples[k])) for k in keys])
    measured_makespan = float(np.median(spans)) if spans else 0.0
    calibration = feedback_repo.get_calibration(session, tenant_id, ctx.inventory_hash)
    before_model = plan_cost_model(ctx.options, ctx.calibration or {}, ctx.inventory)
    after_model = plan_cost_model(
        ctx.options, (calibration.factors if calibration else ctx.calibration) or {}, ctx.inventory
    )
    out = {
        "plan_id": ctx.plan_id,
        "n_timelines": len(rows),
        "n_steps": len(spans),
        "calibration": calibration_read(calibration),
    }
    # before: what the plan claimed (with its tiers, if it was timed with them); after:
    # the calibration, with the tiers only if the plan's timelines bore them out
    for label, model, with_tiers in (("before", before_model, True), ("after", after_model, realized_votes > 0)):
        predicted_ops, predicted_makespan = plan_predictions(ctx, model, op, device, with_tiers=with_tiers)
        out[label] = prediction_error(predicted_ops, measured, predicted_makespan, measured_makespan)
    predicted_peak = ctx.summary.get("peak_memory_bytes", {})
    out["memory"] = [
        {
            "device": dev,
            "measured_bytes": float(np.median(values)),
            "predicted_bytes": predicted_peak.get(dev),
            "rel_error": (abs(predicted_peak[dev] - float(np.median(values))) / float(np.median(values)))
            if predicted_peak.get(dev) is not None and np.median(values) > 0
            else None,
        }
        for dev, values in sorted(memory.items())
    ]
    return out


# ----------------------------------------------------------------------------- replan


def _load_report_devices(request: ReplanCreate, inv: Inventory) -> tuple[list[str], dict[str, float]]:
    """The report's gone devices (sorted) and slow ones (not gone), once every name is one of the inventory's."""
    known = {str(n) for n in inv.device_names}
    report = request.load_report
    for field, names in (("gone_devices", list(report.gone_devices)), ("slow_devices", list(report.slow_devices))):
        unknown = sorted(set(names) - known)
        if unknown:
            raise InvalidInput(
                f"load_report.{field} names devices this plan's inventory does not have: {', '.join(unknown[:10])}",
                field=f"load_report.{field}",
            )
    gone = sorted(set(report.gone_devices))
    slow = {k: float(v) for k, v in sorted(report.slow_devices.items()) if k not in gone}
    return gone, slow


@dataclass(frozen=True)
class _ReplanOutcome:
    result: PlacementResult
    current: np.ndarray  # (n_ops,) the parent's device of each operator, -1 where it is gone
    kept_makespan_s: float  # the parent's placement (displaced operators placed anew) under the new model
    makespan_s: float  # the answer's
    kept_parent: bool


def _place_against_parent(
    graph: Hypergraph,
    inventory: Inventory,
    opts: PlacementOptions,
    model: CostModel,
    parent_ops: dict,
    request: ReplanCreate,
) -> _ReplanOutcome:
    """Place anew (or with minimal movement from the parent), and keep the parent's placement
    unless the new one gains at least ``min_gain_fraction``: a gain within the model's error
    may be a loss on the real cluster."""
    with native_stdout_to_stderr():  # METIS prints some diagnostics to descriptor 1
        result = place(graph, inventory, opts, cost_model=model)
    g = result.graph
    index = {str(n): i for i, n in enumerate(inventory.device_names)}
    current = np.array([index.get(parent_ops.get(str(n)), -1) for n in g.op_names], dtype=np.int64)
    if request.minimal_movement:
        movement = minimal_movement(
            g,
            inventory,
            current,
            result.placement,
            cost_model=model,
            tolerance_fraction=request.gain_tolerance_fraction,
            memory_budget_bytes=result.memory_budget_bytes,
        )
        if (movement.placement != result.placement).any():
            result = placement_result(graph, inventory, opts, movement.placement, cost_model=model)
    kept = np.where(current < 0, result.placement, current)
    kept_makespan = float(simulate(g, inventory, kept, cost_model=model, record_timeline=False).makespan_s)
    new_makespan = float(simulate(g, inventory, result.placement, cost_model=model, record_timeline=False).makespan_s)
    kept_parent = False
    if kept_makespan - new_makespan < request.min_gain_fraction * kept_makespan:
        try:
            result = placement_result(graph, inventory, opts, kept, cost_model=model, name="kept")
            new_makespan, kept_parent = kept_makespan, True
        except InvalidInput:  # the kept placement no longer fits in memory: take the new plan
            pass
    return _ReplanOutcome(result, current, kept_makespan, new_makespan, kept_parent)


def replan(
    session: Session,
    tenant_id: str,
    plan_id: str,
    request: ReplanCreate,
    settings: Settings,
    *,
    idempotency_key: str | None = None,
    slots: ComputeSlots | None = None,
) -> SubmitOutcome:
    """A child plan of ``plan_id`` with the calibrated model and the load report applied.

    Planned now (201, with ``summary["replan"]``: gains and moves), or, for a graph
    over ``settings.sync_max_ops`` without minimal movement, queued as a job (202)
    that a worker plans with the same factors; a queued re-plan has no gain figures.
    """
    ctx = plan_context(session, tenant_id, plan_id)
    inv = ctx.inventory
    gone, slow = _load_report_devices(request, inv)
    calibration = (
        calibration_in_use(feedback_repo.get_calibration(session, tenant_id, ctx.inventory_hash))
        if request.use_calibration
        else None
    )
    calibrated = plan_cost_model(ctx.options, calibration.factors if calibration else {}, inv)
    model = calibrated_cost_model(calibrated, device_slowdown=slow, inventory=inv)
    new_inventory = without_devices(inv, gone) if gone else inv
    parent_makespan = float(simulate(ctx.graph, inv, ctx.placement, cost_model=model, record_timeline=False).makespan_s)
    calibration_version = calibration.version if calibration else None
    replan_parts = {
        "parent": ctx.plan_id,
        "calibration_version": calibration_version,
        "slow_devices": slow,
        "gone_devices": gone,
        "minimal_movement": request.minimal_movement,
        "gain_tolerance_fraction": request.gain_tolerance_fraction if request.minimal_movement else None,
        "min_gain_fraction": request.min_gain_fraction,
    }

    def compute(graph: Hypergraph, inventory: Inventory, options: dict, cost_model: CostModel | None):
        started = time.perf_counter()
        outcome = _place_against_parent(graph, inventory, placement_options(options), model, ctx.ops, request)
        strategy, summary, body = plan_document(outcome.result, inventory)
        summary["planning_s"] = round(time.perf_counter() - started, 4)
        kept_makespan, new_makespan = outcome.kept_makespan_s, outcome.makespan_s
        summary["replan"] = {
            "parent_id": ctx.plan_id,
            "calibration_version": calibration_version,
            "parent_makespan_s": parent_makespan,
            "kept_makespan_s": kept_makespan,
            "makespan_s": new_makespan,
            "gain_s": kept_makespan - new_makespan,
            "gain_fraction": (kept_makespan - new_makespan) / kept_makespan if kept_makespan > 0 else 0.0,
            "ops_moved": int((outcome.result.placement != outcome.current).sum()),
            "ops_displaced": int((outcome.current < 0).sum()),
            "ops_total": int(outcome.result.graph.n_ops),
            "minimal_movement": request.minimal_movement,
            "kept_parent": outcome.kept_parent,
            "slow_devices": slow,
            "gone_devices": gone,
        }
        return strategy, summary, body

    submission = PlanSubmission(
        inventory=inventory_to_json(new_inventory),
        options=dict(ctx.options),
        graph_id=ctx.graph_id,
        extra_cache_parts={"replan": replan_parts},
        calibration=PlanCalibration.of(model, new_inventory),
        stored_graph=ctx.stored_graph,
    )
    # Like POST /v1/plans, a graph too large to plan within the request becomes a job;
    # the worker plans it with the calibration's factors (calibration and load report),
    # stored with the plan. Minimal movement and the gain figures need the parent at
    # hand, so they always run now.
    queue = ctx.n_source_ops > settings.sync_max_ops and not request.minimal_movement
    return submit_plan(
        session,
        tenant_id,
        submission,
        settings,
        idempotency_key=idempotency_key,
        parent_id=ctx.plan_id,
        route=REPLAN_ROUTE,
        compute=None if queue else compute,
        slots=slots,
    )
