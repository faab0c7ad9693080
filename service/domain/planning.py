"""Planning use case: a submission -> a stored plan (computed now, or queued as a job).

Flow of ``submit_plan``:

1. ingest the graph (JSON, ONNX bytes, or a stored graph by id) and the inventory,
   refuse operators whose ``device_types`` match no device of the inventory (a 422
   now, for large graphs too, rather than a failed job later), and derive the
   cache key from model hash, inventory hash and options;
2. a stored plan with that key is the answer (no recomputation);
3. small graphs are planned right here, outside any transaction, in one of the
   server's planning slots (``service.domain.compute_slots``); large ones, and small
   ones that find every slot busy, become a queued plan plus a job row for a worker
   (:mod:`service.domain.jobs` runs it; this module knows nothing of jobs);
4. graph, inventory, plan (and job, and Idempotency-Key) are written in one
   transaction by the request's session.

The graph is read once: it is hashed and planned from the arrays ingestion built,
renumbered into name order by permutation, and a plan computed now is answered from
the document in memory (``SubmitOutcome.body``), not from its compressed copy. A
re-plan's cost model arrives as a typed :class:`~service.domain.calibration.PlanCalibration`,
not inside the user's options.

``delete_plan`` is the other end of a plan's life: it takes with the plan what was
derived from it (timelines, Idempotency-Keys, the calibration's fit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from partitioners.costmodel.costs import CostModel, cost_model_to_json
from partitioners.costmodel.profiles import cost_model_spec_from_json, resolve_cost_model
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.device_types import device_type_constraint
from partitioners.hardware.inventory import Inventory, inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from service.domain.calibration import PlanCalibration, options_with_factors, refit_calibration
from service.domain.compute_slots import ComputeSlots
from service.domain.idempotency import (
    StoredAnswer,
    check_idempotency_key,
    forget_idempotency_key,
    remember_idempotency_key,
)
from service.domain.ingest import (
    IngestedGraph,
    IngestedInventory,
    canonical_hash,
    ingest_inventory,
    ingest_json_graph,
    ingest_onnx_graph,
    ingested_onnx_graph,
    read_stored_graph,
)
from service.domain.plan_document import plan_document
from service.errors import Conflict, NotFound
from service.native_output import native_stdout_to_stderr
from service.settings import Settings
from service.storage import feedback as feedback_repo
from service.storage import plans as plans_repo
from service.storage.blobs import pack_json, unpack_json
from service.storage.models import Graph, InventoryRow, Plan, utcnow

__all__ = [
    "PlanSubmission",
    "SubmitOutcome",
    "submit_plan",
    "delete_plan",
    "compute_plan",
    "load_plan_inputs",
    "cache_key_for",
    "placement_options",
]

log = structlog.get_logger("hyperplace.planning")
ROUTE = "POST /v1/plans"


@dataclass
class PlanSubmission:
    """What a POST carried, before ingestion: exactly one of graph / onnx / graph_id.

    ``options`` are the user's (PlanOptions) alone; ``calibration`` is the cost model
    a re-plan is made with (None: the default model). ``stored_graph`` is the graph of
    ``graph_id`` when the caller has read it from storage already (a re-plan), so that
    it is not read twice.
    """

    inventory: dict
    options: dict
    graph: dict | None = None
    onnx_bytes: bytes | None = None
    onnx_graph: Hypergraph | None = None  # ``onnx_bytes`` imported already (on the event loop: import_onnx_model)
    graph_id: str | None = None
    extra_cache_parts: dict = field(default_factory=dict)
    calibration: PlanCalibration | None = None
    stored_graph: IngestedGraph | None = None


@dataclass(frozen=True)
class SubmitOutcome:
    """The plan that answers a submission.

    ``body`` is the plan's result document when this request computed it (the
    answer is built from it, not from the compressed copy just stored); None when the
    plan was found stored, or is queued.
    """

    plan: Plan
    status_code: int  # 201 created, 200 cached, 202 queued
    cached: bool
    body: dict | None = None


def cache_key_for(
    model_hash: str, inventory_hash: str, options: dict, extra: dict | None = None, inventory: Inventory | None = None
) -> str:
    """The plan cache key: model hash, inventory hash, options and any extra parts, hashed canonically.

    The options' ``cost_model`` enters as the resolved model (profile and every
    parameter, :func:`~partitioners.costmodel.costs.cost_model_to_json`), so a profile
    named with its own values, or left out for the default, keys the same plan, and any
    parameter that changes the timing keys another.
    """
    if inventory is not None:
        resolved = resolve_cost_model(cost_model_spec_from_json(options.get("cost_model")), inventory)
        options = {**options, "cost_model": cost_model_to_json(resolved)}
    return canonical_hash({"model": model_hash, "inventory": inventory_hash, "options": options, **(extra or {})})


#: ``options.time_limit_s`` when a stored plan's options predate it.
PLAN_TIME_LIMIT_DEFAULT_S = 10.0
#: ``strategy="exact"`` with a longer time limit is planned as a job (202), not inside the
#: request: the solver holds a planning slot for its whole limit.
SYNC_EXACT_MAX_S = 10.0


def placement_options(options: dict) -> PlacementOptions:
    return PlacementOptions(
        objective=options["objective"],
        mode=options["mode"],
        micro_batches=options["micro_batches"],
        pipeline=options["pipeline"],
        max_devices=options["max_devices"],
        memory_headroom_fraction=options["memory_headroom_fraction"],
        strategy=options["strategy"],
        seed=options["seed"],
        count_idle_devices=options.get("count_idle_devices", True),
        fusion=options.get("fusion", "none"),
        cost_model=cost_model_spec_from_json(options.get("cost_model")),
        # plans stored before strategy "exact" have no time limit in their options
        time_limit_s=options.get("time_limit_s", PLAN_TIME_LIMIT_DEFAULT_S),
    )


def compute_plan(
    graph: Hypergraph,
    inventory: Inventory,
    options: dict,
    cost_model: CostModel | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> tuple[str, dict, dict]:
    """Place and describe: ``(strategy, summary, body)`` where body is the stored result document."""
    started = time.perf_counter()
    with native_stdout_to_stderr():  # METIS prints some diagnostics to descriptor 1
        result = place(graph, inventory, placement_options(options), cost_model=cost_model, on_progress=on_progress)
    strategy, summary, body = plan_document(result, inventory)
    summary["planning_s"] = round(time.perf_counter() - started, 4)
    return strategy, summary, body


def _ingest_graph(session: Session, tenant_id: str, submission: PlanSubmission, settings: Settings) -> IngestedGraph:
    if submission.stored_graph is not None:
        return submission.stored_graph
    if submission.graph_id is not None:
        row = plans_repo.get_graph(session, tenant_id, submission.graph_id)
        if row is None:
            raise NotFound(
                f"No graph with id {submission.graph_id}; submit the graph itself, or use the id that "
                "GET /v1/models/{model_hash} returns for one of your plans' model_hash."
            )
        return read_stored_graph(unpack_json(row.canonical), row.model_hash, row.source_format)
    if submission.onnx_graph is not None:
        return ingested_onnx_graph(submission.onnx_graph)
    if submission.onnx_bytes is not None:
        return ingest_onnx_graph(
            submission.onnx_bytes,
            dims=submission.options.get("dims", {}),
            max_ops=settings.max_graph_ops,
            memory_bytes=settings.onnx_import_memory_bytes,
        )
    return ingest_json_graph(submission.graph, max_ops=settings.max_graph_ops)


def _graph_row(ingested: IngestedGraph) -> Graph:
    """The graph's row, built only when the tenant does not have it yet (it compresses the canonical document)."""
    summary = ingested.summary
    return Graph(
        model_hash=ingested.model_hash,
        name=str(summary.get("name", ""))[:200],
        source_format=ingested.source_format,
        n_ops=int(summary["n_ops"]),
        n_tensors=int(summary["n_tensors"]),
        total_flops=float(summary.get("total_flops", 0.0)),
        parameter_bytes=float(summary.get("parameter_bytes", 0.0)),
        activation_bytes=float(summary.get("activation_bytes", 0.0)),
        warnings=list(ingested.graph.warnings)[:200],
        canonical=pack_json(ingested.canonical_document()),
    )


