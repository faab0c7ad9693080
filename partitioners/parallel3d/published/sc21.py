"""The planner's predictions of SC21's figures (Narayanan et al. 2021), read the way the paper states them.

``bench/parallel3d.py`` prints these; the tests in
``tests/partitioners/parallel3d/test_controlled_comparisons.py`` hold them.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from partitioners.parallel3d.planner import LayoutPrediction, evaluate_layouts
from partitioners.parallel3d.published.runs import (
    A100_PEAK_BF16_FLOPS,
    SC21_FIGURE17_THROUGHPUT,
    SC21_SEARCH,
    SC21_SOFTWARE,
    constraints_of,
    specs_of,
)
from partitioners.parallel3d.specs import Constraints, LayoutSpec


def predicted_tflops(comparison: dict[str, Any], batch: int) -> list[float]:
    """Predicted "achieved teraFLOP/s per GPU" (SC21's measure: recomputation counted) of each bar."""
    values = []
    for point in comparison["points"]:
        training = {"global_batch_sequences": batch, **SC21_SOFTWARE, **point["training"]}
        (pred,) = evaluate_layouts(
            *specs_of(point["model"], point["cluster"], training),
            [LayoutSpec(**point["layout"])],
            constraints_of(SC21_SEARCH),
        )
        values.append(pred.hfu * A100_PEAK_BF16_FLOPS / 1e12)
    return values


def finding_holds(comparison: dict[str, Any], tflops_by_batch: dict[int, list[float]]) -> tuple[str, str]:
    """Whether predictions reproduce the finding the paper states for one figure: "yes", "no", or
    "tie" (a "peak" finding whose layout is predicted within the planner's tie tolerance of the
    fastest, a gap below the model's accuracy), with what differs."""
    labels = [point["label"] for point in comparison["points"]]
    batches = sorted(tflops_by_batch)
    finding = comparison["finding"]
    if finding == "peak":
        misses, behind = [], []
        for batch in batches:
            values = tflops_by_batch[batch]
            best = int(np.argmax(values))
            if labels[best] != comparison["expected"]:
                behind.append(1.0 - values[labels.index(comparison["expected"])] / values[best])
                misses.append(f"batch {batch}: {labels[best]} first, {comparison['expected']} {behind[-1]:.1%} behind")
        if not misses:
            return "yes", ""
        tied = max(behind) <= Constraints().tie_tolerance
        return ("tie" if tied else "no"), "; ".join(misses)
    if finding == "decreasing":
        misses = [f"batch {b}" for b in batches if not np.all(np.diff(tflops_by_batch[b]) < 0)]
        return ("no", "not falling at " + ", ".join(misses)) if misses else ("yes", "")
    if finding == "larger-batch-scales-better":
        kept = [tflops_by_batch[b][-1] / tflops_by_batch[b][0] for b in batches]
        falls = all(np.all(np.diff(tflops_by_batch[b]) <= 0) for b in batches)
        ok = falls and kept[-1] > kept[0]
        return ("yes", "") if ok else ("no", "kept " + ", ".join(f"{k:.0%}" for k in kept))
    if finding == "gap-closing":
        gaps = [tflops_by_batch[b][1] / tflops_by_batch[b][0] - 1.0 for b in batches]
        ok = min(gaps) > 0 and bool(np.all(np.diff(gaps) <= 0))
        return ("yes", "") if ok else ("no", "gaps " + ", ".join(f"{g:+.0%}" for g in gaps))
    if finding == "faster":
        gains = [tflops_by_batch[b][1] / tflops_by_batch[b][0] - 1.0 for b in batches]
        detail = f"gain {min(gains):+.1%} to {max(gains):+.1%}, paper up to {comparison['stated_gain']:.0%}"
        return ("yes" if min(gains) > 0 else "no"), detail
    raise ValueError(f"unknown finding {finding!r}")


def figure17_predictions(recompute: str) -> dict[int, LayoutPrediction]:
    """Predictions for SC21 Figure 17's (8,16) pipeline at each batch of its sweep, with
    ``recompute`` ("none" or "full")."""
    row = cast(dict[str, Any], SC21_FIGURE17_THROUGHPUT["row"])
    return {
        batch: evaluate_layouts(
            *specs_of(row["model"], row["cluster"], {**row["training"], "global_batch_sequences": batch}),
            [LayoutSpec(**{**row["published"], "recompute": recompute})],
            constraints_of(row["search"]),
        )[0]
        for batch in cast(list[int], SC21_FIGURE17_THROUGHPUT["batches"])
    }


def sequences_per_s(predictions: dict[int, LayoutPrediction]) -> dict[int, float]:
    """Predicted sequences/s at each batch (the unit of SC21 Figure 17)."""
    return {batch: batch / prediction.step_time_s for batch, prediction in predictions.items()}


def figure17_last_batch_without_recompute(without: dict[int, float], full: dict[int, float]) -> int:
    """The batch whose throughput without recomputation makes recomputation's best come out
    nearest the paper's "up to 2x higher than the best throughput achieved without": the
    largest batch the figure ran without recomputation, as the prediction reads it."""
    best_full = max(full.values())
    stated = cast(float, SC21_FIGURE17_THROUGHPUT["stated_best_ratio"])
    return min(without, key=lambda batch: abs(best_full / without[batch] - stated))
