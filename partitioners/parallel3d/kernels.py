"""Time of single kernels on one GPU, for many candidate layouts at once.

The GEMM model is a roofline (Williams, Waterman, Patterson, "Roofline", CACM 2009) of
each per-GPU matrix product against the GPU's GEMM ceiling and HBM bandwidth, with wave
quantisation over the SMs and a saturation factor for small dimensions (NVIDIA, "Matrix
Multiplication Background User's Guide"), so large tensor-parallel sizes and small
micro-batches run below peak instead of at it. Backward GEMMs are costed at their own
shapes. The memory-bound kernels a step adds are here too: the vocabulary-parallel
embedding, unfused weight-gradient accumulation and Transformer Engine's FP8 casts; and
how far FlashAttention falls below its long-sequence rate on short calls.
:mod:`partitioners.parallel3d.cost` composes them into a training step.
"""

from __future__ import annotations

import numpy as np

from partitioners.parallel3d.arrays import FloatArray
from partitioners.parallel3d.specs import ModelSpec, TrainingSpec

__all__ = [
    "gemm_time_s",
    "gemm_backward_time_s",
    "embedding_time_s",
    "gradient_accumulation_time_s",
    "fp8_quantize_time_s",
    "flash_attention_slowdown",
    "expert_host_issue_time_s",
    "HOST_S_PER_EXPERT_OP",
    "KERNEL_GAP_S",
    "LAYER_KERNELS_FORWARD",
    "LAYER_KERNELS_BACKWARD",
    "layer_kernel_gaps_s",
]

# GEMM output tile of cuBLAS/CUTLASS kernels used for the wave-quantisation estimate.
_TILE = 128
# Per-dimension half-saturation size of a GEMM: with d / (d + 200) per dimension a square
# GEMM reaches ~57% of the ceiling at 1024, ~86% at 4096 and ~93% at 8192, the shape of
# the throughput-versus-size curves in NVIDIA's "Matrix Multiplication Background User's
# Guide" (A100, FP16) -- fitted to those curves, not measured here.
_GEMM_HALF_DIM = 200.0
# Time the GPU loses between two dependent kernels of one stream even when the host has
# queued them ahead: A. Gray, "Getting Started with CUDA Graphs", NVIDIA Technical Blog,
# 2019: 20 kernels of 2.9 us took 3.8 us each launched back to back (0.9 us between
# kernels) and 3.4 us each as one CUDA graph. The placement cost model's profiles cite the
# same measurement (docs/costmodel.md).
KERNEL_GAP_S = 0.9e-6
# Kernels one transformer layer runs per micro-batch in Megatron-Core on Transformer Engine
# (16-bit, flash attention, fused bias-dropout-add), counted from the layer's modules.
# Forward 12: LayerNormLinear (norm, QKV GEMM), fused RoPE on queries and keys (2), flash
# attention, the projection GEMM, bias-dropout-add, LayerNormMLP (norm, fc1 GEMM,
# activation, fc2 GEMM), bias-dropout-add. Backward 20: an input- and a weight-gradient
# GEMM per linear (8), the two norms' backward (2), the activation's, flash attention's
# three (preprocess, main, dQ conversion), RoPE's two, the two residual branches' (2) and
# the two norms' weight-gradient reductions (2). Collectives, FP8 casts and the experts'
# own operations are counted where they are modelled.
LAYER_KERNELS_FORWARD = 12.0
LAYER_KERNELS_BACKWARD = 20.0
# Host time of one per-expert operation of a grouped expert MLP (a cuBLAS GEMM or a
# Transformer Engine cast, with its Python and dispatcher work): FITTED, not measured here.
# The operations per expert are counted from the code (effective.expert_host_ops: 6 per
# layer forward + backward in BF16, 14 in FP8 with current scaling); the time per operation
# that closes the gap between the predicted and the measured step, to first order, per row
# of Megatron-Bridge's H100 MoE benchmarks (NeMo 26.02, force-balanced): GPT-OSS-120B BF16
# 54 us, Qwen3-30B-A3B FP8 44 us, Qwen3-235B-A22B FP8 53 us (``python -m bench.parallel3d``
# prints them beside the table); 45 us keeps all three within 5% (their median, 53 us, would
# put Qwen3-30B-A3B 8% slow). Without the term the three read +40%, +143% and +20%. It is 2-9x the 5-25 us
# a plain PyTorch eager operator costs on the host (dispatcher, autograd, cudaLaunchKernel)
# because Transformer Engine's grouped linear prepares each expert's quantizer, workspace
# and GEMM arguments in Python. Yan et al., "Scalable Training of Mixture-of-Experts Models
# with Megatron Core" (arXiv:2603.07685, 2026) name the cause: small expert GEMMs behind
# many host launches leave MoE layers host-bound; sync-free CUDA graphs of the MoE layer
# removed it (+93% on GPT-OSS, NVIDIA, "Boosting MoE Training Throughput with Advanced
# Fusion Kernels", 2026).
HOST_S_PER_EXPERT_OP = 45e-6
# Embedding backward: a dense (V/t x h) gradient is zero-filled and scatter-added in
# bf16 (write 2 + read 2 bytes per element) and accumulated into the fp32 main
# gradient (read 4 + write 4): ~12 bytes per element per micro-batch on the first stage
# (PyTorch ``embedding_dense_backward``; Megatron's ``main_grad`` accumulation).
_EMBEDDING_GRAD_BYTES_PER_ELEMENT = 12.0
# Keys one FlashAttention call loops over at which it runs at half its long-sequence rate:
# s / (s + 240) fits, within 1% at every length, the forward throughput pytorch/benchmark
# measured on H100 for FlashAttention-3 and for the Triton FlashAttention-2 (head dim 128,
# batch x sequence fixed at 16K tokens, sequence 512 to 16,384; pytorch/benchmark#2391:
# FA3 430 -> 621 TFLOP/s, Triton 329 -> 477). Both kernels share the shape: it is the
# per-block loop's start-up and epilogue, amortised over the keys, as in a GEMM's K loop.
_FLASH_HALF_RATE_KEYS = 240.0
# The sequence at which the kernel's peak fraction of the GEMM ceiling was read (the
# FlashAttention-2 paper's longest, 16K; see parallel3d_cost._FLASH_OVER_GEMM).
_FLASH_REFERENCE_KEYS = 16384.0
# Query rows of one FlashAttention tile (kBlockM = 128 for head dims up to 128 in
# FlashAttention-2 and -3): under a causal mask the tiles on the diagonal are computed
# whole and half thrown away.
_FLASH_BLOCK_ROWS = 128.0


