"""Cost-model calibration from measured timelines: robust factors and prediction errors.

The analytic model (:mod:`partitioners.cost`) predicts an operator's time as
``roofline * multiplier[device, class] + launch``. Calibration fits the multipliers
from measured operator times, in log space, with a model that can be wrong in two
ways that real clusters show:

    log((measured - launch) / roofline) = class_effect[type, class] + device_effect[device] + e

* ``class_effect``: how far a class of kernels (attention, convolution, ...) is from
  its assumed efficiency on a device *type*; it carries over to devices of that type
  that were never measured.
* ``device_effect``: one device slower than its siblings (thermal throttling, a
  noisy neighbour, a degraded link to its memory). Effects are relative to the
  *lower median* device of each type, so a device counts as healthy unless the
  others are faster, and a uniform slowdown of every device lands in the class effects.

The two effects are fitted by alternating robust location estimates (Tukey's median
polish [2]_, with Huber's M-estimator [1]_ in place of the median for efficiency);
cells with enough operators of their own keep a shrunken residual (an interaction,
e.g. attention on one odd device). Operators weigh by their predicted (roofline)
time: a factor that is right for the operators that take the time is right for
the makespan, and a 2 us operator 50% off costs 1 us. (Predicted, not measured,
time: an operator preempted in every step must not gain weight by being slow.) Before the fit, every operator's repeated
measurements (steps, timelines) collapse to their median, so a warm-up step that is
3x slower is outvoted by the steady steps, and Huber weights keep what remains of
such outliers from dominating a class. Link classes get one Huber location each of
``log(measured / predicted)`` transfer time.

The fixed per-operator overhead is fitted too when enough operators are dominated
by it (roofline under a fifth of the assumed overhead, at least
:data:`MIN_OVERHEAD_OPS` of them): a CPU framework dispatch costs ~2-3 us where a
CUDA launch costs ~5 us. An operator whose measured time is under twice the
overhead says nothing about its roofline part and is left out of the multiplier fit
(it would otherwise pull a whole class towards zero).

All estimates are deterministic; nothing here reads clocks, files or global RNG.

References
----------
.. [1] P. J. Huber, "Robust Estimation of a Location Parameter", Annals of
   Mathematical Statistics 35(1), 1964.
.. [2] J. W. Tukey, "Exploratory Data Analysis", Addison-Wesley, 1977 (median polish).
.. [3] F. R. Hampel, "The influence curve and its role in robust estimation", JASA
   69(346), 1974 (median absolute deviation, 1.4826 consistency constant).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

from partitioners.cost import OP_CLASS_NAMES, CostModel
from partitioners.errors import InvalidInput
from partitioners.inventory import LINK_CLASS_NAMES, Inventory

__all__ = [
    "HUBER_K",
    "MAX_DEVICE_SLOWDOWN",
    "MIN_DEVICE_SLOWDOWN",
    "MIN_CELL_OPS",
    "MIN_OVERHEAD_OPS",
    "CalibrationFit",
    "weighted_median",
    "huber_location",
    "group_medians",
    "fit_calibration",
    "calibrated_cost_model",
    "relative_errors",
    "prediction_error",
]

#: Huber's tuning constant: 95% efficiency at the normal distribution [1]_.
HUBER_K = 1.345
#: A (device, class) cell needs this many operators before its own residual is trusted.
MIN_CELL_OPS = 3
#: Operators dominated by the fixed overhead needed before the overhead itself is fitted.
MIN_OVERHEAD_OPS = 3
#: Shrinkage of a cell residual: ``n / (n + CELL_PRIOR_OPS)``.
CELL_PRIOR_OPS = 5.0
#: Log-ratios are clipped to +-log(1000): a measurement 1000x off the model is an error, not a factor.
_LOG_CLIP = float(np.log(1e3))
#: A load report's slowdown factor (1.6 = 60% slower than the model says; under 1 =
#: faster) is bounded like calibration's own factors, symmetrically in log space: a
#: device 1000x off the model is an error in the report, and a factor near zero would
#: make the device look infinitely fast and draw every operator onto it.
MAX_DEVICE_SLOWDOWN = 1e3
MIN_DEVICE_SLOWDOWN = 1.0 / MAX_DEVICE_SLOWDOWN


def weighted_median(values: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The lower weighted median: smallest value whose cumulative weight reaches half the total."""
    x = np.asarray(values, dtype=np.float64)
    if weights is None:
        return float(np.median(x))
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    cum = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cum, 0.5 * cum[-1])])


