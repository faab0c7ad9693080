"""What comes back from real runs: measured timelines, calibration, re-placement.

- :mod:`~partitioners.feedback.timeline`: :func:`parse_timeline` (Chrome trace or simple
  JSON) and :func:`match_timeline` to a plan's operators.
- :mod:`~partitioners.feedback.calibration`: :func:`fit_calibration`, robust per-device
  and per-class factors, and :func:`prediction_error`.
- :mod:`~partitioners.feedback.replan`: :func:`minimal_movement`, re-placement that keeps
  operators where they are unless moving them pays.
"""

from partitioners.feedback.calibration import CalibrationFit, calibrated_cost_model, fit_calibration, prediction_error
from partitioners.feedback.replan import minimal_movement
from partitioners.feedback.timeline import match_timeline, parse_timeline

__all__ = [
    "CalibrationFit",
    "calibrated_cost_model",
    "fit_calibration",
    "match_timeline",
    "minimal_movement",
    "parse_timeline",
    "prediction_error",
]