def _inventory_row(ingested: IngestedInventory) -> InventoryRow:
    return InventoryRow(
        inventory_hash=ingested.inventory_hash,
        name=str(ingested.inventory.name)[:200],
        n_devices=ingested.inventory.n_devices,
        body=pack_json(ingested.canonical_document()),
    )


def submit_plan(
    session: Session,
    tenant_id: str,
    submission: PlanSubmission,
    settings: Settings,
    *,
    idempotency_key: str | None = None,
    parent_id: str | None = None,
    route: str = ROUTE,
    compute: Callable[[Hypergraph, Inventory, dict, CostModel | None], tuple[str, dict, dict]] | None = None,
    slots: ComputeSlots | None = None,
) -> SubmitOutcome:
    """Ingest, look up the cache, plan (now or as a job) and store; see the module docstring.

    ``compute`` replaces :func:`compute_plan` and always runs now (re-plans, which
    compare against their parent); ``route`` scopes the Idempotency-Key. ``slots``
    bounds how many plans are computed inside requests at once: with none free, a graph
    small enough to plan now is queued as a job instead, and ``compute`` waits up to
    ``settings.sync_plan_wait_s`` for one, then is a 503 (:class:`ServerBusy`).
    """
    ingested_inventory = ingest_inventory(submission.inventory, max_devices=settings.max_plan_devices)
    ingested_graph = _ingest_graph(session, tenant_id, submission, settings)
    # a device type no device has is a 422 now, not a failed job later (one pass over the operators)
    device_type_constraint(ingested_graph.graph, ingested_inventory.inventory)
    calibration = submission.calibration
    # the options a plan stores and keys its cache with: the user's, plus a re-plan's factors
    stored_options = options_with_factors(submission.options, calibration.factors if calibration else None)
    key = cache_key_for(
        ingested_graph.model_hash,
        ingested_inventory.inventory_hash,
        stored_options,
        submission.extra_cache_parts,
        ingested_inventory.inventory,
    )

    earlier = check_idempotency_key(session, tenant_id, idempotency_key, route, key)
    if earlier is not None:
        plan = plans_repo.get_plan(session, tenant_id, earlier.resource_id)
        if plan is not None:
            return SubmitOutcome(plan=plan, status_code=earlier.status_code, cached=earlier.status_code == 200)
    # ``earlier`` is now None, or names a plan deleted since: then the key is free
    # again and this is a new request (see service.domain.idempotency).
    stale_answer = earlier
    existing = plans_repo.get_plan_by_cache_key(session, tenant_id, key)
    if existing is not None:
        answer = _bind_key(
            session,
            tenant_id,
            idempotency_key,
            route,
            key,
            stale_answer,
            StoredAnswer(200, existing.id, plans_repo.plan_location(existing.id)),
        )
        return _outcome(session, tenant_id, existing, answer)

    n_ops = ingested_graph.graph.n_ops
    long_exact = (
        submission.options.get("strategy") == "exact"
        and submission.options.get("time_limit_s", PLAN_TIME_LIMIT_DEFAULT_S) > SYNC_EXACT_MAX_S
    )
    run_now = compute is not None or (n_ops <= settings.sync_max_ops and not long_exact)
    computed = None
    if run_now:
        # End the read transaction before the CPU-heavy part: on SQLite an open
        # transaction holds the database lock (BEGIN IMMEDIATE) for its whole length.
        session.rollback()
        # a caller outside a server plans without a limit
        slots = slots or ComputeSlots("planning inside a request", 1, settings.sync_plan_wait_s)
        with slots.hold(wait=compute is not None) as free:
            if free:
                computed = (compute or compute_plan)(
                    ingested_graph.as_stored(),
                    ingested_inventory.inventory,
                    submission.options,
                    calibration.cost_model if calibration else None,
                )
            elif compute is not None:
                raise slots.busy()

    graph_row = plans_repo.get_or_create_graph(
        session, tenant_id, ingested_graph.model_hash, lambda: _graph_row(ingested_graph)
    )
    inventory_row = plans_repo.get_or_create_inventory(session, tenant_id, _inventory_row(ingested_inventory))
    now = utcnow()
    plan = Plan(
        graph_id=graph_row.id,
        inventory_id=inventory_row.id,
        parent_id=parent_id,
        model_hash=ingested_graph.model_hash,
        inventory_hash=ingested_inventory.inventory_hash,
        cache_key=key,
        options=stored_options,
        created_at=now,
        updated_at=now,
    )
    body = None
    if computed is not None:
        strategy, summary, body = computed
        body["warnings"] = list(ingested_graph.graph.warnings)[:500]
        plan.status, plan.progress, plan.strategy, plan.summary = "done", 1.0, strategy, summary
        plan.result = pack_json(body)
        plan.finished_at = now
    else:
        plan.status = "queued"
    queued = computed is None
    try:
        plan, created = plans_repo.insert_plan(session, tenant_id, plan, queue_job=queued)
    except IntegrityError:
        # A re-plan whose parent was deleted while it planned: the child's foreign key
        # finds no parent. Retrying cannot help, so say what happened.
        if parent_id is not None and plans_repo.get_plan(session, tenant_id, parent_id) is None:
            raise NotFound(f"No plan with id {parent_id}; it was deleted while it was being re-planned.") from None
        raise
    status_code = (202 if queued else 201) if created else 200
    answer = _bind_key(
        session,
        tenant_id,
        idempotency_key,
        route,
        key,
        stale_answer,
        StoredAnswer(status_code, plan.id, plans_repo.plan_location(plan.id)),
    )
    outcome = _outcome(session, tenant_id, plan, answer, body if created else None)
    log.info("plan submitted", plan_id=outcome.plan.id, status=outcome.plan.status, n_ops=n_ops, created=created)
    return outcome