def huber_location(
    values: np.ndarray, weights: np.ndarray | None = None, k: float = HUBER_K, max_iter: int = 50
) -> float:
    """Huber M-estimate of location with the MAD as fixed scale [1]_ [3]_.

    Iteratively reweighted mean starting at the (weighted) median; points further
    than ``k`` scaled MADs from the estimate get weight ``k * scale / |r|``, times
    their prior weight. With a zero MAD (half the values equal) or fewer than three
    values the median is returned.

    Parameters
    ----------
    values : numpy.ndarray
        Finite values (at least one).
    weights : numpy.ndarray, optional
        Positive prior weights (e.g. each operator's share of the measured time).
    k : float
    max_iter : int

    Returns
    -------
    float
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise InvalidInput("huber_location needs at least one value", field="values")
    prior = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    mu = weighted_median(x, prior)
    scale = 1.4826 * weighted_median(np.abs(x - mu), prior)
    if scale <= 0.0 or x.size < 3:
        return mu
    for _ in range(max_iter):
        r = np.abs(x - mu) / scale
        w = prior * np.where(r <= k, 1.0, k / np.maximum(r, 1e-300))
        new = float(np.sum(w * x) / np.sum(w))
        if abs(new - mu) <= 1e-10 * max(1.0, abs(mu)):
            return new
        mu = new
    return mu


def group_medians(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median of ``values`` per distinct key: ``(unique keys, medians, counts)``."""
    keys = np.asarray(keys)
    values = np.asarray(values, dtype=np.float64)
    if keys.size == 0:
        return keys[:0], values[:0], np.zeros(0, dtype=np.int64)
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order]
    cut = np.flatnonzero(k[1:] != k[:-1]) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [k.size]])
    counts = ends - starts
    lo = starts + (counts - 1) // 2
    hi = starts + counts // 2
    return k[starts], 0.5 * (v[lo] + v[hi]), counts


