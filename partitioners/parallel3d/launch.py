"""Launch configurations of a planned layout: the arguments each framework reads to run it.

A candidate is only useful if a user can start it. This module writes one layout as

* Megatron-LM / Megatron-Core command-line arguments (names as declared in NVIDIA/Megatron-LM
  ``megatron/training/arguments.py``, release v0.15.3),
* a torchtitan TOML ``[parallelism]`` section with the ``[training]`` and
  ``[activation_checkpoint]`` fields it needs (names as declared in pytorch/torchtitan
  ``torchtitan/config/job_config.py``),
* a DeepSpeed JSON config (keys as documented at deepspeed.ai/docs/config-json and in the
  AutoTP training tutorial, deepspeed.ai/tutorials/autotp-training),

and where a framework cannot express the layout (DeepSpeed's JSON has no pipeline size:
``deepspeed.pipe.PipelineModule(num_stages=...)`` sets it in code; torchtitan has no
ZeRO-1), it says why instead of writing a config that would run something else. The
emitted settings are the planner's assumptions about the run (sequence parallelism,
overlaps, dispatcher), so a config reproduces what was predicted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from partitioners.parallel3d.presets import RANK_ORDERS
from partitioners.parallel3d.specs import ModelSpec, TrainingSpec

__all__ = ["FRAMEWORKS", "LaunchLayout", "LaunchConfig", "launch_configs"]

FRAMEWORKS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class LaunchLayout:
    """The layout facts a launch configuration states (one planner candidate)."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    virtual_stages: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    recompute_num_layers: int
    rank_order: str
    layers_per_stage: int
    first_stage_layers: int
    last_stage_layers: int


@dataclass(frozen=True)
class LaunchConfig:
    """One framework's configuration for a layout, or why the framework cannot run it."""

    framework: str
    config: str | None
    unavailable: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "config": self.config,
            "unavailable": self.unavailable,
            "notes": list(self.notes),
        }


def _uneven_stages(model: ModelSpec, layout: LaunchLayout) -> bool:
    return layout.pp > 1 and layout.pp * layout.layers_per_stage != model.num_layers


def _megatron(model: ModelSpec, training: TrainingSpec, layout: LaunchLayout) -> LaunchConfig:
    """Megatron-Core arguments (megatron/training/arguments.py)."""
    if layout.recompute == "op-sac":
        return LaunchConfig(
            "megatron",
            None,
            "Megatron-Core has no per-operator selective checkpointing (torchtitan's op-level SAC); its "
            "selective recomputation (--recompute-granularity selective) is another variant",
        )
    if layout.pp > 1 and training.pipeline_schedule != "1f1b":
        return LaunchConfig(
            "megatron",
            None,
            f"Megatron-Core's pipeline schedules are 1F1B and interleaved 1F1B; it has no {training.pipeline_schedule} "
            "schedule (megatron/core/pipeline_parallel/schedules.py)",
        )
    args: list[str] = [
        f"--tensor-model-parallel-size {layout.tp}",
        f"--pipeline-model-parallel-size {layout.pp}",
        f"--context-parallel-size {layout.cp}",
        f"--micro-batch-size {layout.micro_batch_size}",
        f"--global-batch-size {training.global_batch_sequences}",
    ]
    notes: list[str] = []
    if model.moe is not None:
        args += [f"--expert-model-parallel-size {layout.ep}", f"--expert-tensor-parallel-size {layout.etp}"]
        if training.expert_dispatch == "node-deduplicated":
            args += ["--moe-token-dispatcher-type flex", "--moe-enable-deepep"]
        else:
            args.append("--moe-token-dispatcher-type alltoall")
        if training.overlap_ep_comm:
            args.append("--overlap-moe-expert-parallel-comm")
    if training.sequence_parallel and layout.tp > 1:
        args.append("--sequence-parallel")
    uneven_stages = _uneven_stages(model, layout)
    chunks_even = layout.layers_per_stage % layout.virtual_stages == 0
    if uneven_stages:
        args += [
            f"--decoder-first-pipeline-num-layers {layout.first_stage_layers}",
            f"--decoder-last-pipeline-num-layers {layout.last_stage_layers}",
        ]
    if layout.virtual_stages > 1:
        if chunks_even and not uneven_stages:
            args.append(f"--num-layers-per-virtual-pipeline-stage {layout.layers_per_stage // layout.virtual_stages}")
        else:
            args.append(f"--num-virtual-stages-per-pipeline-rank {layout.virtual_stages}")
            if not chunks_even or layout.first_stage_layers % layout.virtual_stages:
                notes.append(
                    "model chunks of unequal size: state the placement layer by layer with "
                    "--pipeline-model-parallel-layout (Megatron-Core), which this answer does not write"
                )
        if not training.overlap_p2p_comm:
            args.append("--no-overlap-p2p-communication")
    if layout.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif layout.recompute == "full":
        args += [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {layout.recompute_num_layers}",
        ]
    if layout.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    elif layout.zero_stage >= 2:
        strategy = "optim_grads" if layout.zero_stage == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}"]
    if training.overlap_grad_reduce and layout.dp * layout.cp > 1:
        args.append("--overlap-grad-reduce")
        if layout.zero_stage >= 1:
            args.append("--overlap-param-gather")
    if training.overlap_tp_comm and layout.tp > 1:
        args.append("--tp-comm-overlap")
    if not training.gradient_accumulation_fusion:
        args.append("--no-gradient-accumulation-fusion")
    if layout.rank_order == RANK_ORDERS[1]:
        args.append("--use-tp-pp-dp-mapping")
    args.append("--fp16" if training.precision == "fp16" else "--bf16")
    if training.precision == "fp8":
        args += [
            "--fp8-format hybrid",
            f"--fp8-recipe {'tensorwise' if training.fp8_scaling == 'current' else 'delayed'}",
        ]
    if training.flash_attention:
        args.append("--attention-backend flash")
    if training.software != "megatron-core":
        notes.append(
            f"argument names of today's Megatron-Core; {training.software}'s own code named some differently "
            "(--checkpoint-activations for full recomputation in 2021)"
        )
    return LaunchConfig("megatron", " ".join(args), notes=tuple(notes))


