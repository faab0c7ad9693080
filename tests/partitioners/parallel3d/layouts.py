"""Test helper: one candidate layout as the planner's parallel arrays."""

from __future__ import annotations

import numpy as np

from partitioners.parallel3d.memory import activation_bytes_per_layer
from partitioners.parallel3d.stages import ORDER_PP_INSIDE, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, LayoutArrays


def layouts(**kw) -> LayoutArrays:
    """A single layout: dp = tp = pp = cp = ep = mbs = v = 1, ZeRO 0, no recomputation, unless given
    (the expert tensor-parallel size ``etp`` defaults to ``tp``; the rank order to pipeline
    stages side by side, ``ORDER_PP_INSIDE``).

    Full recomputation covers every layer unless ``recompute_layers`` says how many per
    model chunk (any large number means all of them).
    """
    base = {
        "dp": 1,
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "ep": 1,
        "mbs": 1,
        "v": 1,
        "zero": 0,
        "recompute": RECOMPUTE_NONE,
        "recompute_layers": 1_000_000,
        "order": ORDER_PP_INSIDE,
    }
    base.update(kw)
    base.setdefault("etp", base["tp"])
    return LayoutArrays(
        *(
            np.array([base[k]], dtype=np.int64)
            for k in ("dp", "tp", "pp", "cp", "ep", "etp", "mbs", "v", "zero", "recompute", "recompute_layers", "order")
        )
    )


def selective_saving_bytes(model, training, tokens: float, tp: float, moe_layer: bool = False) -> float:
    """Activation bytes of one layer that selective recomputation does not keep."""
    kept = {
        rc: float(
            activation_bytes_per_layer(
                model, training, np.array([tokens]), np.array([tp]), np.array([rc]), moe_layer=moe_layer
            )[0]
        )
        for rc in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE)
    }
    return kept[RECOMPUTE_NONE] - kept[RECOMPUTE_SELECTIVE]