def _bind_key(
    session: Session,
    tenant_id: str,
    idempotency_key: str | None,
    route: str,
    fingerprint: str,
    stale_answer: StoredAnswer | None,
    answer: StoredAnswer,
) -> StoredAnswer:
    """Store ``answer`` under the key (freeing it first if it named a deleted plan); the answer that won."""
    if stale_answer is not None:
        forget_idempotency_key(session, tenant_id, idempotency_key, stale_answer)
    return remember_idempotency_key(session, tenant_id, idempotency_key, route, fingerprint, answer)


def _outcome(
    session: Session, tenant_id: str, plan: Plan, answer: StoredAnswer, body: dict | None = None
) -> SubmitOutcome:
    """The answer the key holds (ours, or a concurrent request's with the same key and request),
    ``cached`` exactly when it is a 200, as on a replay; ``body`` is ``plan``'s result document
    when this request computed it, kept only if the answer is that plan."""
    if answer.resource_id != plan.id:
        plan, body = plans_repo.get_plan(session, tenant_id, answer.resource_id), None
        if plan is None:  # the winner's plan was deleted meanwhile; a retry plans again
            raise Conflict("The plan made for this Idempotency-Key was deleted meanwhile; send the request again.")
    return SubmitOutcome(plan=plan, status_code=answer.status_code, cached=answer.status_code == 200, body=body)


