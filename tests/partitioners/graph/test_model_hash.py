"""model_hash: a content hash of the canonical graph (DESIGN.md "Plan").

Same structure, sizes, shapes, dtypes and op types -> same hash, whatever the order of
"nodes" and "tensors" in the file; any change to those -> another hash.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.graph.canonical import graph_to_json, model_hash
from partitioners.graph.json_import import graph_from_json

_OPS = ["MatMul", "Add", "Relu", "Conv", "Softmax"]
_DTYPES = ["float32", "float16", "bfloat16"]


@st.composite
def graph_docs(draw) -> dict:
    """Random DAG documents: op i reads graph inputs, weights or earlier ops' outputs."""
    n_ops = draw(st.integers(1, 12))
    n_inputs = draw(st.integers(1, 3))
    tensors = []
    for i in range(n_inputs):
        shape = draw(st.lists(st.integers(1, 16), min_size=1, max_size=3))
        tensors.append({"name": f"in{i}", "bytes": 4 * _prod(shape), "shape": shape, "dtype": "float32"})
    readable = [f"in{i}" for i in range(n_inputs)]
    nodes = []
    for i in range(n_ops):
        reads = draw(st.lists(st.sampled_from(readable), min_size=1, max_size=3))
        if draw(st.booleans()):
            tensors.append({"name": f"w{i}", "bytes": draw(st.integers(0, 4096)), "kind": "parameter"})
            reads.append(f"w{i}")
        shape = draw(st.lists(st.integers(1, 16), min_size=1, max_size=3))
        dtype = draw(st.sampled_from(_DTYPES))
        tensors.append({"name": f"t{i}", "bytes": 2 * _prod(shape), "shape": shape, "dtype": dtype})
        nodes.append(
            {
                "name": f"op{i}",
                "op": draw(st.sampled_from(_OPS)),
                "inputs": reads,
                "outputs": [f"t{i}"],
                "flops": draw(st.floats(0, 1e12, allow_nan=False)),
            }
        )
        readable.append(f"t{i}")
    return {"name": "random", "nodes": nodes, "tensors": tensors}


def _prod(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _hash(doc: dict) -> str:
    return model_hash(graph_from_json(doc))


@settings(max_examples=80, deadline=None)
@given(graph_docs(), st.randoms(use_true_random=False))
def test_hash_ignores_node_and_tensor_order(doc, rng):
    shuffled = copy.deepcopy(doc)
    rng.shuffle(shuffled["nodes"])
    rng.shuffle(shuffled["tensors"])
    shuffled["name"] = "another display name"
    assert _hash(shuffled) == _hash(doc)


@settings(max_examples=60, deadline=None)
@given(graph_docs(), st.data())
def test_hash_changes_with_tensor_bytes(doc, data):
    i = data.draw(st.integers(0, len(doc["tensors"]) - 1))
    changed = copy.deepcopy(doc)
    changed["tensors"][i]["bytes"] += 1
    assert _hash(changed) != _hash(doc)


@settings(max_examples=60, deadline=None)
@given(graph_docs(), st.data())
def test_hash_changes_with_a_tensor_shape(doc, data):
    shaped = [i for i, t in enumerate(doc["tensors"]) if "shape" in t]
    i = data.draw(st.sampled_from(shaped))
    changed = copy.deepcopy(doc)
    changed["tensors"][i]["shape"] = changed["tensors"][i]["shape"] + [1]  # same bytes, other shape
    assert _hash(changed) != _hash(doc)


@settings(max_examples=60, deadline=None)
@given(graph_docs(), st.data())
def test_hash_changes_with_an_op_type(doc, data):
    i = data.draw(st.integers(0, len(doc["nodes"]) - 1))
    changed = copy.deepcopy(doc)
    changed["nodes"][i]["op"] = data.draw(st.sampled_from([o for o in _OPS if o != doc["nodes"][i]["op"]]))
    assert _hash(changed) != _hash(doc)


@settings(max_examples=40, deadline=None)
@given(graph_docs())
def test_hash_survives_the_canonical_json_round_trip(doc):
    assert model_hash(graph_from_json(graph_to_json(graph_from_json(doc)))) == _hash(doc)


def _two_input_doc(inputs: list[str], dtype: str = "float32") -> dict:
    return {
        "name": "g",
        "nodes": [{"name": "mm", "op": "MatMul", "inputs": inputs, "outputs": ["y"], "flops": 8}],
        "tensors": [
            {"name": "a", "bytes": 16, "shape": [2, 2], "dtype": dtype},
            {"name": "b", "bytes": 16, "shape": [2, 2], "dtype": "float32"},
            {"name": "y", "bytes": 16, "shape": [2, 2], "dtype": "float32"},
        ],
    }


def test_hash_depends_on_argument_order():
    assert _hash(_two_input_doc(["a", "b"])) != _hash(_two_input_doc(["b", "a"]))


def test_hash_depends_on_dtype():
    assert _hash(_two_input_doc(["a", "b"])) != _hash(_two_input_doc(["a", "b"], dtype="int32"))


def test_hash_is_sha256_hex():
    digest = _hash(_two_input_doc(["a", "b"]))
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
