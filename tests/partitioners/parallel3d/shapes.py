"""Test helper: small models and clusters the planner's specifications share, and specs from them.

The planner takes typed specs; these tests write their inputs as the JSON a request
carries and read them with the one generic reader,
:func:`~partitioners.parallel3d.spec_fields.spec_from_mapping`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from partitioners.parallel3d.planner import LayoutPrediction
from partitioners.parallel3d.spec_fields import spec_from_mapping
from partitioners.parallel3d.specs import ClusterSpec, Constraints, LayoutSpec, ModelSpec, TrainingSpec

__all__ = [
    "GPT_SMALL",
    "A100_NODE",
    "RECOMPUTE_MODEL",
    "RECOMPUTE_CLUSTER",
    "model_spec",
    "cluster_spec",
    "training_spec",
    "constraints_spec",
    "layout_spec",
    "layout_specs",
]

GPT_SMALL = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 100}

A100_NODE = {"preset": "dgx-a100", "nodes": 1}

RECOMPUTE_MODEL = {
    "num_layers": 32,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "vocab_size": 32000,
    "seq_length": 2048,
}

RECOMPUTE_CLUSTER = {"preset": "dgx-h100", "nodes": 1}


def model_spec(data: Mapping[str, Any] | ModelSpec) -> ModelSpec:
    return spec_from_mapping(ModelSpec, data)


def cluster_spec(data: Mapping[str, Any] | ClusterSpec) -> ClusterSpec:
    return spec_from_mapping(ClusterSpec, data)


def training_spec(data: Mapping[str, Any] | TrainingSpec) -> TrainingSpec:
    return spec_from_mapping(TrainingSpec, data)


def constraints_spec(data: Mapping[str, Any] | Constraints | None) -> Constraints:
    return Constraints() if data is None else spec_from_mapping(Constraints, data)


def layout_spec(data: Mapping[str, Any] | LayoutSpec | LayoutPrediction) -> LayoutSpec | LayoutPrediction:
    return data if isinstance(data, LayoutPrediction) else spec_from_mapping(LayoutSpec, data)


def layout_specs(layouts: Iterable[Mapping[str, Any] | LayoutSpec]) -> list[LayoutSpec]:
    """Layouts to evaluate, each read under its request path (``evaluate[k]``)."""
    return [spec_from_mapping(LayoutSpec, data, f"evaluate[{k}]") for k, data in enumerate(layouts)]