def delete_plan(session: Session, tenant_id: str, plan_id: str) -> bool:
    """Delete a plan and what was derived from it; False if the tenant has no such plan.

    Goes with it: its job, its timelines (foreign-key cascade), the Idempotency-Keys
    that answered with the plan or one of its timelines (a retry with one plans
    again), and, where it had timelines, the calibration fitted from them, refitted
    from the inventory's remaining timelines as a new version. Its child plans stay,
    with no parent. The plan is locked first so a timeline or a child being written
    for it concurrently lands before the delete or fails after it with a 404.
    """
    plan = plans_repo.lock_plan(session, tenant_id, plan_id)
    if plan is None:
        return False
    had_timelines = feedback_repo.plan_has_feedback(session, tenant_id, plan_id)
    plans_repo.delete_idempotency_keys_of_plan(session, tenant_id, plan_id)
    if not plans_repo.delete_plan(session, tenant_id, plan_id):
        return False
    if had_timelines:
        inventory_row = plans_repo.get_inventory(session, tenant_id, plan.inventory_id)
        inventory = inventory_from_json(unpack_json(inventory_row.body))
        refit_calibration(session, tenant_id, plan.inventory_hash, inventory)
    log.info("plan deleted", plan_id=plan_id, refitted_calibration=had_timelines)
    return True


def load_plan_inputs(session: Session, plan: Plan) -> tuple[IngestedGraph, Inventory]:
    """A stored plan's graph (read once from its canonical document, already in name order) and inventory."""
    graph_row = plans_repo.get_graph(session, plan.tenant_id, plan.graph_id)
    inventory_row = plans_repo.get_inventory(session, plan.tenant_id, plan.inventory_id)
    graph = read_stored_graph(unpack_json(graph_row.canonical), graph_row.model_hash, graph_row.source_format)
    return graph, inventory_from_json(unpack_json(inventory_row.body))
