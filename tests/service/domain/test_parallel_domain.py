"""A whole POST /v1/parallel/plan body read into the planner's specs and answered (service.domain.parallel)."""

from __future__ import annotations

import json

import pytest

from partitioners.errors import InvalidInput
from service.domain.parallel import plan_answer, plan_inputs
from tests.partitioners.parallel3d.shapes import A100_NODE, GPT_SMALL

_MOE_SMALL = {**GPT_SMALL, "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 64}}


def test_request_with_evaluate_predicts_the_given_layouts_in_order():
    body = {
        "model": {**GPT_SMALL, "num_layers": 4},
        "cluster": A100_NODE,
        "training": {"global_batch_sequences": 64},
        "evaluate": [{"tp": 2}, {"pp": 4}],
    }
    answer = plan_answer(plan_inputs(body))
    assert answer["mode"] == "evaluate"
    assert [(p["tp"], p["pp"]) for p in answer["predictions"]] == [(2, 1), (1, 4)]
    json.dumps(answer)


def test_request_search_returns_ranked_candidates_and_a_truncated_rank_map():
    body = {
        "model": {**GPT_SMALL, "num_layers": 4},
        "cluster": {"preset": "dgx-h100", "nodes": 2},
        "training": {"global_batch_sequences": 64},
        "top_k": 3,
    }
    answer = plan_answer(plan_inputs(body), rank_map_limit=5)
    times = [c["step_time_s"] for c in answer["candidates"]]
    assert answer["mode"] == "search" and 1 <= len(times) <= 3
    assert answer["rank_map"]["num_ranks"] == 16 and len(answer["rank_map"]["ranks"]) == 5
    assert answer["rank_map"]["truncated"]


def test_request_with_unknown_key_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        plan_inputs(
            {"model": GPT_SMALL, "cluster": A100_NODE, "training": {"global_batch_sequences": 8}, "optimiser": "sgd"}
        )
    assert err.value.field == "optimiser"


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        # counts beyond any model or cluster: enumerating 2**70's divisors would not end
        (lambda body: body["model"]["moe"].update(num_experts=2**70), "model.moe.num_experts"),
        (lambda body: body["model"].update(num_layers=float("inf")), "model.num_layers"),
        (lambda body: body["cluster"].update(nodes=10**9), "cluster.num_nodes"),
        # shapes that used to raise TypeError or ValueError inside the parser
        (lambda body: body["model"]["moe"].update(moe_layers=True), "model.moe.moe_layers"),
        (lambda body: body.update(constraints={"recompute": 0}), "constraints.recompute"),
        (lambda body: body.update(constraints={"tie_tolerance": "x"}), "constraints.tie_tolerance"),
        (lambda body: body.update(evaluate=[{"tp": 1, "pp": 1, "dp": "full"}]), "evaluate[0].dp"),
    ],
)
def test_malformed_request_fields_are_invalid_input_naming_the_field(edit, field):
    body = {
        "model": json.loads(json.dumps(_MOE_SMALL)),
        "cluster": dict(A100_NODE),
        "training": {"global_batch_sequences": 8},
    }
    edit(body)
    with pytest.raises(InvalidInput) as err:
        plan_answer(plan_inputs(body))
    assert err.value.field == field