def gemm_time_s(
    m: FloatArray | float,
    n: FloatArray | float,
    k: FloatArray | float,
    peak: float,
    eff: float,
    hbm: float,
    sms: int,
    bytes_per_element: float = 2.0,
    batch: FloatArray | float = 1.0,
) -> FloatArray:
    """Time of ``batch`` independent ``(m x k) @ (k x n)`` products in one kernel on one GPU.

    Roofline of compute at ``eff * peak`` (the asymptotic cuBLAS ceiling, reduced for
    small dimensions by a saturation factor per dimension) against HBM traffic
    of the three operands, with the compute side stretched by wave quantisation:
    the outputs are cut into 128x128 tiles, one per SM at a time, and the last wave
    runs partly empty (NVIDIA, "Matrix Multiplication Background User's Guide").
    A batched or grouped GEMM (attention heads, local experts) spreads the tiles
    of all its products over the SMs together.
    """
    m = np.maximum(m, 1.0)
    n = np.maximum(n, 1.0)
    k = np.maximum(k, 1.0)
    batch = np.maximum(batch, 1.0)
    m_tiles = np.ceil(m / _TILE)
    n_tiles = np.ceil(n / _TILE)
    tiles = m_tiles * n_tiles * batch
    waves = np.ceil(tiles / sms)
    quantisation = (m * n * batch) / (waves * sms * _TILE * _TILE)
    # below a few thousand in any dimension, prologue/epilogue and K-loop start-up are not
    # amortised: d / (d + d0) per dimension. The output dimensions count as the tiles
    # compute them, padded to whole tiles: the quantisation above already charges the
    # padding, so a dimension far below one tile is not penalised twice (which made a
    # 1-wide product cost milliseconds).
    m_padded = m_tiles * _TILE
    n_padded = n_tiles * _TILE
    saturation = (
        (m_padded / (m_padded + _GEMM_HALF_DIM)) * (n_padded / (n_padded + _GEMM_HALF_DIM)) * (k / (k + _GEMM_HALF_DIM))
    )
    compute = 2.0 * m * n * k * batch / (peak * eff * saturation * np.minimum(quantisation, 1.0))
    memory = bytes_per_element * (m * k + k * n + m * n) * batch / hbm
    time_s: FloatArray = np.maximum(compute, memory)
    return time_s


