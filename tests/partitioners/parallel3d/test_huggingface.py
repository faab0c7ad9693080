"""Model shapes read from published Hugging Face config.json files (tests/fixtures/huggingface)."""

from __future__ import annotations

import json
import pathlib

import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.flops import parameter_counts
from partitioners.parallel3d.planner import plan_parallel_layout
from partitioners.parallel3d.published.runs import DEEPSEEK_V3
from tests.partitioners.parallel3d.shapes import cluster_spec, model_spec, training_spec

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "huggingface"


def _config(repo_id: str) -> dict:
    return json.loads((CONFIGS / f"{repo_id.replace('/', '_')}.json").read_text())


def _read(repo_id: str, seq_length: int = 4096):
    return model_spec({"huggingface_config": _config(repo_id), "seq_length": seq_length})


def test_llama_3_70b_reads_as_the_shape_written_out_by_hand():
    by_hand = model_spec(
        {
            "num_layers": 80,
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "num_kv_heads": 8,
            "ffn_hidden_size": 28672,
            "vocab_size": 128256,
            "seq_length": 8192,
            "gated_mlp": True,
        }
    )
    assert _read("meta-llama/Meta-Llama-3-70B", 8192) == by_hand


def test_deepseek_v3_reads_as_its_published_run_with_latent_attention_dense_first_layers_and_mtp():
    model = _read("deepseek-ai/DeepSeek-V3")
    assert model == model_spec({**DEEPSEEK_V3, "mtp_layers": 1})
    assert model.moe.moe_layers == tuple(range(3, 61))  # first_k_dense_replace = 3
    assert (model.moe.num_groups, model.moe.group_topk) == (8, 4)


def test_mixtral_routes_every_layer_over_experts_as_wide_as_its_intermediate_size():
    model = _read("mistralai/Mixtral-8x7B-v0.1")
    assert (model.moe.num_experts, model.moe.experts_per_token, model.moe.expert_ffn_hidden_size) == (8, 2, 14336)
    assert model.moe.moe_layers is None and model.gated_mlp and model.kv_heads == 8


def test_qwen3_moe_keeps_a_head_width_apart_from_the_hidden_size():
    model = _read("Qwen/Qwen3-30B-A3B")
    assert model.head_dim == 128 and model.query_width == 32 * 128 != model.hidden_size
    assert (model.moe.num_experts, model.moe.experts_per_token, model.moe.shared_experts) == (128, 8, 0)


def test_a_qwen2_moe_shared_expert_counts_as_that_many_routed_expert_widths():
    model = _read("Qwen/Qwen1.5-MoE-A2.7B")
    assert (model.moe.expert_ffn_hidden_size, model.moe.shared_experts) == (1408, 5632 // 1408)


def test_qwen_moe_layers_follow_the_sparse_step_and_skip_mlp_only_layers():
    config = {**_config("Qwen/Qwen1.5-MoE-A2.7B"), "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    model = model_spec({"huggingface_config": config, "seq_length": 4096})
    assert model.moe.moe_layers == tuple(range(3, 24, 2))  # (i + 1) % 2 == 0, without layer 1


def test_gpt_neox_20b_is_a_parallel_block_with_a_plain_mlp_and_multi_head_attention():
    model = _read("EleutherAI/gpt-neox-20b", 2048)
    assert model.parallel_attention_mlp and not model.gated_mlp and not model.tie_embeddings
    assert model.kv_heads == 64 and model.ffn == 24576


def test_falcon_40b_takes_its_kv_heads_from_the_new_decoder_architecture_and_a_4h_mlp():
    model = _read("tiiuae/falcon-40b", 2048)
    assert model.kv_heads == 8 and model.ffn == 4 * 8192
    assert model.parallel_attention_mlp and model.tie_embeddings and not model.gated_mlp


def test_gpt2_learns_its_positions_and_ties_its_output_layer_by_its_class_defaults():
    model = _read("openai-community/gpt2", 1024)
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.ffn) == (12, 768, 12, 3072)
    assert model.learned_position_embeddings and model.tie_embeddings


def test_starcoder_multi_query_attention_is_one_kv_head():
    model = _read("bigcode/starcoder", 8192)
    assert model.kv_heads == 1 and model.ffn == 24576 and model.num_layers == 40


def test_bloom_reads_its_n_layer_and_n_head_aliases():
    model = _read("bigscience/bloom", 2048)
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.vocab_size) == (
        70,
        14336,
        112,
        250880,
    )
    assert model.tie_embeddings and model.ffn == 4 * 14336


def test_a_vision_language_config_plans_its_text_model_with_the_class_defaults_it_leaves_out():
    model = _read("llava-hf/llava-1.5-7b-hf")  # text_config names only what differs from LlamaConfig
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.ffn, model.vocab_size) == (
        32,
        4096,
        32,
        11008,
        32064,
    )


