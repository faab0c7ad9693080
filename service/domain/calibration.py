"""Calibration use case: fit a tenant's cost-model factors for one inventory from its stored timelines.

Factors live in the ``calibrations`` table, one row per (tenant, inventory hash),
with a version that increments on every refit: after each new timeline, and after
a plan with timelines is deleted (then from the timelines left, so nothing fitted
from deleted data survives; an empty calibration when none is left). The JSON document is::

    {"type_class":   [{"device_type", "op_class", "multiplier"}],
     "device_class": [{"device", "op_class", "multiplier", "n_ops"}],
     "device_slowdown": {device: factor},
     "link_class": {link class: multiplier}, "n_transfers": {link class: n},
     "launch_overhead_s": fitted per-operator overhead or null, "n_observations": n}

``cost_model_from_factors`` turns it back into a :class:`~partitioners.costmodel.costs.CostModel`
(the planning worker uses it for re-plans queued as jobs), ``factors_of`` the other way.

A plan made with a cost model other than the default (a re-plan) reaches planning
with a :class:`PlanCalibration`, the model and its factors document together. The
document is part of the plan's cache key and is stored with the plan, beside the
user's options under :data:`STORED_FACTORS_KEY` (the layout plans have always been
stored and keyed with, so keys and stored rows stay valid); :func:`options_with_factors`
and :func:`split_stored_options` are the only code that knows that layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy.orm import Session

from partitioners.costmodel.costs import OP_CLASS_NAMES, CostModel
from partitioners.costmodel.profiles import cost_model_spec_from_json, resolve_cost_model
from partitioners.feedback.calibration import CalibrationFit, fit_calibration
from partitioners.hardware.inventory import LINK_CLASS_NAMES, Inventory
from service.storage import feedback as feedback_repo
from service.storage.models import Calibration, utcnow

__all__ = [
    "CALIBRATION_WINDOW",
    "EMPTY_FIT",
    "STORED_FACTORS_KEY",
    "PlanCalibration",
    "cost_model_from_factors",
    "plan_cost_model",
    "factors_of",
    "options_with_factors",
    "split_stored_options",
    "factors_document",
    "refit_calibration",
    "calibration_read",
    "calibration_in_use",
]

#: Calibration fits the newest this-many timelines of an inventory.
CALIBRATION_WINDOW = 50


def cost_model_from_factors(factors: dict | None, inventory: Inventory, base: CostModel | None = None) -> CostModel:
    """The cost model a factors document describes, restricted to ``inventory``'s devices and types."""
    base = base or CostModel()
    factors = factors or {}
    names = {str(n) for n in inventory.device_names}
    types = {str(t) for t in inventory.device_types}
    table: dict[tuple[str, str], float] = {}
    for entry in factors.get("type_class", []):
        if entry.get("device_type") in types and entry.get("op_class") in OP_CLASS_NAMES:
            table[(entry["device_type"], entry["op_class"])] = float(entry["multiplier"])
    for entry in factors.get("device_class", []):
        if entry.get("device") in names and entry.get("op_class") in OP_CLASS_NAMES:
            table[(entry["device"], entry["op_class"])] = float(entry["multiplier"])
    links = {k: float(v) for k, v in factors.get("link_class", {}).items() if k in LINK_CLASS_NAMES}
    launch = factors.get("launch_overhead_s")
    return replace(
        base,
        launch_overhead_s=float(launch) if launch is not None else base.launch_overhead_s,
        device_class_multiplier={**base.device_class_multiplier, **table},
        link_class_multiplier={**base.link_class_multiplier, **links},
    )


def plan_cost_model(options: Mapping, factors: dict | None, inventory: Inventory) -> CostModel:
    """The cost model a plan with these (user's) options and calibration factors is timed with.

    The options' ``cost_model`` (profile and parameters, per-device entries of the
    inventory) is the base; calibration factors, where there are any, apply on top of
    it (calibration > profile; a node's own ``time_s`` still wins over both).
    """
    base = resolve_cost_model(cost_model_spec_from_json(options.get("cost_model")), inventory)
    return cost_model_from_factors(factors, inventory, base) if factors is not None else base


def factors_of(model: CostModel, inventory: Inventory) -> dict:
    """The factors document of a cost model's multipliers: per device type where the key is one of
    ``inventory``'s types, per device otherwise (the inverse of :func:`cost_model_from_factors`)."""
    types = {str(t) for t in inventory.device_types}
    doc: dict = {
        "type_class": [],
        "device_class": [],
        "link_class": dict(model.link_class_multiplier),
        "launch_overhead_s": model.launch_overhead_s,
    }
    for (dev, cls), m in sorted(model.device_class_multiplier.items()):
        if dev in types:
            doc["type_class"].append({"device_type": dev, "op_class": cls, "multiplier": float(m)})
        else:
            doc["device_class"].append({"device": dev, "op_class": cls, "multiplier": float(m)})
    return doc


@dataclass(frozen=True, eq=False)
class PlanCalibration:
    """The cost model a plan is made with, and the factors document that describes it.

    The model plans the request now; the document keys the plan's cache entry and is
    stored with the plan, so a worker planning it later rebuilds the same model
    (:func:`cost_model_from_factors`).
    """

    cost_model: CostModel
    factors: dict

    def __post_init__(self) -> None:
        if not isinstance(self.factors, dict):
            raise TypeError("calibration factors are a factors document (dict)")

    @classmethod
    def of(cls, model: CostModel, inventory: Inventory) -> PlanCalibration:
        """A model with its factors as seen by ``inventory`` (the one the plan is made on)."""
        return cls(cost_model=model, factors=factors_of(model, inventory))


