"""Cost-model calibration from measured timelines: robust factors and prediction errors.

The analytic model (:mod:`partitioners.costmodel.costs`) predicts an operator's time as
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
:data:`MIN_OVERHEAD_OPS` of them), as their measured time less their roofline: a
CPU framework dispatch costs ~2-3 us where a CUDA launch costs ~5 us. An operator
whose measured time is under twice the overhead says nothing about its roofline part
and is left out of the multiplier fit (it would otherwise pull a whole class towards
zero).

Factors within :data:`MODEL_AGREEMENT_REL_TOL` of the model's are the model's, so a
plan's own predicted trace, read back as a measured one, calibrates nothing.
:func:`tiers_realized` says which prediction a run should be compared with where the
plan's times used its memory tiers.

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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from partitioners.costmodel.costs import OP_CLASS_NAMES, CostModel
from partitioners.errors import InvalidInput
from partitioners.hardware.inventory import LINK_CLASS_NAMES, Inventory

__all__ = [
    "HUBER_K",
    "MAX_DEVICE_SLOWDOWN",
    "MIN_DEVICE_SLOWDOWN",
    "MIN_CELL_OPS",
    "MIN_OVERHEAD_OPS",
    "MODEL_AGREEMENT_REL_TOL",
    "TIE_SPREAD_PER_OP",
    "CalibrationFit",
    "weighted_median",
    "huber_location",
    "group_medians",
    "fit_calibration",
    "calibrated_cost_model",
    "tiers_realized",
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
#: A fitted factor (multiplier, slowdown, overhead) within this relative distance of the
#: model's value is the model's value: the factors are stored to six digits, and a plan's
#: own trace reproduces its times to ~1e-13.
MODEL_AGREEMENT_REL_TOL = 1e-6
#: :func:`tiers_realized`: two predictions whose spreads of ``log(measured / predicted)``
#: differ by less than this per operator explain a run equally well. A plan's own trace
#: carries its times through microsecond timestamps, exact to ~1e-13 relative; any real
#: difference between the two (a tier speed-up of 1% on one operator) is ~1e-2.
TIE_SPREAD_PER_OP = 1e-9


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
        :data:`~partitioners.costmodel.costs.OP_CLASS_NAMES` index.
    roofline_s : numpy.ndarray
        Uncalibrated ``max(compute, memory)`` time (no launch overhead, multiplier 1).
    measured_s : numpy.ndarray
    launch_overhead_s : float
        The model's fixed per-operator overhead, subtracted from measurements (the
        model adds it outside the multiplier); replaced by the fitted one when
        ``fit_launch_overhead`` finds enough overhead-bound operators.
    transfer_key, transfer_link_class, transfer_predicted_s, transfer_measured_s : numpy.ndarray, optional
        Measured transfers: identity, :data:`~partitioners.hardware.inventory.LINK_CLASS_NAMES`
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
        Arrays of different lengths; ``transfer_key`` without the other three transfer arrays.
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
    fitted_launch = (
        _fitted_launch_overhead(op_key, roofline, measured, valid, launch_overhead_s) if fit_launch_overhead else None
    )
    if fitted_launch is not None:
        fitted_launch = _snapped(fitted_launch, launch_overhead_s)
        launch_overhead_s = fitted_launch
    _keys, y, weight, dev, cls = _operator_log_ratios(
        op_key, op_device, op_class, roofline, measured, valid, launch_overhead_s
    )
    names = [str(n) for n in inventory.device_names]
    types = [str(t) for t in inventory.device_types]
    fit = CalibrationFit(launch_overhead_s=fitted_launch)
    for dtype in sorted({types[d] for d in dev.tolist()}):
        sel = np.array([types[d] == dtype for d in dev.tolist()], dtype=bool)
        _fit_device_type(fit, dtype, y[sel], dev[sel], cls[sel], weight[sel], names, n_iter)
    if transfer_key is not None and np.asarray(transfer_key).size:
        if transfer_link_class is None or transfer_predicted_s is None or transfer_measured_s is None:
            raise InvalidInput(
                "measured transfers need transfer_link_class, transfer_predicted_s and transfer_measured_s",
                field="transfers",
            )
        _fit_link_classes(fit, transfer_key, transfer_link_class, transfer_predicted_s, transfer_measured_s)
    _snap_to_one(fit.type_class)
    _snap_to_one(fit.device_class)
    _snap_to_one(fit.device_slowdown)
    _snap_to_one(fit.link_class)
    return fit


_Key = TypeVar("_Key")


def _snap_to_one(factors: dict[_Key, float]) -> None:
    """Multipliers within noise of 1.0 become exactly 1.0 (:func:`_snapped`), in place."""
    for name, value in factors.items():
        factors[name] = _snapped(value, 1.0)


def _snapped(value: float, model_value: float) -> float:
    """``model_value`` where ``value`` is within :data:`MODEL_AGREEMENT_REL_TOL` of it, else ``value``.

    A factor that differs from the model's in its last digits is rounding (a trace's
    microsecond timestamps, a Huber mean), not a measurement, and it is not harmless:
    list scheduling turns a 1e-15 change in every operator's time into a different
    schedule (0.05% on the makespan of GPT-2 training), so a plan's own trace would
    no longer replay its own schedule.
    """
    if abs(value - model_value) <= MODEL_AGREEMENT_REL_TOL * abs(model_value):
        return float(model_value)
    return float(value)


def _fitted_launch_overhead(
    op_key: np.ndarray, roofline: np.ndarray, measured: np.ndarray, valid: np.ndarray, launch_overhead_s: float
) -> float | None:
    """The per-operator overhead from operators whose roofline is under a fifth of the model's,
    or None with fewer than ``MIN_OVERHEAD_OPS`` of them.

    Each such operator's overhead is its measured time less its roofline (at multiplier
    1, the multipliers are fitted after the overhead): the model says ``roofline +
    overhead``, and the roofline is up to a fifth of the overhead, so taking the whole
    measured time as overhead would overstate it by up to 20%, and the multipliers,
    fitted on ``measured - overhead``, would all come out too small (a plan's own
    predicted trace would calibrate conv to 0.95). A measurement under its roofline
    keeps a thousandth of its time, like the multiplier fit's floor.
    """
    overhead_bound = valid & (roofline < 0.2 * launch_overhead_s)
    excess = measured[overhead_bound] - roofline[overhead_bound]
    overhead = np.maximum(excess, 1e-3 * measured[overhead_bound])
    o_keys, o_med, _ = group_medians(op_key[overhead_bound], np.log(overhead))
    if o_keys.size < MIN_OVERHEAD_OPS:
        return None
    return float(np.exp(huber_location(o_med)))


def _operator_log_ratios(
    op_key: np.ndarray,
    op_device: np.ndarray,
    op_class: np.ndarray,
    roofline: np.ndarray,
    measured: np.ndarray,
    valid: np.ndarray,
    launch_overhead_s: float,
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


def _fit_device_type(
    fit: CalibrationFit,
    dtype: str,
    yd: np.ndarray,
    dd: np.ndarray,
    cc: np.ndarray,
    wd: np.ndarray,
    names: list[str],
    n_iter: int,
) -> None:
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


def _fit_link_classes(
    fit: CalibrationFit,
    transfer_key: np.ndarray,
    transfer_link_class: np.ndarray,
    transfer_predicted_s: np.ndarray,
    transfer_measured_s: np.ndarray,
) -> None:
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


def tiers_realized(
    measured_s: np.ndarray,
    main_s: np.ndarray,
    tiered_s: np.ndarray,
    device: np.ndarray,
    op_class: np.ndarray,
) -> bool:
    """Whether a run got the speed-ups of its plan's memory tiers.

    Calibration explains a run by one multiplier per (device, operator class), so the
    right prediction is the one whose ratios to the measured times vary least inside
    those cells: the sum of absolute deviations of ``log(measured / predicted)`` from
    each cell's median, with the tiers (``tiered_s``) and without (``main_s``). A
    runtime that ignores the tiers fits the main-memory times up to noise, while the
    tiered ones then scatter with each operator's own speed-up; a runtime that lays
    tensors out as planned (the plan's own predicted trace) fits the tiered times.

    The two spreads tie when every operator of a cell got the same speed-up (an MLP
    whose only elementwise operator reads a tensor from L2, once per micro-batch):
    either prediction then explains the run, one with the multipliers the run shows
    and the other with those multipliers times the speed-up. The tie goes to the one
    whose multipliers are nearer 1 (the smaller sum over operators of ``|cell
    median|``): the model as it stands explains the run, so a plan's own trace
    calibrates nothing and a run that ignored the tiers is not learnt as faster
    operators. Spreads within :data:`TIE_SPREAD_PER_OP` per operator tie (a trace's
    microsecond timestamps round in the last digits).

    Parameters
    ----------
    measured_s, main_s, tiered_s : numpy.ndarray of float64, shape (n_obs,)
        Measured time of each operator run, and the model's with its tensors in main
        memory and at the plan's tiers (equal where the plan claims no speed-up).
    device, op_class : numpy.ndarray of int64, shape (n_obs,)
        The device it ran on and its :data:`~partitioners.costmodel.costs.OP_CLASS_NAMES` index.

    Returns
    -------
    bool
        ``False`` when no usable run had a tier speed-up to bear out.
    """
    measured, main, tiered = (np.asarray(a, dtype=np.float64) for a in (measured_s, main_s, tiered_s))
    usable = (
        (measured > 0) & (main > 0) & (tiered > 0) & np.isfinite(measured) & np.isfinite(main) & np.isfinite(tiered)
    )
    if not np.any(usable & (tiered != main)):
        return False
    cell = (
        np.asarray(device, dtype=np.int64)[usable] * len(OP_CLASS_NAMES) + np.asarray(op_class, dtype=np.int64)[usable]
    )

    def spread_and_offset(predicted: np.ndarray) -> tuple[float, float]:
        ratio = np.log(measured[usable] / predicted[usable])
        keys, medians, _ = group_medians(cell, ratio)
        own_median = medians[np.searchsorted(keys, cell)]
        return float(np.abs(ratio - own_median).sum()), float(np.abs(own_median).sum())

    tiered_spread, tiered_offset = spread_and_offset(tiered)
    main_spread, main_offset = spread_and_offset(main)
    if abs(tiered_spread - main_spread) > TIE_SPREAD_PER_OP * int(usable.sum()):
        return tiered_spread < main_spread
    return tiered_offset < main_offset


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
