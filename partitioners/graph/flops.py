"""Floating-point operation counts per operator type, from tensor shapes.

The cost model turns FLOPs into time with a roofline (``partitioners.costmodel.costs``), so
the counts here only need to be right to a few percent on the operators that
dominate real models (matrix products and convolutions) and of the right order
on the rest. Conventions, used by every formula below:

* one multiply-accumulate is **2 FLOPs** (as in the MLPerf / Kaplan et al. 2020
  counting, where a dense layer of ``N`` parameters costs ``2N`` FLOPs per token;
  ResNet-50 at 224x224 is then about 8.2 GFLOP, He et al. 2016 report 3.8-4.1 G
  multiply-adds);
* a pointwise operation (add, multiply, activation, comparison) is 1 FLOP per
  output element, whatever its hardware cost (a ``tanh`` is one FLOP, not twenty);
* shape-only and data-movement operators (``Reshape``, ``Transpose``, ``Concat``,
  ``Gather``, ``Constant``, ...) are 0 FLOPs: their cost is the bytes they move,
  which the roofline accounts for separately.

Shapes are tuples of non-negative ints; a shape that is ``None`` or contains
``None`` is unknown. When a formula needs an unknown shape, or the operator type
has no formula, the estimate falls back to the pointwise count of the known output
elements and says so in :attr:`FlopEstimate.note`, so the importer can surface a
warning instead of dropping the operator silently.

References
----------
K. He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, table 1.
J. Kaplan et al., "Scaling Laws for Neural Language Models", arXiv:2001.08361, 2020, sec. 2.1.
ONNX operator specification, https://onnx.ai/onnx/operators/ (input layouts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

__all__ = [
    "ELEMENTWISE_OPS",
    "SHAPE_ONLY_OPS",
    "Attrs",
    "FlopEstimate",
    "KnownShape",
    "Shape",
    "estimate_flops",
    "estimate_op_flops",
    "flop_formula_known",
]

#: A tensor shape as importers hand it over: ``None`` entries are unknown dimensions.
Shape = tuple[int | None, ...]
#: A shape whose every dimension is a known non-negative int (what :func:`_known` admits).
KnownShape = tuple[int, ...]
#: Operator attributes by name; values are whatever the importer decoded (int, float,
#: str, bytes, lists of those), so each formula reads and converts only what it needs.
Attrs = Mapping[str, Any]

#: Pointwise operators: 1 FLOP per output element.
ELEMENTWISE_OPS = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh",
        "BitShift", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div", "Elu", "Equal",
        "Erf", "Exp", "FastGelu", "Floor", "Gelu", "Greater", "GreaterOrEqual",
        "HardSigmoid", "HardSwish", "IsInf", "IsNaN", "LeakyRelu", "Less",
        "LessOrEqual", "Log", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg",
        "Not", "Or", "PRelu", "Pow", "QuickGelu", "Reciprocal", "Relu", "Round",
        "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt",
        "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor",
        "BiasGelu", "Dropout",
    }
)  # fmt: skip

#: Operators that only describe, copy or rearrange data: 0 FLOPs.
SHAPE_ONLY_OPS = frozenset(
    {
        "ArgMax", "ArgMin", "Cast", "CastLike", "Compress", "Concat", "Constant",
        "ConstantOfShape", "DepthToSpace", "Expand", "EyeLike", "Flatten", "Gather",
        "GatherElements", "GatherND", "Identity", "NonZero", "OneHot", "Pad", "Range",
        "Reshape", "Resize", "ScatterElements", "ScatterND", "Shape", "Size", "Slice",
        "SpaceToDepth", "Split", "Squeeze", "Tile", "Transpose", "Trilu", "Unsqueeze",
        "Upsample", "Embedding",
    }
)  # fmt: skip

#: Reductions: 1 FLOP per input element (each input element is folded in once).
_REDUCTIONS = frozenset(
    {
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
        "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
        "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "CumSum",
    }
)  # fmt: skip

#: Normalisations over a group of elements: mean (1 add), centre (1 sub), square
#: (1 mul), variance (1 add), normalise by the precomputed 1/sqrt (1 mul), scale (1
#: mul), shift (1 add) = 7 FLOPs per element.
_NORM_FLOPS_PER_ELEMENT = 7
_NORMALISATIONS = frozenset(
    {"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
     "InstanceNormalization", "GroupNormalization", "LpNormalization", "RMSNormalization",
     "MeanVarianceNormalization", "EmbedLayerNormalization"}
)  # fmt: skip

#: Inference batch norm folds to one multiply and one add per element.
_BATCHNORM_FLOPS_PER_ELEMENT = 2

#: Softmax: running max (1), subtract (1), exp (1), sum (1), divide (1).
_SOFTMAX_FLOPS_PER_ELEMENT = 5
_SOFTMAXES = frozenset({"Softmax", "LogSoftmax", "Hardmax"})

_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})

#: Quantized forms of the matrix operators: the arithmetic is the float operator's,
#: the operands sit at other input positions (ONNX QLinearMatMul: a, a_scale,
#: a_zero_point, b, ...; QLinearConv: x, x_scale, x_zero_point, w, w_scale,
#: w_zero_point, y_scale, y_zero_point, B).
_QUANTIZED_ALIASES = {
    "QLinearMatMul": ("MatMul", (0, 3)),
    "MatMulInteger": ("MatMul", (0, 1)),
    "QLinearConv": ("Conv", (0, 3, 8)),
    "ConvInteger": ("Conv", (0, 1)),
}

#: Per-element costs of small fixed pipelines: (de)quantisation is a scale and a
#: zero-point shift (2); a rotary embedding is x * cos + rotate(x) * sin (3).
_PER_ELEMENT = {"QuantizeLinear": 2, "DequantizeLinear": 2, "DynamicQuantizeLinear": 2, "RotaryEmbedding": 3}


class FlopEstimate(NamedTuple):
    """FLOPs of one execution of an operator.

    Attributes
    ----------
    flops : float
    note : str or None
        ``None`` when a formula for the operator type applied with complete shapes;
        otherwise why the figure is a fallback (unknown type, unknown shape).
    """

    flops: float
    note: str | None = None


def _known(shape: Shape | None) -> TypeGuard[KnownShape]:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _numel(shape: KnownShape) -> int:
    return math.prod(shape)


def _get(shapes: Sequence[Shape | None], i: int) -> Shape | None:
    return shapes[i] if i < len(shapes) else None


def _matmul(a: KnownShape, b: KnownShape, out: KnownShape | None) -> float:
    if len(a) < 1 or len(b) < 1:
        raise ValueError("MatMul operands must have rank 1 or more")
    # numpy matmul semantics: 1-D operands are promoted then the added axis dropped,
    # so the contracted length is a[-1] and the output holds the result elements.
    k = a[-1]
    if out is None:
        batch = _numel(a[:-2]) if len(a) > 2 else 1
        m = a[-2] if len(a) >= 2 else 1
        n = b[-1] if len(b) >= 2 else 1
        out_elems = batch * m * n
        if len(b) > 2:
            out_elems = max(out_elems, _numel(b[:-2]) * m * n)
    else:
        out_elems = _numel(out)
    return 2.0 * out_elems * k


def _gemm(a: KnownShape, b: KnownShape, shapes: Sequence[Shape | None], attrs: Attrs) -> float:
    m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
    n = b[0] if attrs.get("transB", 0) else b[1]
    flops = 2.0 * m * n * k
    if _known(_get(shapes, 2)):
        flops += m * n  # bias add (beta * C), one FLOP per output element
    return flops


def _conv(w: KnownShape, shapes: Sequence[Shape | None], out: KnownShape) -> float:
    # W is [C_out, C_in / group, k1, k2, ...]: every output element is a dot product
    # over C_in / group * prod(k) inputs.
    if len(w) < 3:
        raise ValueError("Conv weight must be [C_out, C_in / group, k...]")
    flops = 2.0 * _numel(out) * _numel(w[1:])
    if _known(_get(shapes, 2)):
        flops += _numel(out)
    return flops


def _conv_transpose(x: KnownShape, w: KnownShape, shapes: Sequence[Shape | None], out: KnownShape | None) -> float:
    # W is [C_in, C_out / group, k...]: every input element scatters into
    # C_out / group * prod(k) outputs.
    if len(w) < 3:
        raise ValueError("ConvTranspose weight must be [C_in, C_out / group, k...]")
    flops = 2.0 * _numel(x) * _numel(w[1:])
    if _known(_get(shapes, 2)) and out is not None:
        flops += _numel(out)
    return flops


def _pool(out: KnownShape, attrs: Attrs) -> float:
    kernel = attrs.get("kernel_shape")
    if not kernel:
        raise KeyError("kernel_shape")
    return float(_numel(out) * math.prod(kernel))


def _rnn(op: str, x: KnownShape, w: KnownShape, shapes: Sequence[Shape | None], attrs: Attrs) -> float:
    # X [seq, batch, input] (layout=0) or [batch, seq, input] (layout=1);
    # W [dirs, gates * hidden, input], R [dirs, gates * hidden, hidden].
    seq, batch = (x[1], x[0]) if attrs.get("layout", 0) else (x[0], x[1])
    dirs, gates_hidden, n_in = w
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    hidden = gates_hidden // gates
    # gate products: X W^T and H R^T, 2 FLOPs per MAC
    per_step = 2.0 * gates_hidden * (n_in + hidden)
    if _known(_get(shapes, 3)):
        per_step += 2 * gates_hidden  # Wb and Rb bias adds
    # pointwise cell update per hidden unit (ONNX default activations):
    #   LSTM: 3 sigmoid + 2 tanh, c = f*c + i*g (3), h = o*tanh(c) (1) -> 9
    #   GRU: 2 sigmoid + 1 tanh, r*(H Rh) (1), h = (1-z)*n + z*h (4)   -> 8
    #   RNN: 1 tanh                                                    -> 1
    per_step += hidden * {"LSTM": 9, "GRU": 8, "RNN": 1}[op]
    return per_step * seq * batch * dirs


def _einsum(shapes: Sequence[KnownShape], attrs: Attrs, out: KnownShape | None) -> float:
    equation = attrs["equation"]
    if isinstance(equation, bytes):
        equation = equation.decode()
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), shapes):
        if "..." in term:
            raise KeyError("ellipsis")
        for letter, dim in zip(term, shape):
            sizes[letter] = dim
    total = math.prod(sizes.values())
    out_elems = _numel(out) if out is not None else None
    if out_elems is not None and total == out_elems:
        return float(total)  # no contracted index: a pointwise product
    return 2.0 * total


def _attention(op: str, first: KnownShape, second: KnownShape, shapes: Sequence[Shape | None], attrs: Attrs) -> float:
    if op == "GroupQueryAttention":
        # com.microsoft.GroupQueryAttention with separate query [B, S, H * d] and key
        # inputs; past_key [B, H_kv, P, d] (input 3) extends the attended length to P + S.
        # Key/value heads are shared, so the FLOPs are those of H full heads.
        if not _known(_get(shapes, 1)):
            raise KeyError("packed QKV input")
        b, s, d = first
        past = _get(shapes, 3)
        length = s + (past[2] if _known(past) and len(past) == 4 else 0)
        heads = int(attrs.get("num_heads", 1))
        return 2 * (2.0 * b * s * length * d) + _SOFTMAX_FLOPS_PER_ELEMENT * b * heads * s * length
    if op == "Attention":
        # com.microsoft.Attention: input [B, S, D_in], weights [D_in, 3 * D]; computes
        # the QKV projection, Q K^T, softmax and the weighted sum of V.
        b, s, d_in = first
        d3 = second[1]
        d = d3 // 3
        proj = 2.0 * b * s * d_in * d3
        scores = 2.0 * b * s * s * d
        heads = int(attrs.get("num_heads", 1))
        return proj + 2 * scores + _SOFTMAX_FLOPS_PER_ELEMENT * b * heads * s * s
    # com.microsoft.MultiHeadAttention: query [B, S, D], key [B, L, D] (projected)
    b, s, d = first
    length = second[1] if len(second) == 3 else second[2]
    heads = int(attrs.get("num_heads", 1))
    return 2 * (2.0 * b * s * length * d) + _SOFTMAX_FLOPS_PER_ELEMENT * b * heads * s * length


def flop_formula_known(op_type: str) -> bool:
    """Whether :func:`estimate_flops` has a formula (not a fallback) for ``op_type``."""
    return (
        op_type in ELEMENTWISE_OPS
        or op_type in SHAPE_ONLY_OPS
        or op_type in _REDUCTIONS
        or op_type in _NORMALISATIONS
        or op_type in _SOFTMAXES
        or op_type in _POOLS
        or op_type
        in {"MatMul", "Gemm", "Conv", "ConvTranspose", "BatchNormalization", "LSTM", "GRU",
            "RNN", "Einsum", "Attention", "MultiHeadAttention", "FusedMatMul", "MatMulNBits",
            "GroupQueryAttention"}
        or op_type in _QUANTIZED_ALIASES
        or op_type in _PER_ELEMENT
    )  # fmt: skip


def estimate_flops(
    op_type: str,
    input_shapes: Sequence[Shape | None],
    output_shapes: Sequence[Shape | None],
    attrs: Attrs | None = None,
) -> FlopEstimate:
    """FLOPs of one execution of ``op_type`` given its input and output shapes.

    Parameters
    ----------
    op_type : str
        ONNX operator type (``"MatMul"``, ``"Conv"``, ...); the domain is not needed
        because the contrib operators handled (``Attention``, ``MultiHeadAttention``,
        ``FusedMatMul``, ...) have no standard namesake.
    input_shapes, output_shapes : sequence of tuple of int, or None
        In the operator's input / output order; ``None`` for unknown or absent.
    attrs : mapping, optional
        Operator attributes the formulas read (``transA``, ``kernel_shape``,
        ``equation``, ``num_heads``, ``layout``, ``K`` of ``MatMulNBits``).

    Returns
    -------
    FlopEstimate
        ``note`` is ``None`` when a formula applied; otherwise the figure is the
        pointwise fallback (1 FLOP per known output element) and ``note`` says why.
    """
    attrs = attrs or {}
    first_out = _get(output_shapes, 0)
    out = first_out if _known(first_out) else None  # the first output's shape where known

    def fallback(reason: str) -> FlopEstimate:
        elems = sum(_numel(s) for s in output_shapes if _known(s))
        return FlopEstimate(float(elems), reason)

    if op_type in SHAPE_ONLY_OPS:
        return FlopEstimate(0.0)
    if op_type in _QUANTIZED_ALIASES:
        op_type, positions = _QUANTIZED_ALIASES[op_type]
        input_shapes = [_get(input_shapes, i) for i in positions]
    try:
        if op_type in _PER_ELEMENT:
            x = _get(input_shapes, 0)
            if not _known(x):
                return fallback("input shape unknown")
            return FlopEstimate(float(_PER_ELEMENT[op_type] * _numel(x)))
        if op_type == "MatMulNBits":
            # com.microsoft.MatMulNBits: A [..., K] times a block-quantized [K, N] weight;
            # K and N are attributes because B is stored packed.
            if out is None:
                return fallback("output shape unknown")
            return FlopEstimate(2.0 * _numel(out) * int(attrs["K"]))
        if op_type in ELEMENTWISE_OPS:
            if out is None:
                return fallback("output shape unknown")
            return FlopEstimate(float(_numel(out)))
        if op_type in ("MatMul", "FusedMatMul"):
            a, b = _get(input_shapes, 0), _get(input_shapes, 1)
            if not (_known(a) and _known(b)):
                return fallback("operand shapes unknown")
            if op_type == "FusedMatMul" and (attrs.get("transA") or attrs.get("transB")):
                a = a[:-2] + (a[-1], a[-2]) if attrs.get("transA") and len(a) >= 2 else a
            return FlopEstimate(_matmul(a, b, out))
        if op_type == "Gemm":
            a, b = _get(input_shapes, 0), _get(input_shapes, 1)
            if not (_known(a) and _known(b)):
                return fallback("operand shapes unknown")
            return FlopEstimate(_gemm(a, b, input_shapes, attrs))
        if op_type == "Conv":
            w = _get(input_shapes, 1)
            if not (out is not None and _known(w)):
                return fallback("weight or output shape unknown")
            return FlopEstimate(_conv(w, input_shapes, out))
        if op_type == "ConvTranspose":
            x, w = _get(input_shapes, 0), _get(input_shapes, 1)
            if not (_known(x) and _known(w)):
                return fallback("input or weight shape unknown")
            return FlopEstimate(_conv_transpose(x, w, input_shapes, out))
        if op_type in _POOLS:
            if out is None:
                return fallback("output shape unknown")
            return FlopEstimate(_pool(out, attrs))
        if op_type in _REDUCTIONS:
            x = _get(input_shapes, 0)
            if not _known(x):
                return fallback("input shape unknown")
            return FlopEstimate(float(_numel(x)))
        if op_type in _SOFTMAXES or op_type in _NORMALISATIONS or op_type == "BatchNormalization":
            x = _get(input_shapes, 0)
            if not _known(x):
                return fallback("input shape unknown")
            per = (
                _SOFTMAX_FLOPS_PER_ELEMENT
                if op_type in _SOFTMAXES
                else _BATCHNORM_FLOPS_PER_ELEMENT
                if op_type == "BatchNormalization"
                else _NORM_FLOPS_PER_ELEMENT
            )
            return FlopEstimate(float(per * _numel(x)))
        if op_type in ("LSTM", "GRU", "RNN"):
            x, w = _get(input_shapes, 0), _get(input_shapes, 1)
            if not (_known(x) and _known(w)):
                return fallback("input or weight shape unknown")
            return FlopEstimate(_rnn(op_type, x, w, input_shapes, attrs))
        if op_type == "Einsum":
            known_inputs = [s for s in input_shapes if _known(s)]
            if len(known_inputs) < len(input_shapes):
                return fallback("operand shapes unknown")
            return FlopEstimate(_einsum(known_inputs, attrs, out))
        if op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention"):
            first, second = _get(input_shapes, 0), _get(input_shapes, 1)
            if not (_known(first) and _known(second)):
                return fallback("input shapes unknown")
            return FlopEstimate(_attention(op_type, first, second, input_shapes, attrs))
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return fallback(f"shapes or attributes do not fit the {op_type} formula ({exc!r})")
    return fallback(f"no FLOP formula for operator type '{op_type}'")


def estimate_op_flops(
    op_type: str,
    input_shapes: Sequence[Shape | None],
    output_shapes: Sequence[Shape | None],
    attrs: Attrs | None = None,
) -> tuple[float, bool]:
    """``(flops, known)``: :func:`estimate_flops` as a pair, ``known`` False on fallback.

    For callers that only need to know whether to warn (JSON ingestion).
    """
    estimate = estimate_flops(op_type, input_shapes, output_shapes, attrs)
    return estimate.flops, estimate.note is None