def layer_kernel_gaps_s() -> tuple[float, float]:
    """GPU time one transformer layer loses between its kernels per micro-batch, forward and backward.

    Small layers run kernels of a few microseconds, and the gap before each
    (:data:`KERNEL_GAP_S`) is then a visible share of the layer: a fixed cost per layer and
    micro-batch that the GEMM roofline, which times the kernels themselves, leaves out.
    A recomputed forward pays the forward's gaps again (the caller adds them to the
    forward's time).
    """
    return LAYER_KERNELS_FORWARD * KERNEL_GAP_S, LAYER_KERNELS_BACKWARD * KERNEL_GAP_S


def expert_host_issue_time_s(local_experts: FloatArray | float, ops_per_expert: float) -> FloatArray:
    """Host time, not hidden under GPU work, of one pass of a grouped expert MLP.

    Megatron-Core's alltoall dispatcher copies ``tokens_per_expert`` to the host and waits
    for it every MoE layer (the GEMM splits are host integers), so nothing is queued on
    the GPU when the expert MLP starts; Transformer Engine's grouped linear then splits
    the tokens, prepares and quantizes each expert's operands and builds the GEMM argument
    lists before one call launches the experts' GEMMs. The GPU waits through that work,
    which grows with the local experts: the caller adds it to the GPU time of the expert
    GEMMs (fitted as such, :data:`HOST_S_PER_EXPERT_OP`).
    """
    return np.asarray(local_experts, dtype=float) * ops_per_expert * HOST_S_PER_EXPERT_OP


def embedding_time_s(
    tokens: FloatArray | float, hidden_size: int, vocab_size: int, tp: FloatArray | float, hbm_bytes_per_s: float
) -> FloatArray:
    """Memory-bound time of the input embedding, forward and backward, for one micro-batch.

    Megatron puts the word embedding on the first pipeline stage (Narayanan et al.,
    SC21, Sec. 3; the output layer on the last) and splits it along the vocabulary
    across the tensor group (Shoeybi et al., "Megatron-LM", 2019, Sec. 3). Forward: each
    token's bf16 row is read and written (``4 h`` bytes per token). Backward: a dense
    ``V/t x h`` gradient is zero-filled and scatter-added in bf16 and accumulated into
    the fp32 main gradient, ``_EMBEDDING_GRAD_BYTES_PER_ELEMENT`` (12) bytes per element
    (PyTorch ``embedding_dense_backward``) -- per micro-batch, however few tokens it has.
    The tensor-parallel all-reduce of the looked-up rows is costed with the other
    collectives.

    Parameters
    ----------
    tokens : array_like
        Local tokens of one micro-batch.
    hidden_size, vocab_size : int
        ``h`` and ``V``.
    tp : array_like
        Tensor-parallel size (the vocabulary shard is ``V/t``).
    hbm_bytes_per_s : float
        Achievable HBM bandwidth.

    Returns
    -------
    numpy.ndarray
        Seconds.
    """
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    return (
        tokens * hidden_size * 4.0 + _EMBEDDING_GRAD_BYTES_PER_ELEMENT * vocab_size * hidden_size / tp
    ) / hbm_bytes_per_s


