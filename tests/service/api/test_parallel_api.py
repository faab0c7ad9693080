"""POST /v1/parallel/plan: ranked layouts, rank map, reasons, and bad input."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from pydantic import TypeAdapter

from partitioners.errors import InputTooLarge
from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.published.runs import DEEPSEEK_V3, specs_of
from partitioners.parallel3d.specs import (
    MAX_EVALUATED_LAYOUTS,
    MAX_EXPERTS,
    MAX_LAYERS,
    Constraints,
    LayoutSpec,
    TrainingSpec,
)
from service.domain.parallel import plan_inputs
from service.schemas.parallel import ParallelPlanAnswer
from tests.service.graphs import LLAMA_70B
from tests.service.graphs import parallel_plan_request as _request


def test_a_70b_model_on_64_h100_gets_ranked_layouts_that_use_every_gpu(client):
    response = client.post("/v1/parallel/plan", json=_request())
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["feasible"] and plan["candidates"]
    times = [c["step_time_s"] for c in plan["candidates"]]
    for candidate in plan["candidates"]:
        assert candidate["dp"] * candidate["tp"] * candidate["pp"] * candidate["cp"] == 64
        assert candidate["memory_per_gpu"]["total_bytes"] <= candidate["memory_per_gpu"]["capacity_bytes"]
        assert 0 < candidate["mfu_causal"] < candidate["mfu"] < 1  # a causal mask needs half the scores
    assert times[0] <= min(times) * (1 + Constraints().tie_tolerance) + 1e-12  # ties may be reordered


def test_the_rank_map_keeps_tensor_parallel_groups_inside_a_node(client):
    plan = client.post("/v1/parallel/plan", json=_request()).json()
    top = plan["candidates"][0]
    ranks = plan["rank_map"]["ranks"]
    assert len(ranks) == 64
    groups: dict[tuple, set] = {}
    for rank in ranks:
        key = (rank["dp"], rank["pp"], rank["cp"], rank["ep"])
        groups.setdefault(key, set()).add(rank["node"])
    assert all(len(nodes) == 1 for nodes in groups.values()) or top["tp"] > 8


def test_an_inventory_preset_gives_the_same_answer_as_the_planner_preset(client):
    by_preset = client.post("/v1/parallel/plan", json=_request()).json()
    by_inventory = client.post(
        "/v1/parallel/plan", json=_request(cluster={"inventory": {"preset": "dgx-h100", "nodes": 8}})
    ).json()
    assert [(c["tp"], c["pp"]) for c in by_inventory["candidates"]] == [
        (c["tp"], c["pp"]) for c in by_preset["candidates"]
    ]


def test_each_candidate_reports_its_energy_per_step_and_tokens_per_joule(client):
    plan = client.post("/v1/parallel/plan", json=_request()).json()
    for candidate in plan["candidates"]:
        tokens = 1024 * LLAMA_70B["seq_length"]
        assert candidate["tokens_per_joule"] == pytest.approx(tokens / candidate["energy_per_step_j"])
        # 64 H100s between 75 W (all idle) and 700 W (all busy) for the whole step
        assert (
            64 * 75.0 * candidate["step_time_s"]
            < candidate["energy_per_step_j"]
            < 64 * 700.0 * candidate["step_time_s"]
        )


def test_power_figures_a_request_gives_without_the_other_are_a_422_naming_it(client):
    response = client.post(
        "/v1/parallel/plan", json=_request(cluster={"preset": "dgx-h100", "nodes": 8, "idle_power_w": 800})
    )
    assert response.status_code == 422
    assert "idle_power_w" in response.text


def test_given_layouts_are_evaluated_instead_of_searched(client):
    response = client.post(
        "/v1/parallel/plan", json=_request(evaluate=[{"tp": 8, "pp": 4, "dp": 2}, {"tp": 16, "pp": 4, "dp": 1}])
    )
    assert response.status_code == 200, response.text
    evaluated = response.json()["predictions"]
    assert evaluated[0]["tp"] == 8 and evaluated[0]["pp"] == 4
    assert evaluated[1]["reasons"]  # tp=16 crosses an 8-GPU node


def test_each_evaluated_layout_comes_with_its_own_rank_map(client):
    response = client.post(
        "/v1/parallel/plan", json=_request(evaluate=[{"tp": 8, "pp": 4}, {"tp": 4, "pp": 2, "cp": 2}])
    )
    assert response.status_code == 200, response.text
    for prediction in response.json()["predictions"]:
        rank_map = prediction["rank_map"]
        assert rank_map["num_ranks"] == 64 and len(rank_map["ranks"]) == 64
        mesh = dict(zip(rank_map["mesh_dim_names"], rank_map["mesh_shape"], strict=True))
        assert mesh == {"dp": prediction["dp"], "pp": prediction["pp"], "cp": prediction["cp"], "tp": prediction["tp"]}
        assert rank_map["order"] == prediction["rank_order"]
        nodes: dict[tuple, set] = {}
        for rank in rank_map["ranks"]:
            nodes.setdefault((rank["dp"], rank["pp"], rank["cp"]), set()).add(rank["node"])
        assert all(len(group) == 1 for group in nodes.values())  # each tensor-parallel group on one node


def test_a_candidate_posted_back_as_a_layout_gets_the_same_prediction(client):
    candidate = client.post("/v1/parallel/plan", json=_request(top_k=1)).json()["candidates"][0]
    layout = {
        name: candidate[name]
        for name in (
            "dp",
            "tp",
            "pp",
            "cp",
            "ep",
            "virtual_stages",
            "micro_batch_size",
            "zero_stage",
            "recompute",
            "recompute_num_layers",
        )
    }
    response = client.post("/v1/parallel/plan", json=_request(evaluate=[layout]))
    assert response.status_code == 200, response.text
    (again,) = response.json()["predictions"]
    assert again["step_time_s"] == candidate["step_time_s"] and again["memory_per_gpu"] == candidate["memory_per_gpu"]


def test_a_layout_size_that_does_not_divide_the_cluster_is_a_422_naming_the_layout(client):
    response = client.post("/v1/parallel/plan", json=_request(evaluate=[{"tp": 8}, {"tp": 3}]))
    assert response.status_code == 422
    assert "evaluate[1].tp" in response.json()["detail"]


def test_a_model_too_large_for_the_cluster_says_why_nothing_fits(client):
    huge = dict(
        LLAMA_70B, num_layers=800, hidden_size=32768, num_attention_heads=256, num_kv_heads=256, ffn_hidden_size=131072
    )
    response = client.post("/v1/parallel/plan", json=_request(model=huge, cluster={"preset": "dgx-h100", "nodes": 1}))
    assert response.status_code in (200, 422)
    body = response.json()
    if response.status_code == 200:
        assert body["feasible"] is False and body["notes"]
    else:
        assert "memory" in body["detail"].lower() or "fit" in body["detail"].lower()


def test_zero_gpus_and_unknown_presets_are_422(client):
    assert (
        client.post("/v1/parallel/plan", json=_request(cluster={"preset": "dgx-h100", "nodes": 0})).status_code == 422
    )
    response = client.post("/v1/parallel/plan", json=_request(cluster={"preset": "dgx-h900", "nodes": 1}))
    assert response.status_code == 422 and "dgx-h100" in response.json()["detail"]


def test_an_interleaved_two_stage_layout_with_batched_pipeline_exchanges_is_422_naming_the_rule(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(
            training={"global_batch_sequences": 1024, "overlap_p2p_comm": False},
            evaluate=[{"tp": 8, "pp": 2, "virtual_stages": 2}],
        ),
    )
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "pp >= 3" in response.json()["detail"]


def _evaluate_one(client, recompute: str, **training) -> dict:
    """The prediction for one fixed (8, 4) layout under the given training settings."""
    layout = [
        {"tp": 8, "pp": 4, "dp": 2, "virtual_stages": 1, "micro_batch_size": 1, "recompute": recompute, "zero_stage": 1}
    ]
    response = client.post(
        "/v1/parallel/plan", json=_request(training={"global_batch_sequences": 1024, **training}, evaluate=layout)
    )
    assert response.status_code == 200, response.text
    return response.json()["predictions"][0]


def test_dropout_in_the_training_settings_keeps_its_masks_in_activation_memory(client):
    activations = {
        dropout: _evaluate_one(client, "none", dropout=dropout)["memory_per_gpu"]["activations_bytes"]
        for dropout in (False, True)
    }
    assert activations[True] > activations[False]


def test_pipeline_sends_without_scatter_gather_take_longer_without_sequence_parallelism(client):
    pipeline_s = {
        flag: _evaluate_one(client, "full", sequence_parallel=False, pipeline_scatter_gather=flag)["time_breakdown_s"][
            "pp_comm_s"
        ]
        for flag in (True, False)
    }
    assert pipeline_s[False] > pipeline_s[True]


def test_a_layout_may_state_how_many_layers_full_recomputation_covers(client):
    layout = [
        {
            "tp": 8,
            "pp": 4,
            "dp": 2,
            "virtual_stages": 1,
            "micro_batch_size": 1,
            "recompute_num_layers": 3,
            "zero_stage": 1,
        }
    ]
    response = client.post(
        "/v1/parallel/plan", json=_request(training={"global_batch_sequences": 1024}, evaluate=layout)
    )
    assert response.status_code == 200, response.text
    prediction = response.json()["predictions"][0]
    assert (prediction["recompute"], prediction["recompute_num_layers"]) == ("full", 3)


def test_a_recompute_layer_count_below_one_is_a_422_naming_it(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(training={"global_batch_sequences": 1024}, constraints={"recompute_num_layers": 0}),
    )
    assert response.status_code == 422
    assert "recompute_num_layers" in response.text


def test_gradients_reduced_in_bf16_halve_the_gradient_buffer(client):
    gradients = {
        width: _evaluate_one(client, "none", grad_bytes_per_param=width)["memory_per_gpu"]["gradients_bytes"]
        for width in (4, 2)
    }
    assert gradients[2] == gradients[4] / 2


def test_a_gradient_width_other_than_two_or_four_bytes_is_a_422(client):
    training = {"global_batch_sequences": 1024, "grad_bytes_per_param": 3}
    response = client.post("/v1/parallel/plan", json=_request(training=training))
    assert response.status_code == 422
    assert "grad_bytes_per_param" in response.text


def test_a_software_preset_changes_the_prediction_and_an_explicit_flag_overrides_it(client):
    layout = [
        {"tp": 8, "pp": 4, "dp": 2, "virtual_stages": 1, "micro_batch_size": 1, "recompute": "none", "zero_stage": 0}
    ]

    def activations(training: dict) -> float:
        response = client.post("/v1/parallel/plan", json=_request(training=training, evaluate=layout))
        assert response.status_code == 200, response.text
        return response.json()["predictions"][0]["memory_per_gpu"]["activations_bytes"]

    today = activations({"global_batch_sequences": 1024})
    old = activations({"global_batch_sequences": 1024, "software": "megatron-lm-2021"})
    old_with_flash = activations(
        {
            "global_batch_sequences": 1024,
            "software": "megatron-lm-2021",
            "flash_attention": True,
            "sequence_parallel": True,
        }
    )
    assert old > old_with_flash > today  # scores and unsharded tensors kept; masks and stage outputs still kept


def test_a_stated_head_dim_counts_qwen3_32b_parameters_as_published(client):
    # Qwen3-32B's model card: 32.8B parameters; its 64 heads are 128 wide, not 5120 / 64
    qwen3 = {
        "num_layers": 64,
        "hidden_size": 5120,
        "num_attention_heads": 64,
        "num_kv_heads": 8,
        "head_dim": 128,
        "ffn_hidden_size": 25600,
        "gated_mlp": True,
        "vocab_size": 151936,
        "seq_length": 4096,
    }
    response = client.post("/v1/parallel/plan", json=_request(model=qwen3))
    assert response.status_code == 200, response.text
    assert response.json()["model_parameters"] == pytest.approx(32.8e9, rel=0.01)


def test_deepseek_v3_with_latent_attention_and_deduplicated_dispatch_is_planned(client):
    training = {
        "global_batch_sequences": 15360,
        "precision": "fp8",
        "expert_dispatch": "node-deduplicated",
        "overlap_ep_comm": True,
    }
    request = _request(model=DEEPSEEK_V3, cluster={"preset": "hgx-h800", "nodes": 256}, training=training)
    searched = client.post("/v1/parallel/plan", json=request)
    assert searched.status_code == 200, searched.text
    assert searched.json()["model_parameters"] == pytest.approx(671e9, rel=0.005)  # DeepSeek-V3: 671B
    published = [{"tp": 1, "pp": 16, "ep": 64, "cp": 1, "recompute": "selective"}]
    evaluated = client.post("/v1/parallel/plan", json={**request, "evaluate": published})
    assert evaluated.status_code == 200, evaluated.text
    (prediction,) = evaluated.json()["predictions"]
    assert prediction["fits"] and prediction["time_breakdown_s"]["ep_comm_s"] > 0


def test_expert_groups_wider_than_dp_are_folded_over_the_tensor_ranks_and_the_answer_says_etp_1(client):
    # Megatron-Bridge's Qwen3-235B-A22B H100 layout in miniature: tp 2, ep 8 on 16 GPUs at pp 2 (dp 4)
    model = {
        "num_layers": 8,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_kv_heads": 4,
        "head_dim": 128,
        "seq_length": 4096,
        "vocab_size": 151936,
        "gated_mlp": True,
        "moe": {"num_experts": 128, "experts_per_token": 8, "expert_ffn_hidden_size": 1536},
    }
    response = client.post(
        "/v1/parallel/plan",
        json=_request(
            model=model,
            cluster={"preset": "dgx-h100", "nodes": 2},
            evaluate=[{"tp": 2, "pp": 2, "cp": 1, "ep": 8, "etp": 1, "rank_order": "tp-cp-ep-pp-dp"}],
        ),
    )
    assert response.status_code == 200, response.text
    (prediction,) = response.json()["predictions"]
    assert (prediction["dp"], prediction["ep"], prediction["etp"]) == (4, 8, 1)
    assert prediction["rank_map"]["order"] == "tp-cp-dp_inner-pp-dp_outer"


def test_deepseek_v3_with_its_multi_token_prediction_module_counts_the_published_14b_less_shared_copies(client):
    # DeepSeek-V3's Hugging Face weights: 671B main model + 14B MTP module, whose files
    # repeat the embedding and output head (129,280 x 7,168 each) that the module shares
    request = _request(
        model={**DEEPSEEK_V3, "mtp_layers": 1},
        cluster={"preset": "hgx-h800", "nodes": 256},
        training={"global_batch_sequences": 15360, "precision": "fp8"},
        top_k=1,
    )
    response = client.post("/v1/parallel/plan", json=request)
    assert response.status_code == 200, response.text
    assert response.json()["model_parameters"] == pytest.approx(671e9 + 14e9 - 2 * 129280 * 7168, rel=0.005)


def test_fp8_weights_kept_beside_their_16_bit_copies_take_more_parameter_memory(client):
    layout = [{"tp": 8, "pp": 4, "dp": 2, "recompute": "full"}]
    memory = {}
    for fp8_params in (True, False):
        training = {"global_batch_sequences": 1024, "precision": "fp8", "fp8_params": fp8_params}
        response = client.post("/v1/parallel/plan", json=_request(training=training, evaluate=layout))
        assert response.status_code == 200, response.text
        memory[fp8_params] = response.json()["predictions"][0]["memory_per_gpu"]["parameters_bytes"]
    assert memory[False] > memory[True]


def test_interleaved_pipeline_exchanges_overlap_unless_the_request_turns_it_off(client):
    layout = [{"tp": 8, "pp": 4, "dp": 2, "virtual_stages": 2}]
    pp_comm = {}
    for overlap in (True, False):
        training = {"global_batch_sequences": 1024, "overlap_p2p_comm": overlap}
        response = client.post("/v1/parallel/plan", json=_request(training=training, evaluate=layout))
        assert response.status_code == 200, response.text
        pp_comm[overlap] = response.json()["predictions"][0]["time_breakdown_s"]["pp_comm_s"]
    assert pp_comm[True] < pp_comm[False]


def test_an_unknown_expert_dispatch_is_a_422_naming_the_field(client):
    training = {"global_batch_sequences": 1024, "expert_dispatch": "broadcast"}
    response = client.post("/v1/parallel/plan", json=_request(training=training))
    assert response.status_code == 422
    assert "expert_dispatch" in response.text


def test_latent_attention_beside_a_head_dim_is_a_422_naming_mla(client):
    model = {**DEEPSEEK_V3, "head_dim": 128}
    response = client.post(
        "/v1/parallel/plan", json=_request(model=model, cluster={"preset": "hgx-h800", "nodes": 256})
    )
    assert response.status_code == 422
    assert "model.mla" in response.text


def test_an_older_flash_attention_generation_predicts_a_slower_step(client):
    step_s = {
        version: _evaluate_one(client, "none", flash_attention_version=version)["step_time_s"] for version in (3, 2)
    }
    assert step_s[2] > step_s[3]


def test_flash_attention_3_on_a100s_is_a_422_naming_the_field(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(
            cluster={"preset": "dgx-a100", "nodes": 8},
            training={"global_batch_sequences": 1024, "flash_attention_version": 3},
        ),
    )
    assert response.status_code == 422
    assert "flash_attention_version" in response.text


def test_fp8_on_a100s_is_a_422_naming_the_precision(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(
            cluster={"preset": "dgx-a100", "nodes": 8}, training={"global_batch_sequences": 1024, "precision": "fp8"}
        ),
    )
    assert response.status_code == 422
    assert "training.precision" in response.text


def test_a_parallel_attention_and_mlp_block_spends_less_on_tensor_parallel_communication(client):
    layout = {"tp": 8, "pp": 4, "virtual_stages": 1, "micro_batch_size": 1, "recompute": "selective"}

    def tp_comm_s(parallel):
        response = client.post(
            "/v1/parallel/plan",
            json=_request(model={**LLAMA_70B, "parallel_attention_mlp": parallel}, evaluate=[layout]),
        )
        assert response.status_code == 200, response.text
        return response.json()["predictions"][0]["time_breakdown_s"]["tp_comm_s"]

    assert tp_comm_s(True) < tp_comm_s(False)


LLAMA_3_70B_CONFIG = json.loads(
    (
        pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "huggingface" / "meta-llama_Meta-Llama-3-70B.json"
    ).read_text()
)


def test_a_hugging_face_config_plans_as_the_shape_it_reads_as_and_the_answer_says_which(client):
    by_config = client.post(
        "/v1/parallel/plan", json=_request(model={"huggingface_config": LLAMA_3_70B_CONFIG, "seq_length": 4096})
    )
    assert by_config.status_code == 200, by_config.text
    by_shape = client.post("/v1/parallel/plan", json=_request()).json()
    assert (
        by_config.json()["model"]
        == by_shape["model"]
        == {
            **LLAMA_70B,
            "parallel_attention_mlp": False,
            "tie_embeddings": False,
            "mtp_layers": 0,
            "learned_position_embeddings": False,
        }
    )
    assert by_config.json()["candidates"] == by_shape["candidates"]


def test_an_unknown_hugging_face_model_type_is_a_422_naming_the_field(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(model={"huggingface_config": {**LLAMA_3_70B_CONFIG, "model_type": "rwkv"}, "seq_length": 4096}),
    )
    assert response.status_code == 422
    assert "model.huggingface_config.model_type" in response.json()["detail"]


def test_a_hugging_face_config_without_the_training_sequence_length_is_a_422(client):
    response = client.post("/v1/parallel/plan", json=_request(model={"huggingface_config": LLAMA_3_70B_CONFIG}))
    assert response.status_code == 422
    assert response.json()["detail"].startswith("body.model.seq_length:")


def test_a_missing_shape_field_is_named_by_its_path_in_the_model(client):
    shape = {k: v for k, v in LLAMA_70B.items() if k != "hidden_size"}
    response = client.post("/v1/parallel/plan", json=_request(model=shape))
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body.model.hidden_size"]


def test_a_sliding_window_shortens_the_predicted_step_of_a_long_sequence_model(client):
    layout = {"tp": 8, "pp": 4, "micro_batch_size": 1, "recompute": "selective"}

    def step_s(model):
        response = client.post(
            "/v1/parallel/plan", json=_request(model=model, training={"global_batch_sequences": 64}, evaluate=[layout])
        )
        assert response.status_code == 200, response.text
        return response.json()["predictions"][0]["step_time_s"]

    long_context = {**LLAMA_70B, "seq_length": 32768}
    assert step_s({**long_context, "sliding_window": 4096}) < step_s(long_context)


def test_sliding_window_layers_without_a_window_are_a_422_naming_the_missing_field(client):
    response = client.post("/v1/parallel/plan", json=_request(model={**LLAMA_70B, "sliding_window_layers": [0, 2]}))
    assert response.status_code == 422
    assert "model.sliding_window" in response.json()["detail"]


def test_adamw_is_planned_as_adam_whose_state_it_shares(client):
    layout = {"tp": 8, "pp": 4, "micro_batch_size": 1, "recompute": "selective"}
    answers = [
        client.post(
            "/v1/parallel/plan",
            json=_request(training={"global_batch_sequences": 1024, "optimizer": optimizer}, evaluate=[layout]),
        )
        for optimizer in ("adam", "adamw")
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["predictions"] == answers[1].json()["predictions"]


def test_an_optimizer_other_than_adam_is_a_422_naming_the_field(client):
    response = client.post(
        "/v1/parallel/plan", json=_request(training={"global_batch_sequences": 1024, "optimizer": "sgd"})
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body.training.optimizer"]


def test_a_measured_allocator_fragmentation_is_counted_and_echoed_with_each_layouts_memory(client):
    default = client.post("/v1/parallel/plan", json=_request()).json()["candidates"][0]
    layout = {
        key: default[key]
        for key in ("dp", "tp", "pp", "cp", "virtual_stages", "micro_batch_size", "zero_stage", "recompute")
    }
    training = {"global_batch_sequences": 1024, "activation_fragmentation": 0.3}
    response = client.post("/v1/parallel/plan", json=_request(training=training, evaluate=[layout]))
    assert response.status_code == 200, response.text
    (measured,) = response.json()["predictions"]
    assert measured["memory_per_gpu"]["activation_fragmentation"] == 0.3
    assert default["memory_per_gpu"]["activation_fragmentation"] == 0.1
    if default["memory_per_gpu"]["activations_bytes"] > 0:
        assert measured["memory_per_gpu"]["activations_bytes"] > default["memory_per_gpu"]["activations_bytes"]


def test_an_allocator_fragmentation_above_one_is_a_422_naming_the_field(client):
    training = {"global_batch_sequences": 1024, "activation_fragmentation": 1.5}
    response = client.post("/v1/parallel/plan", json=_request(training=training))
    assert response.status_code == 422
    assert "activation_fragmentation" in response.text


# ----------------------------------------------------------------------------- one definition, one answer schema

_ANSWER = TypeAdapter(ParallelPlanAnswer)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # a search
        {"evaluate": [{"tp": 8, "pp": 4}, {"tp": 4, "pp": 2, "cp": 2, "recompute": "full"}]},
        {"model": {**LLAMA_70B, "num_layers": 800}, "cluster": {"preset": "dgx-h100", "nodes": 1}},  # nothing fits
        {"model": {"huggingface_config": LLAMA_3_70B_CONFIG, "seq_length": 4096}},
    ],
)
def test_a_real_answer_validates_against_the_declared_response_model(client, overrides):
    response = client.post("/v1/parallel/plan", json=_request(**overrides))
    assert response.status_code == 200, response.text
    answer = _ANSWER.validate_python(response.json())
    assert answer.mode == ("evaluate" if "evaluate" in overrides else "search")


def test_the_route_declares_its_answer_in_openapi(client):
    document = client.get("/openapi.json").json()
    answer = document["paths"]["/v1/parallel/plan"]["post"]["responses"]["200"]["content"]["application/json"]
    assert {option["$ref"].rsplit("/", 1)[-1] for option in answer["schema"]["oneOf"]} == {
        "SearchAnswer",
        "EvaluateAnswer",
    }


def test_the_request_schema_states_the_planner_s_limits(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["TransformerShape"]["properties"]["num_layers"]["maximum"] == MAX_LAYERS
    assert schemas["MoeBlock"]["properties"]["num_experts"]["maximum"] == MAX_EXPERTS
    assert schemas["ParallelPlanRequest"]["properties"]["evaluate"]["anyOf"][0]["maxItems"] == MAX_EVALUATED_LAYOUTS


def test_more_layouts_to_evaluate_than_the_one_limit_are_refused_naming_evaluate(client):
    response = client.post("/v1/parallel/plan", json=_request(evaluate=[{"tp": 8}] * (MAX_EVALUATED_LAYOUTS + 1)))
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body.evaluate"]
    with pytest.raises(InputTooLarge):
        body = _request(evaluate=[{"tp": 8}] * (MAX_EVALUATED_LAYOUTS + 1))
        del body["rank_map_limit"]
        plan_inputs(body)


@pytest.mark.parametrize(
    "flag", ["gradient_accumulation_fusion", "fp32_grad_copy_kept", "stage_outputs_kept", "ddp_bucket_copy"]
)
def test_every_training_flag_of_the_planner_is_accepted_over_http_and_predicted_as_in_process(client, flag):
    default = {f.name: f.default for f in dataclasses.fields(TrainingSpec)}[flag]
    training = {"global_batch_sequences": 1024, "grad_bytes_per_param": 2, flag: not default}
    layout = {"tp": 8, "pp": 4, "dp": 2, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"}
    response = client.post("/v1/parallel/plan", json=_request(training=training, evaluate=[layout]))
    assert response.status_code == 200, response.text
    (over_http,) = response.json()["predictions"]
    (in_process,) = evaluate_layouts(
        *specs_of(LLAMA_70B, {"preset": "dgx-h100", "nodes": 8}, training), [LayoutSpec(**layout)]
    )
    assert over_http["step_time_s"] == in_process.step_time_s
    assert over_http["memory_per_gpu"]["total_bytes"] == in_process.memory.total_bytes
    (as_default,) = client.post(
        "/v1/parallel/plan", json=_request(training={**training, flag: default}, evaluate=[layout])
    ).json()["predictions"]
    assert (as_default["step_time_s"], as_default["memory_per_gpu"]["total_bytes"]) != (
        over_http["step_time_s"],
        over_http["memory_per_gpu"]["total_bytes"],
    )


def test_the_batch_no_software_generation_supplies_stays_required_by_the_schema(client):
    response = client.post("/v1/parallel/plan", json=_request(training={"software": "megatron-core"}))
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body.training.global_batch_sequences"]


def test_an_answer_lists_what_it_assumed_about_the_stack_with_sources(client):
    response = client.post(
        "/v1/parallel/plan", json=_request(training={"global_batch_sequences": 1024, "software": "megatron-lm-2021"})
    )
    assert response.status_code == 200, response.text
    assumptions = {a["name"]: a for a in response.json()["assumptions"]}
    assert assumptions["tensor-parallel collectives"]["value"] == "in-line"
    assert all(a["source"] for a in assumptions.values())


def test_mla_widths_may_be_sent_under_their_hugging_face_names(client):
    model = {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "seq_length": 2048,
        "vocab_size": 32000,
        "kv_lora_rank": 256,
        "q_lora_rank": 384,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
    }
    response = client.post("/v1/parallel/plan", json=_request(model=model, top_k=1))
    assert response.status_code == 200, response.text
    assert response.json()["model"]["mla"]["kv_lora_rank"] == 256


def test_a_pipeline_schedule_the_software_cannot_run_is_a_422_naming_the_field(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(training={"global_batch_sequences": 1024, "pipeline_schedule": "dualpipe"}),
    )
    assert response.status_code == 422
    assert "training.pipeline_schedule" in response.json()["detail"]


def test_the_deepseek_software_preset_answers_with_its_dualpipe_schedule_among_the_assumptions(client):
    response = client.post(
        "/v1/parallel/plan",
        json=_request(training={"global_batch_sequences": 1024, "software": "hai-llm"}, top_k=1),
    )
    assert response.status_code == 200, response.text
    assumed = {term["name"]: term["value"] for term in response.json()["assumptions"]}
    assert assumed["pipeline schedule"] == "dualpipe"
