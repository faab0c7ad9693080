"""What a run's software settings mean physically, decided once before the cost model runs.

``TrainingSpec`` states a framework as it is configured: a ``software`` generation and
flags (``overlap_tp_backward``, ``overlap_tp_comm``, ``pipeline_scatter_gather``, ...).
Their interactions (Transformer Engine's pipelined collectives replace Megatron's
asynchronous backward ones; scatter-gather sends only matter without sequence
parallelism; an FP32 gradient copy costs nothing when gradients already are FP32) are
resolved here, in one place, into the terms the cost and memory models read: how each
collective is exposed, which extra bytes a stack holds, which extra passes it makes. Each
term names its source, and an answer lists them (``assumptions``), so a user sees what
was assumed about the stack rather than which flags were set.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from partitioners.parallel3d.schedules import PIPELINE_SCHEDULES, PipelineSchedule
from partitioners.parallel3d.specs import TrainingSpec

__all__ = [
    "TP_IN_LINE",
    "TP_ASYNC_BACKWARD",
    "TP_PIPELINED",
    "EffectiveTerms",
    "Assumption",
    "effective_terms",
    "expert_host_ops",
]

# How tensor-parallel collectives meet the GEMMs around them.
TP_IN_LINE = "in-line"
TP_ASYNC_BACKWARD = "async-backward"
TP_PIPELINED = "pipelined"


@dataclass(frozen=True)
class Assumption:
    """One physical term of the run, its value and where it comes from."""

    name: str
    value: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "value": self.value, "source": self.source}


@dataclass(frozen=True)
class EffectiveTerms:
    """The physical terms the cost and memory models read (see :func:`effective_terms`)."""

    # tensor-parallel collectives: TP_IN_LINE (every one on the critical path), TP_ASYNC_BACKWARD
    # (the column-parallel linears' backward collectives under their own GEMMs) or
    # TP_PIPELINED (all of them chunked under the neighbouring GEMMs)
    tp_overlap: str
    # data-parallel gradient reduction launched bucket by bucket under the backward pass
    dp_reduce_under_backward: bool
    # interleaved pipelines post their sends and receives asynchronously, waited for by
    # the next model chunk
    p2p_async_when_interleaved: bool
    # what a tensor rank sends across a stage boundary: "shard" (its 1/t: sequence
    # parallelism), "shard-then-gather" (1/t, then an NVLink all-gather on the receiving
    # node) or "whole"
    pipeline_send: str
    # the pipeline schedule: its idle time, weight copies and micro-batches held
    schedule: PipelineSchedule
    # expert all-to-all hidden under another micro-batch's computation (paired chunks)
    ep_comm_paired: bool
    # weight gradients accumulated by a separate pass per micro-batch
    separate_gradient_accumulation: bool
    # extra gradient bytes per parameter held whole on every rank (DDP's bucket copy)
    whole_gradient_copy_bytes: float
    # extra fp32 gradient bytes per parameter held beside the master weights (sharded with them)
    fp32_gradient_copy_bytes: float
    # every in-flight model chunk's output kept until its backward
    stage_outputs_kept: bool
    # operations the host issues for each local expert of an MoE layer, forward and backward
    # (a grouped GEMM looped over the experts on the host, after the dispatcher's sync)
    expert_host_ops_forward: float
    expert_host_ops_backward: float
    assumptions: tuple[Assumption, ...]


def expert_host_ops(training: TrainingSpec) -> tuple[float, float]:
    """Operations the host issues per local expert and MoE layer, forward and backward.

    Megatron-Core's grouped expert MLP (``TEGroupedMLP``: two Transformer Engine
    ``GroupedLinear`` layers, fc1 and fc2) splits the permuted tokens by expert and runs each
    expert's GEMM as its own cuBLAS call: one per linear forward (2), an input-gradient and
    a weight-gradient one per linear backward (4). In FP8 each quantized operand of each
    expert is cast on its own -- forward the two linears' inputs, backward their two output
    gradients -- with delayed scaling one cast-transpose kernel each, with current scaling
    an amax reduction before it (Transformer Engine ``Float8CurrentScalingQuantizer``).
    The counts are read from that code, not fitted; the time each takes on the host is
    :data:`partitioners.parallel3d.kernels.HOST_S_PER_EXPERT_OP`.
    """
    forward, backward = 2.0, 4.0
    if training.precision == "fp8":
        per_cast = 2.0 if training.fp8_scaling == "current" else 1.0
        forward += 2.0 * per_cast
        backward += 2.0 * per_cast
    return forward, backward


@functools.lru_cache(maxsize=256)
def effective_terms(training: TrainingSpec) -> EffectiveTerms:
    """Resolve the run's flags into physical terms, each with its source."""
    if training.overlap_tp_comm:
        tp_overlap, tp_source = (
            TP_PIPELINED,
            "Transformer Engine userbuffers (--tp-comm-overlap; Wang et al., ASPLOS 2023): every "
            "tensor-parallel collective chunked under the neighbouring GEMMs",
        )
    elif training.overlap_tp_backward:
        tp_overlap, tp_source = (
            TP_ASYNC_BACKWARD,
            "Megatron-LM linear_with_grad_accumulation_and_async_allreduce (2022 on): the column-parallel "
            "linears' backward collectives under their own GEMMs; forward ones in line",
        )
    else:
        tp_overlap, tp_source = TP_IN_LINE, "Megatron-LM of 2021: every tensor-parallel collective in line"
    if training.sequence_parallel:
        send, send_source = "shard", "sequence parallelism: a rank holds and sends 1/t of the stage output"
    elif training.pipeline_scatter_gather:
        send, send_source = (
            "shard-then-gather",
            "Megatron-LM scatter/gather (SC21 Sec. 4.1): 1/t sent, all-gathered over NVLink on arrival",
        )
    else:
        send, send_source = "whole", "--no-scatter-gather-tensors-in-pipeline: every rank sends the whole output"
    grad_bytes = float(training.grad_bytes_per_param)
    bucket_copy = grad_bytes if training.ddp_bucket_copy else 0.0
    fp32_copy = 4.0 if training.fp32_grad_copy_kept and grad_bytes < 4.0 else 0.0
    ops_forward, ops_backward = expert_host_ops(training)
    schedule = PIPELINE_SCHEDULES[training.pipeline_schedule]
    ep_paired = training.overlap_ep_comm or schedule.pairs_chunks
    assumptions = (
        Assumption("pipeline schedule", schedule.name, schedule.source),
        Assumption("tensor-parallel collectives", tp_overlap, tp_source),
        Assumption(
            "gradient reduction",
            "under the backward pass" if training.overlap_grad_reduce else "after the backward pass",
            "Megatron-Core --overlap-grad-reduce, bucket by bucket"
            if training.overlap_grad_reduce
            else "Megatron-LM before Megatron-Core: one reduction after the last backward",
        ),
        Assumption(
            "pipeline exchanges under interleaving",
            "asynchronous" if training.overlap_p2p_comm else "batched and synchronised",
            "Megatron-Core overlap_p2p_comm (on in NeMo and Megatron-Bridge recipes with virtual stages)"
            if training.overlap_p2p_comm
            else "Megatron-LM's batched p2p exchange with a device sync",
        ),
        Assumption("pipeline send", send, send_source),
        Assumption(
            "expert dispatch",
            training.expert_dispatch,
            "DeepEP / Megatron-Core flex dispatcher: once per destination node, then NVLink"
            if training.expert_dispatch == "node-deduplicated"
            else "Megatron-Core alltoall dispatcher: one message per (token, expert) pair",
        ),
        Assumption(
            "expert all-to-all",
            "paired with another micro-batch's computation" if ep_paired else "in line",
            "DeepSeek-V3 DualPipe / Megatron-Core --overlap-moe-expert-parallel-comm"
            if ep_paired
            else "no all-to-all overlap (Megatron-Core's default)",
        ),
        Assumption(
            "weight-gradient accumulation",
            "inside the GEMM" if training.gradient_accumulation_fusion else "a separate pass per micro-batch",
            "--gradient-accumulation-fusion (cuBLAS wgrad accumulation into fp32)",
        ),
        Assumption(
            "extra gradient bytes per parameter",
            f"{bucket_copy:g} whole + {fp32_copy:g} beside the master weights",
            "PyTorch DDP bucket copy (gradient_as_bucket_view off); Megatron-LM's pre-2022 fp16 optimizer "
            "kept an fp32 copy of each gradient",
        ),
        Assumption(
            "stage outputs",
            "kept until the backward" if training.stage_outputs_kept else "freed after the send",
            "Megatron-LM deallocate_output_tensor (2022 on) frees a sent stage output's data",
        ),
        Assumption(
            "host operations per local expert",
            f"{ops_forward:g} forward, {ops_backward:g} backward, issued one expert at a time after the dispatcher's sync",
            "Megatron-Core TEGroupedMLP on Transformer Engine GroupedLinear (fc1, fc2): per expert one GEMM per "
            "linear forward, input and weight gradient backward; in FP8 a cast (delayed scaling) or an amax and a "
            "cast (current scaling) of each operand it quantizes; the alltoall dispatcher syncs tokens_per_expert "
            "to the host each layer, so the host cannot run ahead of the expert GEMMs",
        ),
    )
    return EffectiveTerms(
        tp_overlap=tp_overlap,
        dp_reduce_under_backward=training.overlap_grad_reduce,
        p2p_async_when_interleaved=training.overlap_p2p_comm,
        pipeline_send=send,
        schedule=schedule,
        ep_comm_paired=ep_paired,
        separate_gradient_accumulation=not training.gradient_accumulation_fusion,
        whole_gradient_copy_bytes=bucket_copy,
        fp32_gradient_copy_bytes=fp32_copy,
        stage_outputs_kept=training.stage_outputs_kept,
        expert_host_ops_forward=ops_forward,
        expert_host_ops_backward=ops_backward,
        assumptions=assumptions,
    )