def gradient_accumulation_time_s(
    params_per_gpu: FloatArray | float, grad_bytes_per_param: float, hbm_bytes_per_s: float
) -> FloatArray:
    """Memory-bound time of adding one micro-batch's weight gradients into the accumulator.

    Without gradient-accumulation fusion each micro-batch's backward writes a fresh
    16-bit gradient per parameter, and a second kernel adds it into the accumulation
    buffer (PyTorch autograd's ``AccumulateGrad`` for bf16/fp16 ``.grad``; Megatron-LM's
    ``main_grad.add_(grad)`` hook for fp32 main gradients, Narayanan et al. SC21, Sec. 4):
    read the new gradient (2 bytes), read and write the accumulator (``grad_bytes``
    each) -- 10 bytes per parameter and micro-batch with fp32 main gradients. Fused
    accumulation (the weight-gradient GEMM's epilogue adds into the fp32 buffer,
    Megatron-LM ``--gradient-accumulation-fusion``) hides this under the GEMM, so the
    caller charges it only for unfused stacks. It is paid per micro-batch, so it
    penalises many small micro-batches, which the pipeline bubble otherwise rewards.

    Parameters
    ----------
    params_per_gpu : array_like
        Parameters of the pipeline stage held by one GPU.
    grad_bytes_per_param : float
        Bytes of the accumulation buffer per parameter (4 for fp32 main gradients).
    hbm_bytes_per_s : float
        Achievable HBM bandwidth.
    """
    return np.asarray(params_per_gpu, dtype=float) * (2.0 + 2.0 * grad_bytes_per_param) / hbm_bytes_per_s


def gemm_backward_time_s(
    m: FloatArray | float,
    n: FloatArray | float,
    k: FloatArray | float,
    peak: float,
    eff: float,
    hbm: float,
    sms: int,
    bytes_per_element: float = 2.0,
    batch: FloatArray | float = 1.0,
) -> FloatArray:
    """Backward of ``Y (m x n) = X (m x k) W (k x n)``: the two GEMMs at their own shapes.

    ``dX = dY W^T`` is an ``(m x n)(n x k)`` product and ``dW = X^T dY`` a
    ``(k x m)(m x n)`` one: twice the forward FLOPs (Narayanan et al., SC21, Appendix),
    but the weight gradient's output is the weight shard and its reduction runs over
    the tokens, so its tiles, waves and saturation differ from the forward's (a skinny
    tensor-parallel shard with few tokens fills the SMs better backward than forward).
    """
    return gemm_time_s(m, k, n, peak, eff, hbm, sms, bytes_per_element, batch) + gemm_time_s(
        k, n, m, peak, eff, hbm, sms, bytes_per_element, batch
    )


def fp8_quantize_time_s(
    model: ModelSpec, training: TrainingSpec, tokens: FloatArray, tp: FloatArray, hbm_bytes_per_s: float, fp8: bool
) -> tuple[dict[bool, FloatArray], dict[bool, FloatArray]]:
    """Forward and backward time one layer spends quantizing GEMM operands to FP8, per micro-batch.

    An FP8 GEMM needs FP8 operands: Transformer Engine casts every linear's input in
    the forward pass and every output gradient in the backward pass, writing the FP8
    tensor and its transpose (the weight-gradient GEMM reads the other layout; Hopper's
    FP8 tensor cores take only the "TN" layout). That is a memory-bound pass reading
    2 bytes and writing 1 + 1 per element. With delayed scaling (TE's default recipe)
    the scale comes from past amaxes and the LayerNorm kernel writes its output in FP8
    directly, so the two LayerNorm-fed inputs cost nothing extra; with current scaling
    the amax of the tensor itself must be known first: one more 2-byte read pass, and
    the LayerNorm output is quantized like any other tensor. Weights are cast once per
    step (TE caches them across micro-batches), which is left out.

    Returns ``({False: dense, True: MoE}, {False: dense, True: MoE})`` layer times; zeros
    when the linears do not run in FP8.
    """
    zeros = np.zeros_like(np.asarray(tokens, dtype=float))
    if not fp8:
        return {False: zeros, True: zeros}, {False: zeros, True: zeros}
    h = model.hidden_size
    up = 2 if model.gated_mlp else 1
    tp = np.asarray(tp, dtype=float)
    rep_div = np.where(training.sequence_parallel, tp, 1.0)  # the sequence-sharded tensors
    current = training.fp8_scaling == "current"
    bytes_per_element = 6.0 if current else 4.0
    ln_fed = h / rep_div if current else 0.0  # LayerNorm output feeding QKV / the MLP up-projection
    # attention linears: inputs other than the LayerNorm output (MLA's latents, the heads'
    # output entering the row-parallel projection) and every output gradient
    attn_inputs = sum(p.in_per_rank(tp) for p in model.attention_projections if p.reads != "norm")
    attn_output_grads = sum(
        h / rep_div if p.split == "row" else p.out_per_rank(tp) for p in model.attention_projections
    )

    def per_token(
        mlp_fwd: FloatArray | float, mlp_bwd: FloatArray | float
    ) -> tuple[FloatArray | float, FloatArray | float]:
        # forward: QKV input, projection input (the local heads' output), MLP inputs;
        # backward: the output gradients of QKV, projection and the MLP's two linears
        fwd = ln_fed + attn_inputs + mlp_fwd
        bwd = attn_output_grads + mlp_bwd
        return fwd * bytes_per_element, bwd * bytes_per_element

    dense_fwd, dense_bwd = per_token(ln_fed + model.ffn / tp, up * model.ffn / tp + h / rep_div)
    if model.moe is not None:
        moe = model.moe
        k, fe, shared = moe.experts_per_token, moe.expert_ffn_hidden_size, moe.shared_experts
        # each routed copy of a token enters its expert whole (h) and leaves it whole
        moe_fwd, moe_bwd = per_token(
            k * h + (k + shared) * fe / tp + (ln_fed if shared else 0.0),
            (k + shared) * up * fe / tp + k * h + (h / rep_div if shared else 0.0),
        )
    else:
        moe_fwd, moe_bwd = dense_fwd, dense_bwd
    scale = tokens / hbm_bytes_per_s
    return {False: dense_fwd * scale, True: moe_fwd * scale}, {False: dense_bwd * scale, True: moe_bwd * scale}