def _torchtitan(model: ModelSpec, training: TrainingSpec, layout: LaunchLayout) -> LaunchConfig:
    """torchtitan's TOML job config (torchtitan/config/job_config.py)."""

    def refuse(why: str) -> LaunchConfig:
        return LaunchConfig("torchtitan", None, why)

    if layout.pp > 1 and training.pipeline_schedule in ("dualpipe", "zero-bubble"):
        return refuse(
            f"torchtitan's schedules (torch.distributed.pipelining) have DualPipeV and V-shaped zero-bubble ones, "
            f"not {training.pipeline_schedule} as planned (two weight copies per rank, or ZB-H1)"
        )
    if layout.rank_order != RANK_ORDERS[0]:
        return refuse(
            f"torchtitan's device mesh is [pp, dp_replicate, dp_shard, cp, tp] (outermost first), i.e. "
            f"{RANK_ORDERS[0]}; it has no {layout.rank_order} order"
        )
    if layout.zero_stage == 1:
        return refuse("torchtitan shards with FSDP2 (ZeRO-3, or ZeRO-2 with reshard_after_forward never); no ZeRO-1")
    if layout.recompute == "selective":
        return refuse(
            "Megatron's selective recomputation (attention core only) is not torchtitan's selective "
            "checkpointing (per-op SAC of every other matmul, or every n-th layer)"
        )
    if model.moe is not None and layout.ep > 1 and layout.tp > 1 and layout.etp == layout.tp:
        return refuse("this torchtitan config has no expert tensor-parallel degree: experts split over tp ranks")
    if _uneven_stages(model, layout) or layout.layers_per_stage % layout.virtual_stages:
        return refuse(
            "uneven pipeline stages or model chunks: torchtitan states them as pipeline_parallel_split_points "
            "(module names), which this answer does not write"
        )
    sharded = layout.zero_stage >= 2
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {1 if sharded else layout.dp}",
        f"data_parallel_shard_degree = {layout.dp if sharded else 1}",
    ]
    if layout.zero_stage == 2:
        lines.append('fsdp_reshard_after_forward = "never"')
    lines += [
        f"tensor_parallel_degree = {layout.tp}",
        f"pipeline_parallel_degree = {layout.pp}",
        f"context_parallel_degree = {layout.cp}",
    ]
    if model.moe is not None:
        lines.append(f"expert_parallel_degree = {layout.ep}")
    if layout.pp > 1:
        # DualPipeV's V: two model chunks per rank, each half a stage
        chunks = 2 if training.pipeline_schedule == "dualpipev" else layout.virtual_stages
        if layout.layers_per_stage % chunks:
            return refuse(f"a DualPipeV stage of {layout.layers_per_stage} layers does not split into two equal chunks")
        schedule = {"dualpipev": "DualPipeV"}.get(
            training.pipeline_schedule, "Interleaved1F1B" if layout.virtual_stages > 1 else "1F1B"
        )
        lines += [
            f'pipeline_parallel_schedule = "{schedule}"',
            f"pipeline_parallel_layers_per_stage = {layout.layers_per_stage // chunks}",
            f"pipeline_parallel_microbatch_size = {layout.micro_batch_size}",
        ]
    if training.overlap_tp_comm and layout.tp > 1:
        lines.append("enable_async_tensor_parallel = true")
    local = training.global_batch_sequences // max(layout.dp, 1)
    lines += [
        "",
        "[training]",
        f"global_batch_size = {training.global_batch_sequences}",
        f"local_batch_size = {local if layout.pp > 1 else layout.micro_batch_size}",
        f"seq_len = {model.seq_length}",
        "",
        "[activation_checkpoint]",
    ]
    notes: list[str] = []
    if layout.recompute == "full" and layout.recompute_num_layers < layout.layers_per_stage // layout.virtual_stages:
        chunk = layout.layers_per_stage // layout.virtual_stages
        every = max(chunk // max(layout.recompute_num_layers, 1), 1)
        lines += ['mode = "selective"', f'selective_ac_option = "{every}"']
        notes.append(
            f"{layout.recompute_num_layers} of {chunk} layers recomputed as torchtitan's every-{every}-th-layer "
            "checkpointing (the same count, spread over the chunk rather than its first layers)"
        )
    elif layout.recompute == "op-sac":
        lines += ['mode = "selective"', 'selective_ac_option = "op"']
    else:
        lines.append(f'mode = "{"full" if layout.recompute == "full" else "none"}"')
    if layout.pp == 1 and local != layout.micro_batch_size:
        notes.append(
            f"torchtitan without a pipeline runs local_batch_size sequences at once; the planner's "
            f"{local // layout.micro_batch_size} micro-batches of {layout.micro_batch_size} are gradient accumulation"
        )
    return LaunchConfig("torchtitan", "\n".join(lines) + "\n", notes=tuple(notes))


def _deepspeed(model: ModelSpec, training: TrainingSpec, layout: LaunchLayout) -> LaunchConfig:
    """A DeepSpeed JSON config (deepspeed.ai/docs/config-json; AutoTP training tutorial)."""

    def refuse(why: str) -> LaunchConfig:
        return LaunchConfig("deepspeed", None, why)

    if layout.pp > 1:
        return refuse(
            "DeepSpeed's config has no pipeline size: deepspeed.pipe.PipelineModule(num_stages=...) sets it in "
            "the model code (and DeepSpeed refuses ZeRO-2/3 with a pipeline)"
        )
    if layout.cp > 1:
        return refuse("DeepSpeed's config has no context-parallel size (Ulysses sequence parallelism is set in code)")
    if model.moe is not None and layout.ep > 1:
        return refuse("DeepSpeed-MoE's expert-parallel size is an argument of deepspeed.moe.layer.MoE, not the config")
    if layout.tp > 1 and layout.zero_stage > 2:
        return refuse("DeepSpeed's AutoTP training combines tensor parallelism with ZeRO stages 0-2 only")
    if layout.recompute in ("selective", "op-sac"):
        return refuse("DeepSpeed's activation checkpointing recomputes whole blocks; no selective recomputation")
    config: dict[str, Any] = {
        "train_batch_size": training.global_batch_sequences,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": training.global_batch_sequences // (layout.dp * layout.micro_batch_size),
        "zero_optimization": {"stage": layout.zero_stage, "overlap_comm": training.overlap_grad_reduce},
    }
    if training.precision == "fp16":
        config["fp16"] = {"enabled": True}
    else:
        config["bf16"] = {"enabled": True}
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    notes: list[str] = []
    if training.precision == "fp8":
        notes.append("FP8 GEMMs come from Transformer Engine modules in the model code, not from this config")
    if layout.recompute == "full":
        notes.append(
            "full recomputation is deepspeed.checkpointing.checkpoint around each block in the model code "
            f"({layout.recompute_num_layers} layers per chunk)"
        )
    return LaunchConfig("deepspeed", json.dumps(config, indent=1), notes=tuple(notes))


def launch_configs(model: ModelSpec, training: TrainingSpec, layout: LaunchLayout) -> tuple[LaunchConfig, ...]:
    """The layout's configuration for each framework of ``FRAMEWORKS``, in that order."""
    return (
        _megatron(model, training, layout),
        _torchtitan(model, training, layout),
        _deepspeed(model, training, layout),
    )