#: The key a plan's factors document is stored (and keyed) under, beside the user's options;
#: no option can have it (options are PlanOptions' fields).
STORED_FACTORS_KEY = "_calibration"


def options_with_factors(options: Mapping, factors: dict | None) -> dict:
    """The options as a plan stores them and keys its cache with: the user's, plus the factors, if any."""
    return dict(options) if factors is None else {**options, STORED_FACTORS_KEY: factors}


def split_stored_options(stored: Mapping) -> tuple[dict, dict | None]:
    """A plan's stored options as ``(the user's options, the factors document or None)``.

    Any other key starting with ``_`` is internal too and dropped from the user's options.
    """
    options = {k: v for k, v in stored.items() if not k.startswith("_")}
    return options, stored.get(STORED_FACTORS_KEY)


def factors_document(fit: CalibrationFit, n_observations: int) -> dict:
    return {
        "type_class": [
            {"device_type": t, "op_class": c, "multiplier": round(m, 6)} for (t, c), m in sorted(fit.type_class.items())
        ],
        "device_class": [
            {"device": d, "op_class": c, "multiplier": round(m, 6), "n_ops": fit.n_ops.get((d, c), 0)}
            for (d, c), m in sorted(fit.device_class.items())
        ],
        "device_slowdown": {d: round(v, 6) for d, v in sorted(fit.device_slowdown.items())},
        "link_class": {k: round(v, 6) for k, v in sorted(fit.link_class.items())},
        "n_transfers": dict(sorted(fit.n_transfers.items())),
        "launch_overhead_s": fit.launch_overhead_s,
        "n_observations": int(n_observations),
    }


def _observation_arrays(rows, inventory: Inventory):
    """Concatenate the stored observations of several timelines into fit arrays."""
    dev_index = {str(n): i for i, n in enumerate(inventory.device_names)}
    keys: dict[tuple[str, str, str], int] = {}
    op_key, op_dev, op_cls, roof, meas = [], [], [], [], []
    t_key, t_cls, t_pred, t_meas = [], [], [], []
    for row in rows:
        doc = feedback_repo.unpack_derived(row.timeline)
        obs = doc.get("observations", {})
        for name, device, cls, r, d in zip(
            obs.get("op", []),
            obs.get("device", []),
            obs.get("op_class", []),
            obs.get("roofline_s", []),
            obs.get("duration_s", []),
        ):
            if device not in dev_index:
                continue
            op_key.append(keys.setdefault((row.plan_id, name, device), len(keys)))
            op_dev.append(dev_index[device])
            op_cls.append(cls)
            roof.append(r)
            meas.append(d)
        tr = doc.get("transfers", {})
        for tensor, src, dst, cls, p, d in zip(
            tr.get("tensor", []),
            tr.get("src", []),
            tr.get("dst", []),
            tr.get("link_class", []),
            tr.get("predicted_s", []),
            tr.get("duration_s", []),
        ):
            t_key.append(keys.setdefault((row.plan_id, f"transfer:{tensor}:{src}", dst), len(keys)))
            t_cls.append(cls)
            t_pred.append(p)
            t_meas.append(d)
    as_i = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    as_f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    return (as_i(op_key), as_i(op_dev), as_i(op_cls), as_f(roof), as_f(meas)), (
        as_i(t_key),
        as_i(t_cls),
        as_f(t_pred),
        as_f(t_meas),
    )


#: What a calibration holds once none of its timelines is left: no factor, the model as it is.
EMPTY_FIT = CalibrationFit()


def refit_calibration(
    session: Session, tenant_id: str, inventory_hash: str, inventory: Inventory
) -> Calibration | None:
    """Fit factors from the newest :data:`CALIBRATION_WINDOW` timelines of this inventory and store them.

    Runs after a timeline is stored and after a plan with timelines is deleted, each
    time as a new version. When no timeline is left the calibration stays, empty
    (``n_timelines`` 0, no factor), rather than disappearing: its version keeps
    counting, so a re-plan cached under an old version (whose factors came from the
    deleted timelines) is never taken for one made with a later calibration.
    Returns None when there is neither a timeline nor a calibration.
    """
    feedback_repo.lock_calibration(session, tenant_id, inventory_hash)
    rows = feedback_repo.recent_feedback_for_inventory(session, tenant_id, inventory_hash, limit=CALIBRATION_WINDOW)
    if not rows:
        if feedback_repo.get_calibration(session, tenant_id, inventory_hash) is None:
            return None
        return feedback_repo.save_calibration(
            session, tenant_id, inventory_hash, factors_document(EMPTY_FIT, 0), 0, utcnow()
        )
    (key, dev, cls, roof, meas), (t_key, t_cls, t_pred, t_meas) = _observation_arrays(rows, inventory)
    fit = fit_calibration(
        inventory,
        key,
        dev,
        cls,
        roof,
        meas,
        launch_overhead_s=CostModel().launch_overhead_s,
        transfer_key=t_key,
        transfer_link_class=t_cls,
        transfer_predicted_s=t_pred,
        transfer_measured_s=t_meas,
    )
    return feedback_repo.save_calibration(
        session, tenant_id, inventory_hash, factors_document(fit, int(key.size)), len(rows), utcnow()
    )


def calibration_in_use(row: Calibration | None) -> Calibration | None:
    """The calibration re-plans apply: none when it was fitted from no timeline (all deleted)."""
    return row if row is not None and row.n_timelines > 0 else None


def calibration_read(row: Calibration | None) -> dict | None:
    if row is None:
        return None
    return {
        "inventory_hash": row.inventory_hash,
        "version": row.version,
        "n_timelines": row.n_timelines,
        "updated_at": row.updated_at.isoformat(),
        "factors": row.factors,
    }
