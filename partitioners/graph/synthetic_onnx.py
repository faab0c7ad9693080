"""A GPT-style ONNX graph as the TorchScript exporter writes one, as many layers deep as asked.

The real fixtures (tests/fixtures/onnx) stop at a few thousand nodes. Compiler pipelines
send far larger exports, and what makes them slow to import is not their GEMMs but the
way exporters spell dynamic axes: every head split and merge reads the activation's
runtime shape (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``), which shape
inference alone cannot see through and the importer folds once the dims are bound. So
each layer here carries those chains, beside LayerNormalization, the QKV, attention and
MLP MatMuls, Softmax and the residual Adds: 51 nodes a layer; 12 layers make 616 nodes,
where the exported GPT-2 fixture has 2,262. Weights are graph-only (dims and dtype, external
data that is never written), as a pipeline uploads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["synthetic_transformer_onnx", "NODES_PER_LAYER"]

NODES_PER_LAYER = 51


def _weight(name: str, dims: list[int]) -> TensorProto:
    """An fp32 weight with dims and no values (a graph-only upload's initializer)."""
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = TensorProto.FLOAT
    tensor.dims.extend(dims)
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    return tensor


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0

    def node(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs: Any) -> list[str]:
        self._count += 1
        outputs = [f"{op_type.lower()}_{self._count}_{k}" for k in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=f"/{op_type}_{self._count}", **attrs))
        return outputs

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def dim(self, x: str, axis: int) -> str:
        """``x.shape[axis]`` as a 1-element int64 vector: Shape, Gather, Unsqueeze."""
        (shape,) = self.node("Shape", [x])
        (picked,) = self.node("Gather", [shape, f"axis{axis}"], axis=0)
        (vector,) = self.node("Unsqueeze", [picked, "zero_axis"])
        return vector

    def reshape_like(self, x: str, shape_of: str, tail: list[str]) -> str:
        """Reshape ``x`` to ``(batch, sequence, *tail)`` read from ``shape_of`` at run time."""
        batch, sequence = self.dim(shape_of, 0), self.dim(shape_of, 1)
        (target,) = self.node("Concat", [batch, sequence, *tail], axis=0)
        (out,) = self.node("Reshape", [x, target])
        return out


def synthetic_transformer_onnx(n_layers: int, *, hidden: int = 768, heads: int = 12, vocab: int = 50257) -> bytes:
    """A serialized opset-17 model with dynamic ``batch`` and ``sequence`` input axes.

    Parameters
    ----------
    n_layers : int
        Transformer layers; the graph has ``NODES_PER_LAYER * n_layers`` nodes plus four.
    hidden, heads, vocab : int
        The model's width, attention heads and vocabulary (GPT-2 small by default).
    """
    b = _Builder()
    head_dim = hidden // heads
    for axis in (0, 1):
        b.const(f"axis{axis}", np.array(axis, dtype=np.int64))
    b.const("zero_axis", np.array([0], dtype=np.int64))
    b.const("heads", np.array([heads], dtype=np.int64))
    b.const("head_dim", np.array([head_dim], dtype=np.int64))
    b.const("minus_one", np.array([-1], dtype=np.int64))
    b.const("scale", np.array(float(np.sqrt(head_dim)), dtype=np.float32))
    b.initializers.append(_weight("ln_scale", [hidden]))
    b.initializers.append(_weight("ln_bias", [hidden]))
    b.initializers.append(_weight("wte", [vocab, hidden]))

    (x,) = b.node("Gather", ["wte", "input_ids"], axis=0)
    for layer in range(n_layers):
        w = {name: f"h{layer}.{name}" for name in ("qkv", "proj", "fc", "out")}
        for name, dims in (
            ("qkv", [hidden, 3 * hidden]),
            ("proj", [hidden, hidden]),
            ("fc", [hidden, 4 * hidden]),
            ("out", [4 * hidden, hidden]),
        ):
            b.initializers.append(_weight(w[name], dims))
        (normed,) = b.node("LayerNormalization", [x, "ln_scale", "ln_bias"], axis=-1)
        (qkv,) = b.node("MatMul", [normed, w["qkv"]])
        q, k, v = b.node("Split", [qkv], n_outputs=3, axis=-1, num_outputs=3)
        split_heads = []
        for part in (q, k, v):
            shaped = b.reshape_like(part, normed, ["heads", "head_dim"])
            (moved,) = b.node("Transpose", [shaped], perm=[0, 2, 1, 3])
            split_heads.append(moved)
        q, k, v = split_heads
        (k_t,) = b.node("Transpose", [k], perm=[0, 1, 3, 2])
        (scores,) = b.node("MatMul", [q, k_t])
        (scaled,) = b.node("Div", [scores, "scale"])
        (probs,) = b.node("Softmax", [scaled], axis=-1)
        (context,) = b.node("MatMul", [probs, v])
        (merged,) = b.node("Transpose", [context], perm=[0, 2, 1, 3])
        merged = b.reshape_like(merged, normed, ["minus_one"])
        (attn,) = b.node("MatMul", [merged, w["proj"]])
        (x,) = b.node("Add", [x, attn])
        (normed,) = b.node("LayerNormalization", [x, "ln_scale", "ln_bias"], axis=-1)
        (up,) = b.node("MatMul", [normed, w["fc"]])
        (act,) = b.node("Relu", [up])
        (down,) = b.node("MatMul", [act, w["out"]])
        (x,) = b.node("Add", [x, down])
    (normed,) = b.node("LayerNormalization", [x, "ln_scale", "ln_bias"], axis=-1)
    (wte_t,) = b.node("Transpose", ["wte"], perm=[1, 0])
    (logits,) = b.node("MatMul", [normed, wte_t])
    graph = helper.make_graph(
        b.nodes,
        f"synthetic-gpt-{n_layers}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["batch", "sequence", vocab])],
        initializer=b.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data: bytes = model.SerializeToString()  # protobuf's Message has no stubs here: Any to mypy
    return data
