"""Launch configs (partitioners.parallel3d.launch) use only names the frameworks declare.

The name lists below are read from each framework's published argument list:

* Megatron-LM: ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM, release v0.15.3
  (``group.add_argument('--...')``);
* torchtitan: ``torchtitan/config/job_config.py`` of pytorch/torchtitan (the ``Parallelism``,
  ``Training`` and ``ActivationCheckpoint`` dataclasses, one TOML section each);
* DeepSpeed: the JSON config reference (deepspeed.ai/docs/config-json: ``train_batch_size``,
  ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``zero_optimization``,
  ``fp16``, ``bf16``) and the AutoTP training tutorial (deepspeed.ai/tutorials/autotp-training:
  ``tensor_parallel.autotp_size``, with ZeRO stages 0-2).
"""

from __future__ import annotations

import json
import tomllib

import pytest

from partitioners.parallel3d.planner import evaluate_layouts, plan_parallel_layout
from tests.partitioners.parallel3d.shapes import cluster_spec, layout_specs, model_spec, training_spec

MEGATRON_ARGUMENTS = frozenset(
    {
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--context-parallel-size",
        "--micro-batch-size",
        "--global-batch-size",
        "--expert-model-parallel-size",
        "--expert-tensor-parallel-size",
        "--moe-token-dispatcher-type",
        "--moe-enable-deepep",
        "--overlap-moe-expert-parallel-comm",
        "--sequence-parallel",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        "--no-overlap-p2p-communication",
        "--recompute-granularity",
        "--recompute-method",
        "--recompute-num-layers",
        "--use-distributed-optimizer",
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--tp-comm-overlap",
        "--no-gradient-accumulation-fusion",
        "--use-tp-pp-dp-mapping",
        "--fp16",
        "--bf16",
        "--fp8-format",
        "--fp8-recipe",
        "--attention-backend",
    }
)
TORCHTITAN_KEYS = {
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "enable_async_tensor_parallel",
        "pipeline_parallel_degree",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "context_parallel_degree",
        "expert_parallel_degree",
    },
    "training": {"local_batch_size", "global_batch_size", "seq_len"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}
DEEPSPEED_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "fp16",
    "bf16",
    "tensor_parallel",
}

_LLAMA = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "ffn_hidden_size": 14336,
    "gated_mlp": True,
    "seq_length": 8192,
    "vocab_size": 128256,
}
_MOE = {
    **_LLAMA,
    "num_layers": 8,
    "moe": {"num_experts": 64, "experts_per_token": 8, "expert_ffn_hidden_size": 1536},
}


def _candidates(model: dict, nodes: int, training: dict | None = None):
    plan = plan_parallel_layout(
        model_spec(model),
        cluster_spec({"preset": "dgx-h100", "nodes": nodes}),
        training_spec({"global_batch_sequences": 256, **(training or {})}),
        top_k=10,
        with_rank_map=False,
    )
    assert plan.candidates
    return plan.candidates


def _launch(candidate, framework: str):
    return next(config for config in candidate.launch if config.framework == framework)


@pytest.mark.parametrize(
    ("model", "training"),
    [
        (_LLAMA, {}),
        (_LLAMA, {"precision": "fp8", "overlap_tp_comm": True}),
        (_MOE, {"expert_dispatch": "node-deduplicated"}),
    ],
)
def test_megatron_arguments_are_ones_megatron_declares(model, training):
    for candidate in _candidates(model, 4, training):
        args = _launch(candidate, "megatron").config.split()
        flags = {word for word in args if word.startswith("--")}
        assert flags <= MEGATRON_ARGUMENTS, flags - MEGATRON_ARGUMENTS


def test_megatron_arguments_state_the_layout_that_was_predicted():
    (prediction,) = evaluate_layouts(
        model_spec(_LLAMA),
        cluster_spec({"preset": "dgx-h100", "nodes": 4}),
        training_spec({"global_batch_sequences": 256}),
        layout_specs([{"tp": 4, "pp": 4, "virtual_stages": 2, "micro_batch_size": 1, "zero_stage": 1}]),
    )
    args = _launch(prediction, "megatron").config
    assert "--tensor-model-parallel-size 4" in args and "--pipeline-model-parallel-size 4" in args
    assert "--num-layers-per-virtual-pipeline-stage 4" in args and "--use-distributed-optimizer" in args


