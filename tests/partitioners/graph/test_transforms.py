"""Specification of the training / micro-batch expansion (partitioners.graph.transforms)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.errors import InvalidInput
from partitioners.graph.canonical import model_hash
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import (
    ROLE_ABSENT,
    TENSOR_PARAMETER,
    TENSOR_ROLE_GRADIENT,
    TENSOR_ROLE_OPTIMIZER_STATE,
    graph_from_ops,
    topological_order,
)
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.transforms import (
    BACKWARD_FLOPS_FACTOR,
    OPTIMIZER_STATE_FACTOR,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    expand_graph,
)
from tests.partitioners.training_step import mlp_training_step


def mlp():
    """x -> mm1(w1) -> h -> relu -> a -> mm2(w2) -> y."""
    return graph_from_ops(
        "mlp",
        [
            ("mm1", "MatMul", 10.0, ["x", "w1"], ["h"]),
            ("relu", "Relu", 1.0, ["h"], ["a"]),
            ("mm2", "MatMul", 20.0, ["a", "w2"], ["y"]),
        ],
        {"x": 4, "w1": 8, "h": 4, "a": 4, "w2": 16, "y": 2},
        {"w1", "w2"},
    )


def op(g, name):
    return int(np.flatnonzero(g.op_names == name)[0])


def names_in(g, o):
    return [g.tensor_names[t] for t in g.inputs_of(o)]


def names_out(g, o):
    return [g.tensor_names[t] for t in g.outputs_of(o)]


def test_inference_with_one_micro_batch_is_the_input_graph():
    g = mlp()
    e = expand_graph(g)
    assert e.graph is g
    assert e.op_phase.tolist() == [PHASE_FORWARD] * 3


def test_training_adds_a_gradient_op_with_twice_the_forward_flops():
    e = expand_graph(mlp(), mode="training")
    g = e.graph
    assert g.op_flops[op(g, "grad/mm2")] == 20.0 * BACKWARD_FLOPS_FACTOR
    assert g.op_flops[op(g, "grad/relu")] == 2.0
    assert e.op_phase[op(g, "grad/mm1")] == PHASE_BACKWARD


def test_gradient_op_reads_output_gradients_saved_activations_and_weights():
    g = expand_graph(mlp(), mode="training").graph
    assert names_in(g, op(g, "grad/relu")) == ["grad/a/mm2", "h"]
    assert names_out(g, op(g, "grad/relu")) == ["grad/h/relu"]
    # the graph output seeds the backward pass
    assert names_in(g, op(g, "grad/mm2")) == ["y", "a", "w2"]
    assert names_out(g, op(g, "grad/mm2")) == ["grad/a/mm2", "grad/w2/mm2"]


def test_graph_inputs_get_no_gradient():
    g = expand_graph(mlp(), mode="training").graph
    assert names_out(g, op(g, "grad/mm1")) == ["grad/w1/mm1"]


def test_optimizer_step_reads_weight_state_and_every_micro_batch_gradient():
    e = expand_graph(mlp(), mode="training", micro_batches=2)
    g = e.graph
    step = op(g, "step/w2")
    assert names_in(g, step) == ["w2", "adam/w2", "grad/w2/mm2@mb0", "grad/w2/mm2@mb1"]
    assert e.op_phase[step] == PHASE_OPTIMIZER and e.op_micro_batch[step] == -1
    nb = dict(zip(g.tensor_names.tolist(), g.tensor_bytes.tolist()))
    assert nb["adam/w2"] == 16 * OPTIMIZER_STATE_FACTOR
    assert nb["grad/w2/mm2@mb0"] + nb["grad/w2/mm2@mb1"] == 16  # one accumulated gradient


def test_micro_batches_repeat_activations_and_share_parameters():
    e = expand_graph(mlp(), micro_batches=3)
    g = e.graph
    assert g.n_ops == 9
    assert e.op_micro_batch.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert names_in(g, op(g, "mm2@mb2")) == ["a@mb2", "w2"]
    params = g.tensor_names[g.tensor_kind == TENSOR_PARAMETER].tolist()
    assert params == ["w1", "w2"]


def test_backward_runs_after_forward_in_dependency_order():
    g = expand_graph(mlp(), mode="training").graph
    order = topological_order(g).tolist()
    pos = {g.op_names[o]: i for i, o in enumerate(order)}
    assert pos["mm2"] < pos["grad/mm2"] < pos["grad/relu"] < pos["grad/mm1"] < pos["step/w1"]


@pytest.mark.parametrize("kwargs", [{"mode": "fine-tuning"}, {"micro_batches": 0}])
def test_bad_options_are_rejected(kwargs):
    with pytest.raises(InvalidInput):
        expand_graph(mlp(), **kwargs)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(5, 120), m=st.integers(1, 4), seed=st.integers(0, 1000), training=st.booleans())
def test_expansion_counts_and_acyclicity(n, m, seed, training):
    g = synthetic_hypergraph(n, lanes=4, seed=seed)
    e = expand_graph(g, mode="training" if training else "inference", micro_batches=m)
    x = e.graph
    n_params_read = np.unique(g.input_tensors[g.tensor_kind[g.input_tensors] == TENSOR_PARAMETER]).shape[0]
    expected_ops = m * n * (2 if training else 1) + (n_params_read if training else 0)
    assert x.n_ops == expected_ops
    fwd = e.op_phase == PHASE_FORWARD
    assert np.isclose(x.op_flops[fwd].sum(), m * g.op_flops.sum())
    assert np.array_equal(np.sort(e.op_origin[fwd]), np.sort(np.tile(np.arange(n), m)))
    topological_order(x)  # raises on a cycle


# --- a declared (exported) training step ---


def declared_step():
    return graph_from_json(mlp_training_step())


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_declared_step_with_one_micro_batch_is_the_input_graph(mode):
    graph = declared_step()
    e = expand_graph(graph, mode=mode)
    assert e.graph is graph
    assert (e.mode, e.declared) == ("training", True)
    assert e.op_phase.tolist() == [PHASE_FORWARD] * 2 + [PHASE_BACKWARD] * 4 + [PHASE_OPTIMIZER] * 2
    assert e.op_micro_batch.tolist() == [0] * 6 + [-1] * 2


def test_a_declared_step_repeats_forward_and_backward_per_micro_batch_and_its_optimizer_once():
    e = expand_graph(declared_step(), mode="training", micro_batches=2)
    g = e.graph
    assert g.op_names.tolist()[:6] == ["fc1@mb0", "fc2@mb0", "loss_grad@mb0", "fc2_grad_w@mb0", "fc2_grad_x@mb0", "fc1_grad_w@mb0"]  # fmt: skip
    assert g.op_names.tolist()[12:] == ["adam_w1", "adam_w2"]
    assert e.op_micro_batch.tolist() == [0] * 6 + [1] * 6 + [-1, -1]
    assert e.op_origin.tolist() == [0, 1, 2, 3, 4, 5] * 2 + [6, 7]
    assert not any(name.startswith(("grad/", "step/")) for name in g.op_names.tolist())
    shared = g.tensor_names[g.tensor_kind == TENSOR_PARAMETER].tolist()
    assert shared == ["w1", "w2", "w1.m", "w1.v", "w2.m", "w2.v"]


def test_a_declared_optimizer_operator_reads_every_micro_batch_share_of_its_gradient():
    g = expand_graph(declared_step(), mode="training", micro_batches=2).graph
    adam = op(g, "adam_w1")
    assert names_in(g, adam) == ["w1", "dw1@mb0", "dw1@mb1", "w1.m", "w1.v"]
    nb = dict(zip(g.tensor_names.tolist(), g.tensor_bytes.tolist()))
    assert nb["dw1@mb0"] == nb["dw1@mb1"] == 4000 / 2  # one accumulated gradient in two shares
    assert nb["h@mb0"] == 2000  # other per-micro-batch tensors keep their size
    of = {g.tensor_names[t]: g.tensor_names[p] for t, p in enumerate(g.tensor_of.tolist()) if p >= 0}
    assert of["dw1@mb1"] == "w1" and of["w2.v"] == "w2"


def test_an_input_only_the_optimizer_reads_is_shared_by_the_micro_batches():
    doc = mlp_training_step()
    doc["nodes"][6]["inputs"].append("lr")
    doc["tensors"].append({"name": "lr", "bytes": 4})
    g = expand_graph(graph_from_json(doc), micro_batches=3).graph
    assert names_in(g, op(g, "adam_w1"))[-1] == "lr"
    assert "lr@mb0" not in g.tensor_names.tolist()


def test_a_synthesised_step_labels_its_gradients_and_optimizer_state():
    g = expand_graph(mlp(), mode="training", micro_batches=2).graph
    role = dict(zip(g.tensor_names.tolist(), g.tensor_role.tolist()))
    of = {g.tensor_names[t]: g.tensor_names[p] for t, p in enumerate(g.tensor_of.tolist()) if p >= 0}
    assert role["grad/w2/mm2@mb1"] == TENSOR_ROLE_GRADIENT and of["grad/w2/mm2@mb1"] == "w2"
    assert role["adam/w1"] == TENSOR_ROLE_OPTIMIZER_STATE and of["adam/w1"] == "w1"
    assert role["grad/h/relu@mb0"] == ROLE_ABSENT  # an activation's gradient belongs to no parameter


def _without_roles(graph):
    return dataclasses.replace(graph, op_role=None, tensor_role=None, tensor_of=None)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 80), m=st.integers(1, 4), seed=st.integers(0, 1000))
def test_declaring_the_synthesised_step_gives_the_same_expanded_graph(n, m, seed):
    # the one-micro-batch training step the synthesiser writes, sent back as a declared graph
    forward = synthetic_hypergraph(n, lanes=4, seed=seed)
    one = expand_graph(forward, mode="training")
    declared = dataclasses.replace(one.graph, op_role=one.op_phase)
    from_declared = expand_graph(declared, mode="training", micro_batches=m)
    synthesised = expand_graph(forward, mode="training", micro_batches=m)
    assert from_declared.declared and not synthesised.declared
    assert model_hash(_without_roles(from_declared.graph)) == model_hash(_without_roles(synthesised.graph))


def test_an_operator_reading_a_tensor_twice_gets_uniquely_named_gradients():
    # Mul(x, x): one gradient per read, each with its own name (plans address tensors by name)
    ops = [("square", "Mul", 1.0, ["x", "x"], ["y"]), ("scale", "Mul", 1.0, ["y", "w", "w"], ["z"])]
    graph = graph_from_ops("square", ops, {"x": 4.0, "y": 4.0, "w": 4.0, "z": 4.0}, {"w"})
    names = expand_graph(graph, mode="training", micro_batches=2).graph.tensor_names.tolist()
    assert len(names) == len(set(names))
    assert "grad/y/scale@mb1" in names and "grad/w/scale#1@mb1" in names
