"""A two-layer MLP's exported training step (one step of Adam), the docs/api.md example.

Sizes are small round byte counts so a test can add them up by hand: parameters
w1 4,000 and w2 2,000 bytes, their gradients as large, two Adam moments per
parameter (12,000 bytes in all), activations of 1,000 and 2,000 bytes.
"""

from __future__ import annotations

import copy

__all__ = ["mlp_training_step"]

_STEP = {
    "name": "mlp-train",
    "nodes": [
        {"name": "fc1", "op": "MatMul", "inputs": ["x", "w1"], "outputs": ["h"], "flops": 4e9},
        {"name": "fc2", "op": "MatMul", "inputs": ["h", "w2"], "outputs": ["y"], "flops": 2e9},
        {"name": "loss_grad", "op": "MSELossGrad", "inputs": ["y"], "outputs": ["dy"], "flops": 1e6, "role": "backward"},
        {"name": "fc2_grad_w", "op": "MatMul", "inputs": ["h", "dy"], "outputs": ["dw2"], "flops": 2e9, "role": "backward"},
        {"name": "fc2_grad_x", "op": "MatMul", "inputs": ["dy", "w2"], "outputs": ["dh"], "flops": 2e9, "role": "backward"},
        {"name": "fc1_grad_w", "op": "MatMul", "inputs": ["x", "dh"], "outputs": ["dw1"], "flops": 4e9, "role": "backward"},
        {"name": "adam_w1", "op": "Adam", "inputs": ["w1", "dw1", "w1.m", "w1.v"], "outputs": [], "flops": 8e6, "role": "optimizer"},
        {"name": "adam_w2", "op": "Adam", "inputs": ["w2", "dw2", "w2.m", "w2.v"], "outputs": [], "flops": 4e6, "role": "optimizer"},
    ],
    "tensors": [
        {"name": "x", "bytes": 1000},
        {"name": "h", "bytes": 2000},
        {"name": "y", "bytes": 1000},
        {"name": "dy", "bytes": 1000},
        {"name": "dh", "bytes": 2000},
        {"name": "w1", "bytes": 4000, "kind": "parameter"},
        {"name": "w2", "bytes": 2000, "kind": "parameter"},
        {"name": "dw1", "bytes": 4000, "kind": "gradient", "of": "w1"},
        {"name": "dw2", "bytes": 2000, "kind": "gradient", "of": "w2"},
        {"name": "w1.m", "bytes": 4000, "kind": "optimizer_state", "of": "w1"},
        {"name": "w1.v", "bytes": 4000, "kind": "optimizer_state", "of": "w1"},
        {"name": "w2.m", "bytes": 2000, "kind": "optimizer_state", "of": "w2"},
        {"name": "w2.v", "bytes": 2000, "kind": "optimizer_state", "of": "w2"},
    ],
}  # fmt: skip


def mlp_training_step() -> dict:
    """A fresh copy of the graph document (tests mutate it)."""
    return copy.deepcopy(_STEP)