@pytest.mark.parametrize(
    ("model", "layout"),
    [
        (_LLAMA, {"tp": 2, "pp": 1, "zero_stage": 3, "recompute": "full"}),
        (_LLAMA, {"tp": 4, "pp": 4, "virtual_stages": 2, "zero_stage": 0, "recompute": "none"}),
        (_LLAMA, {"tp": 8, "pp": 1, "cp": 2, "zero_stage": 2, "recompute": "none"}),
        (_MOE, {"tp": 1, "pp": 1, "ep": 8, "zero_stage": 3, "recompute": "full"}),
    ],
)
def test_torchtitan_configs_are_toml_with_the_keys_torchtitan_declares(model, layout):
    (prediction,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"preset": "dgx-h100", "nodes": 4}),
        training_spec({"global_batch_sequences": 256}),
        layout_specs([{**layout, "rank_order": "tp-cp-ep-dp-pp"}]),
    )
    config = _launch(prediction, "torchtitan")
    assert config.config is not None, config.unavailable
    document = tomllib.loads(config.config)
    for section, keys in document.items():
        assert set(keys) <= TORCHTITAN_KEYS[section], (section, set(keys) - TORCHTITAN_KEYS[section])
    parallelism = document["parallelism"]
    assert (parallelism["tensor_parallel_degree"], parallelism["pipeline_parallel_degree"]) == (
        prediction.tp,
        prediction.pp,
    )
    assert parallelism["data_parallel_replicate_degree"] * parallelism["data_parallel_shard_degree"] == prediction.dp


def test_deepspeed_config_uses_documented_keys_where_deepspeed_can_run_the_layout():
    (prediction,) = evaluate_layouts(
        model_spec(_LLAMA),
        cluster_spec({"preset": "dgx-h100", "nodes": 1}),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{"tp": 2, "pp": 1, "cp": 1, "micro_batch_size": 1, "zero_stage": 2, "recompute": "full"}]),
    )
    config = json.loads(_launch(prediction, "deepspeed").config)
    assert set(config) <= DEEPSPEED_KEYS
    assert config["tensor_parallel"]["autotp_size"] == 2 and config["zero_optimization"]["stage"] == 2
    assert config["train_batch_size"] == 64


def test_a_layout_a_framework_cannot_express_says_why_instead_of_a_config():
    (prediction,) = evaluate_layouts(
        model_spec(_LLAMA),
        cluster_spec({"preset": "dgx-h100", "nodes": 4}),
        training_spec({"global_batch_sequences": 256}),
        layout_specs([{"tp": 4, "pp": 4, "zero_stage": 1, "rank_order": "tp-cp-ep-pp-dp"}]),
    )
    deepspeed, torchtitan = _launch(prediction, "deepspeed"), _launch(prediction, "torchtitan")
    assert deepspeed.config is None and "pipeline" in deepspeed.unavailable
    assert torchtitan.config is None and torchtitan.unavailable
    assert "--use-tp-pp-dp-mapping" in _launch(prediction, "megatron").config


def test_op_level_checkpointing_is_torchtitans_op_option_and_nothing_megatron_can_run():
    (prediction,) = evaluate_layouts(
        model_spec(_LLAMA),
        cluster_spec({"preset": "dgx-h100", "nodes": 1}),
        training_spec({"global_batch_sequences": 64, "software": "torchtitan"}),
        layout_specs([{"tp": 2, "pp": 1, "zero_stage": 3, "recompute": "op-sac"}]),
    )
    checkpoint = tomllib.loads(_launch(prediction, "torchtitan").config)["activation_checkpoint"]
    assert checkpoint == {"mode": "selective", "selective_ac_option": "op"}
    assert _launch(prediction, "megatron").config is None