def test_a_model_read_from_its_config_is_planned_exactly_as_the_shape_it_reads_as():
    cluster, training = {"preset": "dgx-h100", "nodes": 2}, {"global_batch_sequences": 256}
    config = {"huggingface_config": _config("mistralai/Mixtral-8x7B-v0.1"), "seq_length": 4096}
    by_config = plan_parallel_layout(
        model_spec(config), cluster_spec(cluster), training_spec(training), top_k=3, with_rank_map=False
    )
    by_shape = plan_parallel_layout(
        model_spec(model_spec(config).to_dict()),
        cluster_spec(cluster),
        training_spec(training),
        top_k=3,
        with_rank_map=False,
    )
    assert by_config.candidates == by_shape.candidates


def test_an_unknown_model_type_is_refused_rather_than_guessed():
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": {"model_type": "mamba", "hidden_size": 768}, "seq_length": 2048})
    assert info.value.field == "model.huggingface_config.model_type" and info.value.code == "unknown-model-type"


def test_a_missing_config_key_is_named_by_its_path_in_the_config():
    config = _config("meta-llama/Meta-Llama-3-70B")
    del config["num_attention_heads"]
    config["model_type"] = "mistral"  # no class defaults are assumed for Mistral
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": config, "seq_length": 2048})
    assert info.value.field == "model.huggingface_config.num_attention_heads"


def test_a_config_value_that_is_not_a_positive_integer_is_named():
    config = {**_config("EleutherAI/gpt-neox-20b"), "num_hidden_layers": "44"}
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": config, "seq_length": 2048})
    assert info.value.field == "model.huggingface_config.num_hidden_layers"


def test_the_training_sequence_length_must_be_given_beside_a_config():
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": _config("openai-community/gpt2")})
    assert info.value.field == "model.seq_length"


def test_shape_fields_beside_a_config_are_refused_rather_than_silently_mixed():
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": _config("openai-community/gpt2"), "seq_length": 1024, "num_layers": 24})
    assert info.value.field == "model.num_layers" and info.value.code == "unknown-field"


def test_a_shape_written_back_out_reads_as_the_same_shape():
    model = _read("deepseek-ai/DeepSeek-V3")
    assert model_spec(model.to_dict()) == model


def test_gemma_3_reads_its_sparse_text_config_with_five_local_layers_to_each_global_one():
    model = _read("google/gemma-3-12b-it")  # text_config leaves head_dim, vocab and pattern to Gemma3TextConfig
    assert (model.num_layers, model.hidden_size, model.head_dim, model.kv_heads, model.vocab_size) == (
        48,
        3840,
        256,
        8,
        262_208,
    )
    assert model.sliding_window == 1024
    assert model.sliding_window_layers == tuple(i for i in range(48) if (i + 1) % 6)  # layers 5, 11, ... global
    assert parameter_counts(model).total == pytest.approx(11.77e9, rel=0.01)  # "Gemma 3 12B": the text model


def test_mistral_7b_v0_1_windows_every_layer_and_later_versions_none():
    assert _read("mistralai/Mistral-7B-v0.1").sliding_window == 4096
    assert _read("mistralai/Mistral-7B-v0.1").sliding_window_layers is None  # every layer
    later = {**_config("mistralai/Mistral-7B-v0.1"), "sliding_window": None}  # v0.2 on
    assert model_spec({"huggingface_config": later, "seq_length": 4096}).sliding_window is None
    unwindowed_gemma = {"model_type": "gemma3_text", "sliding_window": None}  # null beats the class's 4096
    assert model_spec({"huggingface_config": unwindowed_gemma, "seq_length": 4096}).sliding_window is None


def test_a_layer_types_list_names_the_windowed_layers():
    config = {
        **_config("mistralai/Mistral-7B-v0.1"),
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    }
    assert model_spec({"huggingface_config": config, "seq_length": 8192}).sliding_window_layers == (0, 2)


def test_an_attention_kind_hyperplace_does_not_model_is_refused_rather_than_counted_as_full():
    config = {
        **_config("mistralai/Mistral-7B-v0.1"),
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
    }  # Qwen3-Next's gated DeltaNet layers
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": config, "seq_length": 8192})
    assert info.value.field == "model.huggingface_config.layer_types"
    assert info.value.code == "unknown-attention-kind" and "linear_attention" in str(info.value)


def test_a_layer_types_list_in_a_family_without_local_attention_may_only_say_full_attention():
    config = {**_config("meta-llama/Meta-Llama-3-70B"), "num_hidden_layers": 2}
    assert (
        model_spec(
            {"huggingface_config": {**config, "layer_types": ["full_attention"] * 2}, "seq_length": 8192}
        ).num_layers
        == 2
    )
    for kinds in (["linear_attention", "full_attention"], ["full_attention", "sliding_attention"]):
        with pytest.raises(InvalidInput) as info:
            model_spec({"huggingface_config": {**config, "layer_types": kinds}, "seq_length": 8192})
        assert info.value.field == "model.huggingface_config.layer_types"
        assert info.value.code == "unknown-attention-kind"


def test_mlp_only_layers_beyond_the_model_are_invalid_input_naming_the_key():
    config = {**_config("Qwen/Qwen3-30B-A3B"), "num_hidden_layers": 4, "mlp_only_layers": [99]}
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": config, "seq_length": 4096})
    assert info.value.field == "model.huggingface_config.mlp_only_layers"