def _lower_median(x: np.ndarray) -> float:
    s = np.sort(x)
    return float(s[(s.size - 1) // 2])


@dataclass(frozen=True)
class CalibrationFit:
    """Fitted correction factors (multipliers on the roofline part of operator times).

    Attributes
    ----------
    type_class : dict (device type, op class) -> float
        Class effect per device type, applies to every device of the type.
    device_class : dict (device name, op class) -> float
        Every class on each measured device: class effect x device effect (x a
        shrunken cell residual where the cell had :data:`MIN_CELL_OPS` operators).
    device_slowdown : dict device name -> float
        The device effect alone (1.0 = as fast as its type's lower-median device).
    link_class : dict link class -> float
        Transfer time multiplier per link class.
    n_ops : dict (device name, op class) -> int
        Distinct operators behind each measured cell.
    n_transfers : dict link class -> int
    launch_overhead_s : float or None
        Fitted fixed per-operator overhead; ``None`` = keep the model's.
    """

    type_class: dict[tuple[str, str], float] = field(default_factory=dict)
    device_class: dict[tuple[str, str], float] = field(default_factory=dict)
    device_slowdown: dict[str, float] = field(default_factory=dict)
    link_class: dict[str, float] = field(default_factory=dict)
    n_ops: dict[tuple[str, str], int] = field(default_factory=dict)
    n_transfers: dict[str, int] = field(default_factory=dict)
    launch_overhead_s: float | None = None

    def multipliers(self) -> dict[tuple[str, str], float]:
        """``CostModel.device_class_multiplier``: type entries, then device entries (which win)."""
        return {**self.type_class, **self.device_class}


def fit_calibration(
    inventory: Inventory,
    op_key: np.ndarray,
    op_device: np.ndarray,
    op_class: np.ndarray,
    roofline_s: np.ndarray,
    measured_s: np.ndarray,
    *,
    launch_overhead_s: float = CostModel().launch_overhead_s,
    transfer_key: np.ndarray | None = None,
    transfer_link_class: np.ndarray | None = None,
    transfer_predicted_s: np.ndarray | None = None,
    transfer_measured_s: np.ndarray | None = None,
    fit_launch_overhead: bool = True,
    n_iter: int = 10,
) -> CalibrationFit:
    """Fit per-(device, class) and per-link-class multipliers from measurements (module docstring).

    Parameters
    ----------
    inventory : Inventory
        Devices ids in ``op_device`` index it; types come from it.
    op_key : numpy.ndarray of int64, shape (n_obs,)
        Identity of the measured operator (same key = repeated measurement of one
        operator on one device: steps, timelines); repeats collapse to their median.
    op_device : numpy.ndarray of int64
    op_class : numpy.ndarray of int
        :data:`~partitioners.cost.OP_CLASS_NAMES` index.
    roofline_s : numpy.ndarray
        Uncalibrated ``max(compute, memory)`` time (no launch overhead, multiplier 1).
    measured_s : numpy.ndarray
    launch_overhead_s : float
        The model's fixed per-operator overhead, subtracted from measurements (the
        model adds it outside the multiplier); replaced by the fitted one when
        ``fit_launch_overhead`` finds enough overhead-bound operators.
    transfer_key, transfer_link_class, transfer_predicted_s, transfer_measured_s : numpy.ndarray, optional
        Measured transfers: identity, :data:`~partitioners.inventory.LINK_CLASS_NAMES`
        index, uncalibrated predicted time, measured time.
    fit_launch_overhead : bool
        Estimate the overhead from operators whose roofline is under a fifth of it.
    n_iter : int
        Alternations of the two-way fit.

    Returns
    -------
    CalibrationFit

    Raises
    ------
    InvalidInput
        Arrays of different lengths.
    """
    op_key = np.asarray(op_key, dtype=np.int64)
    arrays = [np.asarray(a) for a in (op_device, op_class, roofline_s, measured_s)]
    if any(a.shape != op_key.shape for a in arrays):
        raise InvalidInput("calibration arrays must all have one entry per observation", field="observations")
    op_device = arrays[0].astype(np.int64)
    op_class = arrays[1].astype(np.int64)
    roofline = arrays[2].astype(np.float64)
    measured = arrays[3].astype(np.float64)
    valid = np.isfinite(roofline) & (roofline >= 0) & np.isfinite(measured) & (measured > 0)
    fitted_launch = _fitted_launch_overhead(op_key, roofline, measured, valid, launch_overhead_s) \
        if fit_launch_overhead else None
    if fitted_launch is not None:
        launch_overhead_s = fitted_launch
    keys, y, weight, dev, cls = _operator_log_ratios(op_key, op_device, op_class, roofline, measured, valid,
                                                     launch_overhead_s)
    names = [str(n) for n in inventory.device_names]
    types = [str(t) for t in inventory.device_types]
    fit = CalibrationFit(launch_overhead_s=fitted_launch)
    for dtype in sorted({types[d] for d in dev.tolist()}):
        sel = np.array([types[d] == dtype for d in dev.tolist()], dtype=bool)
        _fit_device_type(fit, dtype, y[sel], dev[sel], cls[sel], weight[sel], names, n_iter)
    if transfer_key is not None and np.asarray(transfer_key).size:
        _fit_link_classes(fit, transfer_key, transfer_link_class, transfer_predicted_s, transfer_measured_s)
    return fit


def _fitted_launch_overhead(op_key: np.ndarray, roofline: np.ndarray, measured: np.ndarray, valid: np.ndarray,
                            launch_overhead_s: float) -> float | None:
    """The per-operator overhead from operators whose roofline is under a fifth of the model's,
    or None with fewer than ``MIN_OVERHEAD_OPS`` of them."""
    overhead_bound = valid & (roofline < 0.2 * launch_overhead_s)
    o_keys, o_med, _ = group_medians(op_key[overhead_bound], np.log(measured[overhead_bound]))
    if o_keys.size < MIN_OVERHEAD_OPS:
        return None
    return float(np.exp(huber_location(o_med)))


def _operator_log_ratios(op_key: np.ndarray, op_device: np.ndarray, op_class: np.ndarray, roofline: np.ndarray,
                         measured: np.ndarray, valid: np.ndarray, launch_overhead_s: float
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct operator: ``(key, median log(measured - overhead) / roofline, roofline, device, class)``.

    Operators whose median time is under twice the overhead say nothing about the
    roofline and are left out.
    """
    # decided per operator (median over its repeats), not per measurement: a filter on
    # single measurements would keep exactly the slow repeats of a tiny operator
    m_keys, m_med, _ = group_medians(op_key[valid], measured[valid])
    usable = valid & (roofline > 0) & np.isin(op_key, m_keys[m_med >= 2.0 * launch_overhead_s])
    safe_roofline = np.where(roofline > 0, roofline, 1.0)
    y_obs = np.log(np.maximum(measured - launch_overhead_s, 1e-3 * safe_roofline) / safe_roofline)
    y_obs = np.clip(y_obs, -_LOG_CLIP, _LOG_CLIP)
    keys, y, _ = group_medians(op_key[usable], y_obs[usable])
    _, weight, _ = group_medians(op_key[usable], roofline[usable])  # each operator's predicted size
    # device and class of each distinct key (one device and class per key by construction)
    order = np.argsort(op_key[usable], kind="stable")
    first = np.searchsorted(op_key[usable][order], keys)
    return keys, y, weight, op_device[usable][order][first], op_class[usable][order][first]


def _fit_device_type(fit: CalibrationFit, dtype: str, yd: np.ndarray, dd: np.ndarray, cc: np.ndarray,
                     wd: np.ndarray, names: list[str], n_iter: int) -> None:
    """Device and class effects of one device type by median polish with Huber steps, then
    per-(device, class) cells shrunk towards them; written into ``fit``."""
    devices = np.unique(dd)
    classes = np.unique(cc)
    d_eff = {int(d): 0.0 for d in devices}
    c_eff = {int(c): 0.0 for c in classes}
    for _ in range(n_iter):
        d_arr = np.array([d_eff[int(d)] for d in dd])
        for c in classes.tolist():
            m = cc == c
            c_eff[c] = huber_location(yd[m] - d_arr[m], wd[m])
        c_arr = np.array([c_eff[int(c)] for c in cc])
        for d in devices.tolist():
            m = dd == d
            d_eff[d] = huber_location(yd[m] - c_arr[m], wd[m])
    ref = _lower_median(np.array(list(d_eff.values())))
    d_eff = {d: v - ref for d, v in d_eff.items()}
    c_eff = {c: v + ref for c, v in c_eff.items()}
    for c, v in c_eff.items():
        fit.type_class[(dtype, OP_CLASS_NAMES[c])] = float(np.exp(v))
    d_arr = np.array([d_eff[int(d)] for d in dd])
    c_arr = np.array([c_eff[int(c)] for c in cc])
    resid = yd - d_arr - c_arr
    for d in devices.tolist():
        fit.device_slowdown[names[d]] = float(np.exp(d_eff[d]))
        for c in range(len(OP_CLASS_NAMES)):
            m = (dd == d) & (cc == c)
            count = int(m.sum())
            cell = 0.0
            if count >= MIN_CELL_OPS:
                cell = huber_location(resid[m], wd[m]) * count / (count + CELL_PRIOR_OPS)
            value = d_eff[d] + c_eff.get(c, 0.0) + cell
            fit.device_class[(names[d], OP_CLASS_NAMES[c])] = float(np.exp(value))
            if count:
                fit.n_ops[(names[d], OP_CLASS_NAMES[c])] = count


def _fit_link_classes(fit: CalibrationFit, transfer_key: np.ndarray, transfer_link_class: np.ndarray,
                      transfer_predicted_s: np.ndarray, transfer_measured_s: np.ndarray) -> None:
    """One multiplier per link class: the Huber location of its transfers' median log ratios."""
    t_key = np.asarray(transfer_key, dtype=np.int64)
    t_cls = np.asarray(transfer_link_class, dtype=np.int64)
    t_pred = np.asarray(transfer_predicted_s, dtype=np.float64)
    t_meas = np.asarray(transfer_measured_s, dtype=np.float64)
    ok = (t_pred > 0) & (t_meas > 0) & np.isfinite(t_pred) & np.isfinite(t_meas)
    yt = np.clip(np.log(np.where(ok, t_meas, 1.0) / np.where(ok, t_pred, 1.0)), -_LOG_CLIP, _LOG_CLIP)
    for c in np.unique(t_cls[ok]).tolist():
        m = ok & (t_cls == c)
        _, per_transfer, _ = group_medians(t_key[m], yt[m])
        fit.link_class[LINK_CLASS_NAMES[c]] = float(np.exp(huber_location(per_transfer)))
        fit.n_transfers[LINK_CLASS_NAMES[c]] = int(per_transfer.size)


def calibrated_cost_model(
    base: CostModel | None = None,
    multipliers: Mapping[tuple[str, str], float] | None = None,
    link_multipliers: Mapping[str, float] | None = None,
    *,
    launch_overhead_s: float | None = None,
    device_slowdown: Mapping[str, float] | None = None,
    inventory: Inventory | None = None,
) -> CostModel:
    """``base`` with calibration multipliers and optional per-device slowdowns applied.

    ``device_slowdown`` (a load report: ``{"node0/gpu3": 1.6}`` = 1.6x slower than
    the model says, ``0.5`` = twice as fast) multiplies every class of that device on
    top of whatever multiplier already applies to it (device, type or wildcard
    entry); it needs the ``inventory`` to resolve those. Names the inventory does not
    have are ignored (a calibration may name devices that have since been removed).

    Raises
    ------
    InvalidInput
        A slowdown outside [:data:`MIN_DEVICE_SLOWDOWN`, :data:`MAX_DEVICE_SLOWDOWN`]
        (or not a finite number), or slowdowns without an inventory.
    """
    base = base or CostModel()
    table = dict(base.device_class_multiplier)
    table.update(multipliers or {})
    links = dict(base.link_class_multiplier)
    links.update(link_multipliers or {})
    model = replace(base, device_class_multiplier=table, link_class_multiplier=links)
    if launch_overhead_s is not None:
        model = replace(model, launch_overhead_s=float(launch_overhead_s))
    if not device_slowdown:
        return model
    if inventory is None:
        raise InvalidInput("device slowdowns need the inventory", field="load_report.slow_devices")
    matrix = model.multiplier_matrix(inventory)
    index = {str(n): i for i, n in enumerate(inventory.device_names)}
    for device, slow in device_slowdown.items():
        slow = float(slow)
        if not MIN_DEVICE_SLOWDOWN <= slow <= MAX_DEVICE_SLOWDOWN:  # NaN fails too
            raise InvalidInput(
                f"slowdown of {device!r} is {slow:g}; it must be from {MIN_DEVICE_SLOWDOWN:g} (1000x faster than "
                f"the model says) to {MAX_DEVICE_SLOWDOWN:g} (1000x slower)",
                field=f"load_report.slow_devices.{device}",
            )
        d = index.get(str(device))
        if d is None:
            continue
        for c, cls in enumerate(OP_CLASS_NAMES):
            table[(str(device), cls)] = float(matrix[d, c] * slow)
    return replace(model, device_class_multiplier=table)


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``|predicted - measured| / measured`` where ``measured > 0``."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    ok = m > 0
    return np.abs(p[ok] - m[ok]) / m[ok]


def prediction_error(
    predicted_op_s: np.ndarray,
    measured_op_s: np.ndarray,
    predicted_makespan_s: float,
    measured_makespan_s: float,
) -> dict[str, float | int | None]:
    """Median and 90th-percentile relative operator-time error, and the makespan error.

    Returns
    -------
    dict
        ``{"op_median_rel_error", "op_p90_rel_error", "n_ops", "makespan_rel_error",
        "predicted_makespan_s", "measured_makespan_s"}`` (errors are fractions,
        ``None`` without data).
    """
    err = relative_errors(predicted_op_s, measured_op_s)
    makespan = (
        abs(predicted_makespan_s - measured_makespan_s) / measured_makespan_s if measured_makespan_s > 0 else None
    )
    return {
        "op_median_rel_error": float(np.median(err)) if err.size else None,
        "op_p90_rel_error": float(np.percentile(err, 90)) if err.size else None,
        "n_ops": int(err.size),
        "makespan_rel_error": None if makespan is None else float(makespan),
        "predicted_makespan_s": float(predicted_makespan_s),
        "measured_makespan_s": float(measured_makespan_s),
    }
