"""A corpus of hostile inputs against a real server process: each gets its 4xx, the
server stays up, and its memory stays bounded.

The server is ``hyperplace serve`` on a loopback port with the *default* body limit
(HYPERPLACE_MAX_BODY_BYTES, 64 MiB), so the size cases test the real limit with
real chunked uploads; the bodies are generated lazily, so the test never holds
them either.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from service.settings import Settings
from tests.conftest import new_api_key
from tests.partitioners.graph.onnx_helpers import expanding_functions
from tests.service.graphs import diamond_graph, plan_request
from tests.service.live_server import peak_rss_bytes, send_chunked, start_server

ONNX_DIR = Path(__file__).parents[2] / "fixtures" / "onnx"
DEFAULT_BODY_LIMIT = Settings.model_fields["max_body_bytes"].default


@pytest.fixture(scope="module")
def server(database_url, tmp_path_factory):
    live = start_server(database_url, tmp_path_factory.mktemp("hostile") / "server.log", log_level="WARNING")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def api(server, session_factory, settings):
    _, key = new_api_key(session_factory, settings)
    with server.client(key) as client:
        yield client


#: The server's peak resident memory over the whole corpus stays under this: a few
#: times its ~150 MiB working set, far under the ~0.7 GB of the largest hostile body.
MEMORY_CEILING_BYTES = 768 * 1024 * 1024


@pytest.fixture(autouse=True)
def _server_survives(server):
    yield
    assert server.process.poll() is None, f"the server died: {server.logs()[-3000:]}"
    assert server.is_up()
    assert peak_rss_bytes(server.pid) < MEMORY_CEILING_BYTES


def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["detail"]
    assert "Traceback" not in response.text
    return body


# ----------------------------------------------------------------------------- ONNX


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    key, length = (number << 3) | 2, len(payload)
    out = bytearray()
    for value in (key, length):
        while True:
            byte = value & 0x7F
            value >>= 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                break
    return bytes(out) + payload


def _deeply_nested_onnx(depth: int) -> bytes:
    """If -> then_branch -> If -> ... ``depth`` levels, encoded by hand (onnx.helper
    itself refuses to build past protobuf's nesting limit, which is the point)."""
    leaf = _field(1, _field(1, b"x") + _field(2, b"y") + _field(4, b"Identity")) + _field(2, b"leaf")
    graph = leaf
    for level in range(depth):
        then_branch = _field(1, b"then_branch") + _field(6, graph) + bytes([0xA0, 0x01, 5])  # type = GRAPH
        node = (
            _field(1, b"c")
            + _field(2, b"y")
            + _field(3, f"if{level}".encode())
            + _field(4, b"If")
            + _field(5, then_branch)
        )
        graph = _field(1, node) + _field(2, f"g{level}".encode())
    opset = _field(1, b"") + bytes([0x10, 17])
    return bytes([0x08, 8]) + _field(7, graph) + _field(8, opset)


def _onnx_model(nodes, inputs, outputs, name="hostile", initializers=()) -> bytes:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _tensor(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _onnx_corpus() -> dict[str, bytes]:
    gpt2 = (ONNX_DIR / "gpt2.onnx").read_bytes()
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    return {
        "truncated": gpt2[: len(gpt2) // 2],
        "garbage": np.random.default_rng(10).bytes(4096),
        "empty-model": _onnx_model([], [], []),
        "model-without-graph": onnx.ModelProto(ir_version=8).SerializeToString(),
        "deeply-nested-subgraphs": _deeply_nested_onnx(1000),
        "cycle": _onnx_model(
            [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
            [_tensor("x", [4])],
            [_tensor("b", [4])],
        ),
        "tensor-of-10^18-bytes": _onnx_model(
            [relu], [_tensor("x", [10**9, 250_000_000])], [_tensor("y", [10**9, 250_000_000])]
        ),
        "expand-to-10^27-elements": _onnx_model(
            [helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
            [_tensor("x", [1])],
            [_tensor("y", None)],
            initializers=[numpy_helper.from_array(np.array([10**9] * 3, dtype=np.int64), "shape")],
        ),
        "tile-by-2^62": _onnx_model(
            [helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")],
            [_tensor("x", [4])],
            [_tensor("y", None)],
            initializers=[numpy_helper.from_array(np.array([2**62], dtype=np.int64), "repeats")],
        ),
        "nul-in-a-name": _onnx_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r\x00")], [_tensor("x", [3])], [_tensor("y", [3])]
        ),
    }


ONNX_CORPUS = _onnx_corpus()


def _calling_in_bodies(depth: int, nest: int, op: str) -> bytes:
    """:func:`expanding_functions` of ``depth`` (2^depth operators), called from inside
    ``nest`` control-flow operators (``If`` or ``Loop``) nested in each other."""
    model = onnx.load_model_from_string(expanding_functions(depth))
    inner = [helper.make_node(f"f{depth}", ["x"], ["y"], domain="local")]
    for level in range(nest):
        if op == "If":
            branch = helper.make_graph(inner, f"then{level}", [], [_tensor("y", [4])])
            other = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], f"else{level}", [], [_tensor("y", [4])])
            inner = [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)]
        else:
            body = helper.make_graph(
                [*inner, helper.make_node("Identity", ["cond"], ["cond_out"])],
                f"body{level}",
                [
                    helper.make_tensor_value_info("i", TensorProto.INT64, []),
                    helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                ],
                [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _tensor("y", [4])],
            )
            inner = [helper.make_node("Loop", ["", "c"], ["y"], body=body)]
    del model.graph.node[:]
    model.graph.node.extend(inner)
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    return model.SerializeToString()


#: Files built to expand (issue 55): each is refused as too large before ONNX shape inference expands it.
EXPANDING_ONNX = {
    "functions-nested-40-deep": expanding_functions(40),
    "functions-called-3-times-30-deep": expanding_functions(30, calls_per_level=3),
    "functions-inside-20-nested-ifs": _calling_in_bodies(30, nest=20, op="If"),
    "functions-inside-20-nested-loops": _calling_in_bodies(30, nest=20, op="Loop"),
}


@pytest.mark.parametrize("case", sorted(EXPANDING_ONNX))
def test_an_onnx_upload_built_to_expand_is_413_naming_the_operator_limit(api, case):
    body = _problem(
        api.post(
            "/v1/plans",
            files={"model": ("model.onnx", EXPANDING_ONNX[case], "application/octet-stream")},
            data={"inventory": json.dumps({"preset": "dgx-h100"})},
        ),
        413,
    )
    assert body["errors"][0]["type"] == "too-many-ops" and "HYPERPLACE_MAX_GRAPH_OPS" in body["detail"]


@pytest.mark.parametrize("case", sorted(ONNX_CORPUS))
def test_a_hostile_onnx_upload_is_422(api, case):
    response = api.post(
        "/v1/plans",
        files={"model": ("model.onnx", ONNX_CORPUS[case], "application/octet-stream")},
        data={"inventory": json.dumps({"preset": "dgx-h100"})},
    )
    _problem(response, 422)


def test_deeply_nested_subgraphs_are_refused_by_the_parser_not_the_stack(api):
    detail = _problem(
        api.post(
            "/v1/plans",
            files={"model": ("model.onnx", ONNX_CORPUS["deeply-nested-subgraphs"], "application/octet-stream")},
            data={"inventory": json.dumps({"preset": "dgx-h100"})},
        ),
        422,
    )["detail"]
    assert "onnx" in detail.lower()


# ----------------------------------------------------------------------------- JSON graphs


def _graph_with(**changes) -> dict:
    graph = diamond_graph("hostile")
    for path, value in changes.items():
        kind, index, field = path.split("__")
        graph[kind][int(index)][field] = value
    return graph


def _raw(document: dict, replace: tuple[str, str] | None = None) -> bytes:
    text = json.dumps(document)
    if replace:
        text = text.replace(*replace)
    return text.encode()


#: (A JSON graph with a cycle is in test_bad_input; its ONNX twin is above.)
JSON_CORPUS: dict[str, tuple[bytes, int]] = {
    "nan-flops": (_raw(plan_request(_graph_with(nodes__0__flops=12345.5)), ('"flops": 12345.5', '"flops": NaN')), 422),
    "infinite-bytes": (
        _raw(plan_request(_graph_with(tensors__0__bytes=12345.5)), ('"bytes": 12345.5', '"bytes": Infinity')),
        422,
    ),
    "tensor-of-10^18-bytes": (_raw(plan_request(_graph_with(tensors__4__bytes=1e18))), 422),
    "nested-100000-deep": (
        b'{"graph": ' + b"[" * 100_000 + b"]" * 100_000 + b', "inventory": {"preset": "dgx-h100"}}',
        422,
    ),
    "integer-of-5000-digits": (
        _raw(plan_request(_graph_with(nodes__0__flops=7.5)), ('"flops": 7.5', '"flops": ' + "9" * 5000)),
        422,
    ),
    "nul-in-a-name": (_raw(plan_request(_graph_with(nodes__0__name="a\x00"))), 422),
    "unpaired-surrogate": (_raw(plan_request(_graph_with(nodes__0__name="SURROGATE")), ("SURROGATE", "\\ud800")), 422),
    "inventory-with-zero-devices": (
        _raw(
            {
                **plan_request(),
                "inventory": {
                    "name": "empty",
                    "groups": [{"name": "g", "devices": [], "link": {"bandwidth_bytes_per_s": 1e9}}],
                },
            }
        ),
        422,
    ),
    "preset-with-zero-nodes": (_raw(plan_request(nodes=0)), 422),
    "inventory-of-32768-gpus": (_raw(plan_request(nodes=4096)), 413),
    "not-utf-8": ('{"graph": {"name": "\xe9"}}'.encode("latin-1"), 422),
}


@pytest.mark.parametrize("case", sorted(JSON_CORPUS))
def test_a_hostile_json_plan_is_rejected(api, case):
    body, status = JSON_CORPUS[case]
    _problem(api.post("/v1/plans", content=body, headers={"Content-Type": "application/json"}), status)


# ----------------------------------------------------------------------------- MoE


def _moe(**changes) -> dict:
    request = {
        "model": {"num_moe_layers": 2, "num_logical_experts": 4},
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 3},
        "load": [[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]],
    }
    request.update(changes)
    return request


MOE_CORPUS: dict[str, tuple[dict, int]] = {
    "too-few-columns": (_moe(load=[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]), 422),
    "too-few-rows": (_moe(load=[[1.0, 2.0, 3.0, 4.0]]), 422),
    "ragged-rows": (_moe(load=[[1.0, 2.0, 3.0, 4.0], [1.0]]), 422),
    "three-dimensional": (_moe(load=[[[1.0, 2.0, 3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]]]), 422),
    "empty": (_moe(load=[]), 422),
    "negative": (_moe(load=[[1.0, -2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]), 422),
    "near-float-max": (_moe(load=[[1e308, 1e308, 1e308, 1e308], [1.0, 2.0, 3.0, 4.0]]), 422),
    "more-experts-than-slots": (_moe(model={"num_moe_layers": 2, "num_logical_experts": 8}, load=[[1.0] * 8] * 2), 422),
    "four-billion-slots": (_moe(cluster={"num_nodes": 4096, "gpus_per_node": 1024, "slots_per_gpu": 1024}), 413),
    "placement-of-the-wrong-shape": (_moe(current_placement={"physical_to_logical": [[0, 1], [2, 3]]}), 422),
}


@pytest.mark.parametrize("case", sorted(MOE_CORPUS))
def test_a_hostile_moe_load_is_rejected(api, case):
    body, status = MOE_CORPUS[case]
    _problem(api.post("/v1/moe/rebalance", json=body), status)


# ----------------------------------------------------------------------------- size limits


def _ten_million_operator_graph(chunk_ops: int = 20_000):
    """The JSON of a 10^7-operator chain, yielded in chunks (~0.8 GB in all, never held)."""
    yield b'{"inventory": {"preset": "dgx-h100"}, "graph": {"name": "huge", "nodes": ['
    for start in range(0, 10**7, chunk_ops):
        yield ",".join(
            f'{{"name":"n{i}","op":"Add","inputs":["t{i}"],"outputs":["t{i + 1}"],"flops":1}}'
            for i in range(start, start + chunk_ops)
        ).encode() + (b"," if start + chunk_ops < 10**7 else b"")
    yield b'], "tensors": []}}'


def test_ten_million_operators_are_413_before_the_body_is_read(server, api):
    headers = {"Authorization": api.headers["authorization"], "Content-Type": "application/json"}
    peak_before = peak_rss_bytes(server.pid)
    status, response, sent = send_chunked(server.port, "/v1/plans", headers, _ten_million_operator_graph())
    assert status == 413, response[:500]
    assert b"HYPERPLACE_MAX_BODY_BYTES" in response
    full_body_bytes = 10**7 * 60  # at least 60 bytes per operator
    assert sent < full_body_bytes / 4  # the server stopped reading soon after the limit
    # Memory stays bounded: the server never held the body (nor half of it).
    assert peak_rss_bytes(server.pid) - peak_before < full_body_bytes / 2


def test_a_declared_content_length_over_the_limit_is_413_without_reading(server, api):
    headers = {"Authorization": api.headers["authorization"], "Content-Type": "application/json"}
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        head = ["POST /v1/plans HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {10**9}", "Connection: close"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b'{"graph": ')
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response.split(b" ", 2)[1] == b"413", response[:300]


def test_a_chunked_body_just_over_the_limit_is_413(server, api):
    headers = {"Authorization": api.headers["authorization"], "Content-Type": "application/json"}
    total = DEFAULT_BODY_LIMIT + 1

    def chunks(size: int = 1 << 20):
        remaining = total
        while remaining:
            yield b" " * min(size, remaining)
            remaining -= min(size, remaining)

    status, response, _sent = send_chunked(server.port, "/v1/plans", headers, chunks())
    assert status == 413, response[:500]


def test_a_chunked_body_just_under_the_limit_is_read(server, api):
    """The other side of the limit: the same chunked path accepts a body that fits."""
    headers = {"Authorization": api.headers["authorization"], "Content-Type": "application/json"}
    document = json.dumps(plan_request(diamond_graph("chunked-under-limit"))).encode()
    padded = document + b" " * (DEFAULT_BODY_LIMIT - len(document))
    status, response, _ = send_chunked(
        server.port, "/v1/plans", headers, (padded[i : i + (1 << 20)] for i in range(0, len(padded), 1 << 20))
    )
    assert status == 201, response[:500]


# ----------------------------------------------------------------------------- numbers


def _number_paths(document, path=()):
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _number_paths(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from _number_paths(value, (*path, index))
    elif isinstance(document, (int, float)) and not isinstance(document, bool):
        yield path


def _with(document, path, value):
    document = json.loads(json.dumps(document))
    target = document
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return document


def _valid_requests(api) -> dict[str, dict]:
    plan = api.post("/v1/plans", json=plan_request(diamond_graph("finite-base"))).json()
    ops = [
        {"name": name, "device": device, "start_s": i * 1e-3, "duration_s": 1e-3}
        for i, (name, device) in enumerate(sorted(plan["ops"].items()))
    ]
    explicit_inventory = {
        "name": "c",
        "groups": [
            {
                "name": "g",
                "devices": [
                    {
                        "name": "d",
                        "peak_flops": 1e14,
                        "memory_tiers": [{"name": "hbm", "capacity_bytes": 8e10, "bandwidth_bytes_per_s": 3e12}],
                    }
                ],
                "link": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6},
            }
        ],
        "link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5},
    }
    return {
        "/v1/plans": plan_request(diamond_graph("finite"), micro_batches=2, memory_headroom_fraction=0.1),
        "/v1/plans#inventory": {"graph": diamond_graph("finite-inventory"), "inventory": explicit_inventory},
        "/v1/moe/rebalance": _moe(
            model={"num_moe_layers": 2, "num_logical_experts": 4, "expert_bytes": 1000},
            min_improvement=0.1,
            max_replicas_moved=3,
        ),
        "/v1/parallel/plan": {
            "model": {
                "num_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "ffn_hidden_size": 11008,
                "vocab_size": 32000,
                "seq_length": 4096,
            },
            "cluster": {"preset": "dgx-h100", "nodes": 2},
            "training": {"global_batch_sequences": 256},
        },
        f"/v1/plans/{plan['id']}/feedback": {"timeline": {"ops": ops}},
    }


def test_nan_or_infinity_in_any_number_of_a_valid_request_is_4xx(api):
    """Every number in every request body is checked finite: a NaN or an infinity (which
    Python's JSON reader accepts) anywhere is a 4xx, never a 5xx or a stored NaN."""
    requests = _valid_requests(api)
    for route, body in requests.items():
        url = route.split("#")[0]
        assert api.post(url, json=body).status_code < 300, route  # the base request is valid
        for path in list(_number_paths(body))[:40]:
            for bad in ("NaN", "Infinity", "-Infinity"):
                raw = json.dumps(_with(body, path, 1.5e-7)).replace("1.5e-07", bad, 1)
                response = api.post(url, content=raw.encode(), headers={"Content-Type": "application/json"})
                assert 400 <= response.status_code < 500, (
                    f"{route} {path} = {bad}: {response.status_code} {response.text[:200]}"
                )