def test_qwen_windows_only_with_use_sliding_window_and_from_max_window_layers_on():
    config = _config("Qwen/Qwen3-30B-A3B")  # sliding_window set, use_sliding_window false
    assert model_spec({"huggingface_config": config, "seq_length": 4096}).sliding_window is None
    windowed = {**config, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 40}
    model = model_spec({"huggingface_config": windowed, "seq_length": 4096})
    assert model.sliding_window_layers == tuple(range(40, 48))


@pytest.mark.parametrize(
    ("overrides", "total", "active"),
    [
        ({}, 117e9, 5.1e9),  # GptOssConfig's defaults: gpt-oss-120b, "117B parameters with 5.1B active"
        ({"num_hidden_layers": 24, "num_local_experts": 32}, 21e9, 3.6e9),  # gpt-oss-20b: "21B ... 3.6B active"
    ],
)
def test_gpt_oss_counts_its_published_parameters_with_windows_on_every_other_layer(overrides, total, active):
    model = model_spec({"huggingface_config": {"model_type": "gpt_oss", **overrides}, "seq_length": 4096})
    counts = parameter_counts(model)
    assert counts.total == pytest.approx(total, rel=0.01)
    assert counts.active_per_token - counts.embedding == pytest.approx(active, rel=0.01)  # the output head counts
    assert model.sliding_window == 128 and model.sliding_window_layers == tuple(range(0, model.num_layers, 2))


@pytest.mark.parametrize(
    ("overrides", "total"),
    [
        ({}, 109e9),  # Llama4TextConfig's defaults: Scout, "109B total" (with its vision encoder)
        ({"num_local_experts": 128, "interleave_moe_layer_step": 2}, 400e9),  # Maverick, "400B total"
    ],
)
def test_llama_4_routes_its_moe_layers_beside_a_shared_expert_and_chunks_three_layers_in_four(overrides, total):
    config = {"model_type": "llama4", "text_config": {"model_type": "llama4_text", **overrides}}
    model = model_spec({"huggingface_config": config, "seq_length": 8192})
    counts = parameter_counts(model)
    assert counts.total == pytest.approx(total, rel=0.015)
    assert counts.active_per_token == pytest.approx(17e9, rel=0.015)  # "17B active parameters"
    assert model.moe.shared_experts == 1 and model.ffn == 16384  # dense layers: intermediate_size_mlp
    assert model.attention_chunk_size == 8192
    assert model.chunked_attention_layers == tuple(i for i in range(48) if (i + 1) % 4)  # every 4th is global


def test_chunked_attention_layers_without_a_chunk_size_are_refused():
    config = {
        **_config("mistralai/Mistral-7B-v0.1"),
        "num_hidden_layers": 2,
        "layer_types": ["chunked_attention", "full_attention"],
    }
    with pytest.raises(InvalidInput) as info:
        model_spec({"huggingface_config": config, "seq_length": 8192})
    assert info.value.field == "model.huggingface_config.attention_chunk_size"


# GLM-4.5's config.json keys (zai-org/GLM-4.5); the Air model changes the sizes below
GLM_4_5 = {
    "model_type": "glm4_moe",
    "num_hidden_layers": 92,
    "hidden_size": 5120,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "n_group": 1,
    "topk_group": 1,
    "vocab_size": 151552,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
}
GLM_4_5_AIR = {
    **GLM_4_5,
    "num_hidden_layers": 46,
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 128,
    "first_k_dense_replace": 1,
}


@pytest.mark.parametrize(
    ("config", "total", "active"),
    [
        (GLM_4_5, 355e9, 32e9),  # "355 billion total parameters and 32 billion active parameters"
        (GLM_4_5_AIR, 106e9, 12e9),  # "106 billion total parameters and 12 billion active parameters"
    ],
)
def test_glm_4_5_reads_deepseek_style_experts_with_grouped_query_attention(config, total, active):
    model = model_spec({"huggingface_config": config, "seq_length": 4096})
    assert model.mla is None and model.kv_heads == 8 and model.query_width == 96 * 128 != model.hidden_size
    assert model.mtp_layers == 1 and model.moe.moe_layers[0] == config["first_k_dense_replace"]
    counts = parameter_counts(model_spec({**model.to_dict(), "mtp_layers": 0}))  # the published counts
    assert counts.total == pytest.approx(total, rel=0.01)
    assert counts.active_per_token - counts.embedding - counts.output == pytest.approx(active, rel=0.02)


def test_command_a_is_a_parallel_block_with_windows_on_three_layers_in_four():
    # Command A's config.json sizes (CohereLabs/c4ai-command-a-03-2025), "111B parameters"
    config = {
        "model_type": "cohere2",
        "num_hidden_layers": 64,
        "hidden_size": 12288,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "intermediate_size": 36864,
        "vocab_size": 256000,
        "sliding_window": 4096,
    }
    model = model_spec({"huggingface_config": config, "seq_length": 8192})
    assert model.parallel_attention_mlp and model.tie_embeddings
    assert model.sliding_window_layers == tuple(i for i in range(64) if (i + 1) % 4)
    assert parameter_counts(model).total == pytest.approx(111e9, rel=0.01)