def _flash_rate(keys: FloatArray) -> FloatArray:
    """FlashAttention's rate over ``keys`` keys per call, relative to the reference length."""
    return (keys / (keys + _FLASH_HALF_RATE_KEYS)) / (
        _FLASH_REFERENCE_KEYS / (_FLASH_REFERENCE_KEYS + _FLASH_HALF_RATE_KEYS)
    )


def flash_attention_slowdown(seq_length: int, cp: FloatArray | float) -> FloatArray:
    """How much longer causal FlashAttention takes per FLOP than at its long-sequence rate.

    A FlashAttention kernel loops, for each block of 128 queries, over the blocks of keys
    it may see, so its throughput grows with the keys per call as ``k / (k + 240)``
    (``_FLASH_HALF_RATE_KEYS``; ~69% of the long-sequence rate at 512 keys, ~91% at 2,048).
    A causal call of ``L`` tokens loops over ``L / 2`` keys on average, and computes its
    diagonal tiles whole: ``n / (n + 1)`` of the tile work is useful for ``n = L / 128``
    query blocks.

    Context parallelism cuts those calls shorter. The load-balanced ring of Megatron-Core
    and Transformer Engine (Liu et al., "Ring Attention", 2023; TE
    ``AttnFuncWithCPAndKVP2P``) gives each rank two chunks of ``c = s / (2 cp)`` tokens and
    runs ``cp`` steps of equal work: one causal call over its own ``2c`` tokens, then
    ``cp - 1`` unmasked calls against one chunk (``c`` keys) or two (``2c`` keys), half the
    ranks each. The result is the mean of ``1 / rate`` over the steps; it multiplies the
    time computed at ``_FLASH_OVER_GEMM`` of the GEMM ceiling.

    Only the shape comes from the H100 measurements; it is applied to every GPU. On B200
    FlashAttention-4's causal calls fall further below their unmasked ones at short lengths
    (Dao-AILab/flash-attention#2605: 33% of peak at 1K against 62% unmasked), so there this
    is optimistic.
    """
    cp = np.asarray(cp, dtype=float)
    chunk = seq_length / (2.0 * cp)
    local = 2.0 * chunk  # the causal call's tokens: the rank's two chunks
    diagonal_blocks = np.maximum(local / _FLASH_BLOCK_ROWS, 1.0)
    # the causal call loops over half its keys on average: one chunk's worth
    causal_rate = _flash_rate(chunk) * diagonal_blocks / (diagonal_blocks + 1.0)
    unmasked_inverse = 0.5 * (1.0 / _flash_rate(chunk) + 1.0 / _flash_rate(local))
    return (1.0 / causal_rate + (cp - 1.0) * unmasked_inverse) / cp
