"""The planner's inputs: what is accepted and what is refused, naming the field.

partitioners.parallel3d.specs (the dataclasses and their checks) and
partitioners.parallel3d.spec_fields (the declared fields and the one mapping reader).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.planner import plan_parallel_layout
from partitioners.parallel3d.spec_fields import field_rule, spec_from_mapping
from partitioners.parallel3d.specs import (
    ClusterSpec,
    Constraints,
    LayoutSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    TrainingSpec,
)
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    constraints_spec,
    model_spec,
    training_spec,
)


def test_a_gpu_name_that_begins_exactly_one_known_gpu_means_that_gpu():
    assert cluster_spec({"gpu": "H100", "num_nodes": 2}) == cluster_spec({"gpu": "h100-sxm", "num_nodes": 2})


def test_a_gpu_name_that_begins_several_known_gpus_is_refused_with_the_candidates():
    with pytest.raises(InvalidInput, match=r"ambiguous: one of \['a100-40gb', 'a100-80gb'\]"):
        cluster_spec({"gpu": "a100", "num_nodes": 2})


def test_shared_inventory_json_and_its_presets_are_accepted_as_clusters():
    from partitioners.hardware.inventory import inventory_to_json, preset_inventory

    spec = cluster_spec(inventory_to_json(preset_inventory("dgx-h100", 2)))
    assert (spec.gpus_per_node, spec.num_nodes, spec.peak_flops_per_s["bf16"]) == (8, 2, 989.4e12)
    nvl72 = cluster_spec({"preset": "gb200-nvl72", "nodes": 3})
    assert (nvl72.gpus_per_node, nvl72.num_nodes) == (72, 3)


def test_a_one_node_inventory_without_an_inter_node_link_is_a_cluster():
    device = {
        "name": "d",
        "type": "H100",
        "peak_flops": 989e12,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 80e9, "bandwidth_bytes_per_s": 3.35e12}],
    }
    node = {
        "name": "n0",
        "devices": [dict(device, name=f"d{i}") for i in range(8)],
        "link": {"bandwidth_bytes_per_s": 4.5e11},
    }
    spec = cluster_spec({"name": "one-node", "groups": [node]})
    assert (spec.num_nodes, spec.gpus_per_node) == (1, 8) and math.isinf(spec.inter_node_bandwidth_bytes_per_s)


def test_an_inventory_stating_datasheet_memory_plans_with_what_the_driver_exposes():
    from partitioners.hardware.inventory import inventory_to_json, preset_inventory

    from_inventory = cluster_spec(inventory_to_json(preset_inventory("dgx-h100", 1)))
    from_preset = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    assert from_inventory.memory_bytes == from_preset.memory_bytes < 80 * 2**30


def test_mixed_gpu_inventory_is_invalid_input_for_the_planner():
    from partitioners.hardware.inventory import inventory_to_json, preset_inventory

    doc = inventory_to_json(preset_inventory("dgx-h100", 1))
    other = inventory_to_json(preset_inventory("dgx-a100", 1))["groups"][0]
    other = {
        **other,
        "name": "a100-node",
        "devices": [{**dev, "name": "a100-" + dev["name"]} for dev in other["devices"]],
    }
    doc["groups"] = doc["groups"] + [other]
    with pytest.raises(InvalidInput) as err:
        cluster_spec(doc)
    assert err.value.code == "heterogeneous-cluster"


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), True, "0.2"])
def test_an_allocator_fragmentation_outside_zero_to_one_is_refused(value):
    with pytest.raises(InvalidInput, match=r"training\.activation_fragmentation"):
        training_spec({"global_batch_sequences": 8, "activation_fragmentation": value})


@pytest.mark.parametrize(
    ("cluster", "field"),
    [
        ({"preset": "dgx-a100", "nodes": 0}, "cluster.num_nodes"),
        ({"gpus_per_node": 8}, "cluster.num_nodes"),
        ({"preset": "no-such-box", "nodes": 1}, "cluster.preset"),
        # rates no hardware has would make every predicted time infinite (see inventory.within)
        (
            {"gpu": "a100-80gb", "num_nodes": 2, "inter_node_bandwidth_bytes_per_s": 5e-324},
            "cluster.inter_node_bandwidth_bytes_per_s",
        ),
        (
            {"gpu": "a100-80gb", "num_nodes": 2, "hbm_bandwidth_bytes_per_s": 1e-300},
            "cluster.hbm_bandwidth_bytes_per_s",
        ),
        ({"gpu": "a100-80gb", "num_nodes": 2, "peak_flops_per_s": {"bf16": 1e-300}}, "cluster.peak_flops_per_s.bf16"),
        ({"gpu": "a100-80gb", "num_nodes": 2, "inter_node_latency_s": 1.7e308}, "cluster.inter_node_latency_s"),
        ({"gpu": "a100-80gb", "num_nodes": 2, "memory_bytes": 1.7e308}, "cluster.memory_bytes"),
    ],
)
def test_bad_cluster_is_invalid_input_naming_the_field(cluster, field):
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(model_spec(GPT_SMALL), cluster_spec(cluster), training_spec({"global_batch_sequences": 8}))
    assert err.value.field == field


def test_hidden_size_not_multiple_of_heads_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec({**GPT_SMALL, "num_attention_heads": 5}),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8}),
        )
    assert err.value.code == "heads-do-not-divide-hidden"


def test_fixed_tp_that_does_not_divide_the_gpus_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec(GPT_SMALL),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8}),
            constraints_spec({"tp": 3}),
        )
    assert err.value.field == "constraints.tp"


@pytest.mark.parametrize("imbalance", [0.5, 65, "high", True, float("nan")])
def test_an_expert_load_imbalance_below_one_or_absurd_is_invalid_input(imbalance):
    with pytest.raises(InvalidInput) as err:
        training_spec({"global_batch_sequences": 8, "expert_load_imbalance": imbalance})
    assert err.value.field == "training.expert_load_imbalance"


def test_flash_attention_3_before_hopper_is_invalid_input_naming_the_field():
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec(GPT_SMALL),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8, "flash_attention_version": 3}),
        )
    assert err.value.field == "training.flash_attention_version" and err.value.code == "not-on-this-gpu"


@pytest.mark.parametrize(
    ("parse", "field"),
    [
        (lambda: training_spec({"global_batch_sequences": 8, "overlap_tp_comm": "no"}), "training.overlap_tp_comm"),
        (lambda: model_spec({**GPT_SMALL, "gated_mlp": 1}), "model.gated_mlp"),
    ],
)
def test_a_flag_that_is_not_a_json_boolean_is_invalid_input_rather_than_truthy(parse, field):
    # bool("no") is True: a string from a command line (-t overlap_tp_comm=no) must not turn a flag on
    with pytest.raises(InvalidInput) as err:
        parse()
    assert err.value.field == field and err.value.code == "not-a-boolean"


def test_a_layer_listed_twice_is_invalid_input_naming_the_list():
    with pytest.raises(InvalidInput) as err:
        model_spec(
            {
                **GPT_SMALL,
                "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 64, "moe_layers": [1, 1]},
            }
        )
    assert err.value.field == "model.moe.moe_layers" and err.value.code == "duplicate-layer"


def test_a_cluster_given_by_figures_and_an_architecture_gets_that_generations_kernel_ceilings():
    figures = {
        "num_nodes": 1,
        "gpus_per_node": 8,
        "peak_flops_per_s": {"bf16": 989e12, "fp8": 1979e12},
        "memory_bytes": 80e9,
        "hbm_bandwidth_bytes_per_s": 3.35e12,
        "intra_node_bandwidth_bytes_per_s": 450e9,
        "inter_node_bandwidth_bytes_per_s": 50e9,
    }
    hopper = cluster_spec({**figures, "architecture": "hopper"})
    h100 = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    assert (hopper.gemm_efficiency_max, hopper.fp8_gemm_efficiency_max, hopper.sm_count) == (
        h100.gemm_efficiency_max,
        h100.fp8_gemm_efficiency_max,
        h100.sm_count,
    )
    # a ceiling the cluster states is its own
    assert cluster_spec({**figures, "architecture": "hopper", "gemm_efficiency_max": 0.7}).gemm_efficiency_max == 0.7


def test_fp8_on_gpus_without_fp8_tensor_cores_is_invalid_input_naming_the_precision():
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec(GPT_SMALL),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8, "precision": "fp8"}),
        )
    assert err.value.field == "training.precision" and err.value.code == "not-on-this-gpu"


def test_a_gpu_that_contradicts_the_preset_is_invalid_input_rather_than_ignored():
    with pytest.raises(InvalidInput) as err:
        cluster_spec({"preset": "dgx-h100", "nodes": 8, "gpu": "a100-40gb"})
    assert err.value.field == "cluster.gpu" and err.value.code == "conflicting-fields"
    # naming the preset's own GPU is no contradiction
    assert cluster_spec({"preset": "dgx-h100", "nodes": 8, "gpu": "h100"}).num_gpus == 64


def test_an_inventory_preset_takes_no_figures_it_would_ignore():
    with pytest.raises(InvalidInput) as err:
        cluster_spec({"preset": "gb200-nvl72", "nodes": 1, "memory_bytes": 1e9})
    assert err.value.field == "cluster.memory_bytes"


def test_a_flash_attention_version_needs_a_gpu_generation_with_measured_speeds():
    custom = {
        "gpus_per_node": 8,
        "num_nodes": 1,
        "peak_flops_per_s": {"bf16": 1e15},
        "memory_bytes": 8e10,
        "intra_node_bandwidth_bytes_per_s": 4e11,
        "inter_node_bandwidth_bytes_per_s": 5e10,
    }
    training = {"global_batch_sequences": 8, "flash_attention_version": 2}
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(model_spec(GPT_SMALL), cluster_spec(custom), training_spec(training))
    assert err.value.code == "unknown-architecture"
    assert plan_parallel_layout(
        model_spec(GPT_SMALL), cluster_spec({**custom, "architecture": "hopper"}), training_spec(training)
    ).feasible


def test_a_flash_attention_version_with_flash_attention_off_is_a_contradiction():
    with pytest.raises(InvalidInput) as err:
        training_spec({"global_batch_sequences": 8, "flash_attention": False, "flash_attention_version": 1})
    assert err.value.code == "contradiction"


def test_an_unknown_fp8_scaling_recipe_is_invalid_input_naming_the_field():
    with pytest.raises(InvalidInput) as err:
        training_spec({"global_batch_sequences": 8, "precision": "fp8", "fp8_scaling": "blockwise"})
    assert err.value.field == "training.fp8_scaling"


def test_a_software_preset_sets_its_flags_and_fields_given_beside_it_win():
    spec = training_spec({"global_batch_sequences": 8, "software": "megatron-lm-2021", "dropout": False})
    assert not spec.flash_attention and not spec.sequence_parallel and spec.fp32_grad_copy_kept
    assert spec.dropout is False  # given explicitly, so the preset's "on" does not apply
    assert training_spec({"global_batch_sequences": 8, "software": "megatron-core"}) == training_spec(
        {"global_batch_sequences": 8}
    )


def test_an_unknown_software_preset_is_invalid_input_listing_the_known_ones():
    with pytest.raises(InvalidInput) as err:
        training_spec({"global_batch_sequences": 8, "software": "deepspeed-0.3"})
    assert err.value.field == "training.software" and "megatron-lm-2021" in str(err.value)


# ----------------------------------------------------------------------------- one definition per input


def test_a_spec_built_directly_runs_the_same_checks_as_one_read_from_a_mapping():
    with pytest.raises(InvalidInput) as direct:
        ModelSpec(num_layers=0, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=100)
    with pytest.raises(InvalidInput) as read:
        model_spec({**GPT_SMALL, "num_layers": 0})
    assert direct.value.field == read.value.field == "model.num_layers"
    assert direct.value.code == read.value.code == "out-of-range"


def test_integral_floats_and_lists_are_normalised_to_the_types_the_planner_computes_with():
    model = model_spec({**GPT_SMALL, "num_layers": 4.0, "sliding_window": 8, "sliding_window_layers": [0, 2]})
    assert model.num_layers == 4 and isinstance(model.num_layers, int)
    assert model.sliding_window_layers == (0, 2)
    assert Constraints(zero_stages=[1], recompute="FULL") == Constraints(zero_stages=(1,), recompute=("full",))


def test_an_unknown_key_in_a_nested_block_is_named_by_its_path():
    with pytest.raises(InvalidInput) as err:
        model_spec(
            {
                **GPT_SMALL,
                "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 64, "capacity": 2},
            }
        )
    assert err.value.field == "model.moe.capacity" and err.value.code == "unknown-field"


def test_a_missing_required_field_of_a_nested_block_is_named_by_its_path():
    with pytest.raises(InvalidInput) as err:
        model_spec({**GPT_SMALL, "mla": {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "v_head_dim": 128}})
    assert err.value.field == "model.mla.qk_rope_head_dim" and err.value.code == "missing-field"


def test_a_layout_read_under_a_request_path_is_refused_under_that_path():
    with pytest.raises(InvalidInput) as err:
        spec_from_mapping(LayoutSpec, {"recompute": "full", "recompute_num_layers": 0}, "evaluate[3]")
    assert err.value.field == "evaluate[3].recompute_num_layers" and err.value.code == "contradiction"
    assert str(err.value).startswith("evaluate[3]:")
    with pytest.raises(InvalidInput) as direct:
        LayoutSpec(recompute="full", recompute_num_layers=0)
    assert direct.value.field == "layout.recompute_num_layers"


def test_every_input_field_is_declared_with_a_description():
    for spec in (ModelSpec, MoESpec, MLASpec, ClusterSpec, TrainingSpec, Constraints, LayoutSpec):
        for field in dataclasses.fields(spec):
            assert field_rule(field).doc, f"{spec.__name__}.{field.name}"
