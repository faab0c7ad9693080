"""The 3D-parallel planner: which dp x tp x pp (x cp x ep) layout, and which GPU gets which rank.

- :mod:`~partitioners.parallel3d.planner`: :func:`plan_parallel_layout` (search and rank),
  :func:`evaluate_layouts` (given layouts), :func:`rank_map`.
- :mod:`~partitioners.parallel3d.specs`: the typed inputs (:class:`ModelSpec`,
  :class:`ClusterSpec`, :class:`TrainingSpec`, :class:`Constraints`, :class:`LayoutSpec`),
  each field declared once with its limits and description;
  :mod:`~partitioners.parallel3d.spec_fields`: those declarations' checks, and
  :func:`spec_from_mapping`, which builds any of the inputs from a JSON-shaped mapping.
- :mod:`~partitioners.parallel3d.presets`: GPUs, the nodes they ship in, software generations.
- :mod:`~partitioners.parallel3d.cost`, :mod:`~partitioners.parallel3d.memory`,
  :mod:`~partitioners.parallel3d.comm`, :mod:`~partitioners.parallel3d.kernels`,
  :mod:`~partitioners.parallel3d.flops`, :mod:`~partitioners.parallel3d.stages`: step time
  and per-GPU memory of many candidate layouts at once.
- :mod:`~partitioners.parallel3d.huggingface`: model shapes from a ``config.json``.
- :mod:`~partitioners.parallel3d.published`: published runs the planner is checked against.
"""

from partitioners.parallel3d.planner import (
    LayoutPrediction,
    ParallelPlan,
    evaluate_layouts,
    plan_parallel_layout,
    rank_map,
)
from partitioners.parallel3d.spec_fields import spec_from_mapping
from partitioners.parallel3d.specs import ClusterSpec, Constraints, LayoutSpec, ModelSpec, TrainingSpec

__all__ = [
    "LayoutPrediction",
    "ParallelPlan",
    "evaluate_layouts",
    "plan_parallel_layout",
    "rank_map",
    "ModelSpec",
    "ClusterSpec",
    "TrainingSpec",
    "Constraints",
    "LayoutSpec",
    "spec_from_mapping",
]
