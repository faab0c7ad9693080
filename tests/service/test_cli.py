"""The ``hyperplace`` commands: usage errors, unreachable databases and servers are one line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from partitioners.graph.generators import synthetic_graph_json
from service.cli import _mesh, app
from tests.service.graphs import diamond_graph

runner = CliRunner()


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "diamond.json"
    path.write_text(json.dumps(diamond_graph()))
    return path


def _plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def _text(result) -> str:
    """The command's output as one line of words (rich wraps usage errors in a box)."""
    return " ".join(result.output.replace("│", " ").split())


def test_plan_offline_writes_the_plan_json_and_prints_the_makespan(graph_file, tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(str(graph_file), "--preset", "dgx-h100", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "makespan" in result.output
    assert json.loads(out.read_text())["summary"]["makespan_s"] > 0


def test_plan_without_out_prints_the_plan_json_on_stdout_and_writes_no_file(graph_file, tmp_path):
    result = _plan(str(graph_file), "--preset", "dgx-h100")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["makespan_s"] > 0
    assert "makespan" in result.stderr  # the table, out of the way of a redirect
    assert sorted(path.name for path in tmp_path.iterdir()) == ["diamond.json"]


def _mixed_inventory() -> dict:
    """One node of eight devices whose speeds span two orders of magnitude."""
    devices = [
        {
            "name": f"d{i}",
            "type": f"t{i}",
            "peak_flops": peak,
            "memory_tiers": [{"name": "hbm", "capacity_bytes": 8e10, "bandwidth_bytes_per_s": 2e12}],
        }
        for i, peak in enumerate([1e14, 3e12, 1e12, 2e13, 1e14, 1e13, 3e13, 5e13])
    ]
    return {
        "name": "mixed",
        "groups": [{"name": "n0", "devices": devices, "link": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6}}],
    }


def test_plan_json_on_stdout_stays_valid_when_metis_prints_its_diagnostics(tmp_path):
    # METIS printf()s "Cannot bisect a graph with 0 vertices" to descriptor 1 for this request;
    # only a real process shows it (CliRunner captures Python's sys.stdout, not the descriptor)
    graph, inventory = tmp_path / "chain.json", tmp_path / "mixed.json"
    graph.write_text(json.dumps(synthetic_graph_json(9)))  # too few operators for eight devices
    inventory.write_text(json.dumps(_mixed_inventory()))
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "plan", str(graph), "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["makespan_s"] > 0
    assert "Cannot bisect" in done.stderr  # still told, where the logs go


def test_plan_dtype_times_the_preset_at_that_peak(graph_file):
    bf16 = json.loads(_plan(str(graph_file), "--preset", "dgx-h100").stdout)
    fp32 = json.loads(_plan(str(graph_file), "--preset", "dgx-h100", "--dtype", "fp32").stdout)
    assert fp32["summary"]["makespan_s"] > 2 * bf16["summary"]["makespan_s"]
    assert any("timed at the bf16 peak" in note for note in bf16["notes"])
    assert not any("peak" in note for note in fp32["notes"])


def test_plan_prints_the_plans_notes_under_its_table(graph_file):
    result = _plan(str(graph_file), "--preset", "dgx-h100")
    assert result.exit_code == 0, result.output
    assert "note: operators are timed at the bf16 peak" in " ".join(result.stderr.split())


def test_a_dtype_the_preset_does_not_publish_is_one_line_naming_what_it_has(graph_file):
    result = _plan(str(graph_file), "--preset", "ascend-910b", "--dtype", "tf32")
    assert result.exit_code == 2
    assert "publishes peaks for bf16, fp16" in _text(result) and "Traceback" not in result.output


def test_an_inventory_file_that_is_not_json_is_a_usage_error(graph_file, tmp_path):
    inventory = tmp_path / "inventory.json"
    inventory.write_text("not json")
    result = _plan(str(graph_file), "--inventory", str(inventory))
    assert result.exit_code == 2
    assert "is not JSON" in _text(result) and "Traceback" not in result.output


def test_an_inventory_that_repeats_a_group_name_is_one_line_naming_it(graph_file, tmp_path):
    device = {
        "type": "gpu",
        "peak_flops": 1e14,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e10, "bandwidth_bytes_per_s": 1e12}],
    }
    link = {"bandwidth_bytes_per_s": 1e11}
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            {
                "link": link,
                "groups": [
                    {"name": "node", "link": link, "devices": [{**device, "name": "a"}]},
                    {"name": "node", "link": link, "devices": [{**device, "name": "b"}]},
                ],
            }
        )
    )
    result = _plan(str(graph_file), "--inventory", str(inventory))
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: group name 'node' appears twice (inventory.groups[0] and inventory.groups[1]); names must be unique"
    )


def test_a_model_file_that_is_not_json_is_a_usage_error(tmp_path):
    model = tmp_path / "model.json"
    model.write_text("{")
    result = _plan(str(model))
    assert result.exit_code == 2 and "is not JSON" in _text(result)


@pytest.mark.parametrize("dim", ["batch=abc", "batch=0", "batch=1.5"])
def test_a_dimension_that_is_not_a_positive_integer_is_a_usage_error(graph_file, dim):
    result = _plan(str(graph_file), "-d", dim)
    assert result.exit_code == 2 and "--dim batch must be a positive integer" in _text(result)


def test_plan_cost_model_names_the_profile_that_times_the_plan(graph_file):
    plan = json.loads(_plan(str(graph_file), "--preset", "dgx-h100", "--cost-model", "roofline").stdout)
    assert plan["summary"]["cost_model"]["profile"] == "roofline"


def test_an_unknown_cost_model_profile_is_named(graph_file):
    result = _plan(str(graph_file), "--cost-model", "tpu-magic")
    assert result.exit_code == 2 and "cost_model" in _text(result) and "Traceback" not in result.output


def test_a_bad_plan_option_is_named(graph_file):
    result = _plan(str(graph_file), "-o", "micro_batches=0")
    assert result.exit_code == 2 and "micro_batches" in result.output and "Traceback" not in result.output


# ------------------------------------------------- hyperplace layout (the 3D-parallel planner)

LLAMA_3_70B = Path(__file__).resolve().parents[1] / "fixtures" / "huggingface" / "meta-llama_Meta-Llama-3-70B.json"


def _layout(*args: str):
    return runner.invoke(app, ["layout", str(LLAMA_3_70B), "--batch", "1024", "--nodes", "8", *args])


def test_layout_ranks_a_hugging_face_model_on_a_preset_and_writes_the_whole_answer(tmp_path):
    out = tmp_path / "layout.json"
    result = _layout("--seq-length", "4096", "--top-k", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    answer = json.loads(out.read_text())
    assert answer["num_gpus"] == 64 and len(answer["candidates"]) == 2
    best = answer["candidates"][0]
    assert f"tp{best['tp']} pp{best['pp']}" in result.output and f"{best['mfu']:.3f}" in result.output


def test_layout_evaluates_given_layouts_and_says_why_one_cannot_run(tmp_path):
    out = tmp_path / "layout.json"
    result = _layout("--seq-length", "4096", "-e", "tp=8,pp=1", "-e", "tp=1,pp=1,zero_stage=1", "--out", str(out))
    assert result.exit_code == 0, result.output
    fits, too_big = json.loads(out.read_text())["predictions"]
    assert not fits["reasons"] and too_big["reasons"][0].startswith("out of memory")
    assert "tp1 pp1 dp64" in result.output and "tp1 pp1 dp64 cannot run: out of memory" in _text(result)


def test_layout_prints_the_notes_of_the_first_layout(tmp_path):
    out = tmp_path / "layout.json"
    result = _layout("--seq-length", "4096", "--top-k", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    best = json.loads(out.read_text())["candidates"][0]
    assert best["notes"]  # a 70B model on 64 H100s: its fastest layouts are ties, with tight memory
    for note in best["notes"]:
        assert f"{_mesh(best)}: {note}" in _text(result)


def test_layout_says_which_pipeline_schedule_and_dispatcher_it_assumed():
    result = _layout("--seq-length", "4096", "--top-k", "1", "-t", "software=hai-llm")
    assert result.exit_code == 0, result.output
    assert "assumed: pipeline schedule: dualpipe;" in _text(result)
    assert "expert dispatch: node-deduplicated" in _text(result)


QWEN3_30B_A3B = LLAMA_3_70B.with_name("Qwen_Qwen3-30B-A3B.json")


def test_layout_shows_experts_folded_over_the_tensor_ranks_as_etp1():
    result = runner.invoke(
        app,
        [
            "layout",
            str(QWEN3_30B_A3B),
            "--seq-length",
            "4096",
            "--batch",
            "64",
            "--nodes",
            "1",
            "-e",
            "tp=2,pp=1,ep=8,etp=1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "tp2 pp1 ep8 etp1 dp4" in _text(result)


def test_layout_needs_the_training_sequence_length_beside_a_hugging_face_config():
    result = _layout()
    assert result.exit_code == 2 and "--seq-length is required" in _text(result)


def test_a_bad_training_field_for_layout_is_one_line_naming_it():
    result = _layout("--seq-length", "4096", "-t", "precision=fp4")
    assert result.exit_code == 2 and "training.precision" in result.output and "Traceback" not in result.output


# ------------------------------------------------- the database the commands run against


@pytest.fixture
def database_url(monkeypatch):
    """Set HYPERPLACE_DATABASE_URL for one command (the settings are cached per process)."""
    from service.settings import get_settings

    def use(url: str) -> None:
        monkeypatch.setenv("HYPERPLACE_DATABASE_URL", url)
        get_settings.cache_clear()

    yield use
    get_settings.cache_clear()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://user@host/db", "names a mysql database"),
        ("not a url", "is not a database URL"),
        ("postgresql+asyncpg://user@host/db", "uses the asyncpg driver"),
    ],
)
def test_an_unsupported_database_url_is_one_line_naming_the_variable(database_url, url, says):
    database_url(url)
    result = runner.invoke(app, ["migrate"])
    assert result.exit_code == 2
    assert f"HYPERPLACE_DATABASE_URL {says}" in _text(result) and "Traceback" not in result.output


def test_a_database_file_that_cannot_be_opened_is_one_line(database_url, tmp_path):
    database_url(f"sqlite:///{tmp_path}/missing-directory/hyperplace.sqlite3")
    result = runner.invoke(app, ["keys", "list", "--tenant", "acme"])
    assert result.exit_code == 1
    assert "cannot use the database at sqlite:///" in _text(result) and "unable to open database file" in _text(result)


def test_an_unreachable_database_server_is_named_with_its_password_hidden(database_url):
    database_url("postgresql+psycopg://planner:s3cret@127.0.0.1:1/hyperplace")
    result = runner.invoke(app, ["migrate"])
    assert result.exit_code == 1
    assert "cannot use the database at postgresql+psycopg://planner:***@127.0.0.1:1/hyperplace" in _text(result)
    assert "s3cret" not in result.output


def test_a_plain_postgresql_url_means_the_psycopg_driver_the_service_ships():
    from service.settings import Settings

    settings = Settings(database_url="postgresql://planner:s3cret@db.internal/hyperplace")
    assert settings.database_url == "postgresql+psycopg://planner:s3cret@db.internal/hyperplace"


@pytest.fixture
def environment(monkeypatch):
    """Set one HYPERPLACE_* variable for one command (the settings are cached per process)."""
    from service.settings import get_settings

    def use(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        get_settings.cache_clear()

    yield use
    get_settings.cache_clear()


def test_an_unknown_log_level_is_one_line_naming_the_variable_and_the_levels(environment):
    environment("HYPERPLACE_LOG_LEVEL", "LOUD")
    result = runner.invoke(app, ["migrate"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        _text(result)
        == "HYPERPLACE_LOG_LEVEL is 'LOUD', not a log level; use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    )


def test_a_log_level_is_read_in_any_case():
    from service.settings import Settings

    assert Settings(log_level="warning").log_level == "WARNING"


@pytest.mark.parametrize("tenant", ["", "   "])
def test_keys_create_refuses_a_tenant_with_no_name(database_url, tmp_path, tenant):
    database_url(f"sqlite:///{tmp_path / 'keys.sqlite3'}")
    assert runner.invoke(app, ["migrate"]).exit_code == 0
    result = runner.invoke(app, ["keys", "create", "--tenant", tenant])
    assert result.exit_code == 2
    assert "Invalid value for '--tenant': must name a tenant, not be empty or only spaces" in _text(result)
    assert "hp_" not in result.output


def _create_key_for_bob(database_url, tmp_path, scopes: str):
    """``hyperplace keys create --tenant bob --scopes SCOPES`` on a fresh, migrated database."""
    database_url(f"sqlite:///{tmp_path / 'keys.sqlite3'}")
    assert runner.invoke(app, ["migrate"]).exit_code == 0
    return runner.invoke(app, ["keys", "create", "--tenant", "bob", "--scopes", scopes])


@pytest.mark.parametrize("scopes", ["", "  ", ","])
def test_keys_create_refuses_a_key_with_no_scope(database_url, tmp_path, scopes):
    result = _create_key_for_bob(database_url, tmp_path, scopes)
    assert result.exit_code == 2
    assert "Invalid value for '--scopes': must name at least one scope; allowed: read, write, moe" in _text(result)
    assert "hp_" not in result.output


def test_keys_create_names_the_unknown_scopes_and_the_allowed_ones(database_url, tmp_path):
    result = _create_key_for_bob(database_url, tmp_path, "read admin")
    assert result.exit_code == 2
    assert "unknown scope(s) 'admin'; allowed: read, write, moe" in _text(result)
    assert "hp_" not in result.output


def test_keys_create_reads_commas_as_spaces_and_each_scope_once(database_url, tmp_path):
    result = _create_key_for_bob(database_url, tmp_path, "read,moe read")
    assert result.exit_code == 0, result.output
    assert "scopes read moe" in result.stderr


# ------------------------------------------------- plan --server: a server that gives no plan

API_KEY = "hp_0badc0de_never-printed-anywhere"


@pytest.fixture
def http_server():
    """A loopback HTTP server answering every request with ``(status, content type, body)``
    set by the test; its URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answer = {"value": (200, "application/json", b"{}")}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            status, content_type, body = answer["value"]
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def set_answer(status: int, content_type: str, body: bytes) -> str:
        answer["value"] = (status, content_type, body)
        return f"http://127.0.0.1:{server.server_port}"

    yield set_answer
    server.shutdown()
    server.server_close()


def test_an_unreachable_server_is_one_line_naming_it_and_why(graph_file):
    from tests.service.live_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = _plan(str(graph_file), "--server", url, "--api-key", API_KEY)
    assert result.exit_code == 1
    assert result.output.strip() == f"error: cannot connect to the server at {url}: connection refused"


def test_a_server_password_in_the_url_is_hidden(graph_file):
    from tests.service.live_server import free_port

    result = _plan(str(graph_file), "--server", f"http://planner:s3cret@127.0.0.1:{free_port()}")
    assert result.exit_code == 1 and "planner:***@127.0.0.1" in result.output and "s3cret" not in result.output


def test_a_server_that_does_not_answer_in_time_is_one_line(graph_file):
    import socket

    with socket.socket() as listening:  # accepts connections (the kernel's backlog) and never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        result = _plan(str(graph_file), "--server", url, "--api-key", API_KEY, "--timeout-s", "0.2")
    assert result.exit_code == 1
    assert result.output.strip() == f"error: the server at {url} did not answer in time (read timeout)"


def test_a_problem_answer_is_one_line_with_its_status_and_detail_and_no_api_key(graph_file, http_server):
    problem = {
        "type": "about:blank",
        "title": "Unauthorized",
        "status": 401,
        "detail": f"The API key {API_KEY} is unknown or revoked.",
    }
    url = http_server(401, "application/problem+json", json.dumps(problem).encode())
    result = _plan(str(graph_file), "--server", url, "--api-key", API_KEY)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: the server at {url} answered 401 Unauthorized: The API key *** is unknown or revoked."
    )


def test_a_problem_answer_names_the_fields_its_detail_does_not(graph_file, http_server):
    problem = {
        "title": "Request validation failed",
        "status": 422,
        "detail": "1 field is invalid",
        "errors": [{"field": "body.options.micro_batches", "message": "Input should be >= 1"}],
    }
    url = http_server(422, "application/problem+json", json.dumps(problem).encode())
    result = _plan(str(graph_file), "--server", url)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: the server at {url} answered 422 Request validation failed: "
        "1 field is invalid (body.options.micro_batches: Input should be >= 1)"
    )


def test_a_server_error_exits_1_naming_the_status(graph_file, http_server):
    url = http_server(502, "text/html", b"<html>Bad Gateway</html>")
    result = _plan(str(graph_file), "--server", url)
    assert result.exit_code == 1
    assert result.output.strip() == f"error: the server at {url} answered 502 Bad Gateway: <html>Bad Gateway</html>"


@pytest.mark.parametrize(
    ("content_type", "body", "says"),
    [
        ("text/html", b"<html>hello</html>", "did not answer with JSON"),
        ("application/json", b"[1, 2]", "did not answer with a plan"),
    ],
)
def test_a_server_that_is_not_hyperplace_is_one_line(graph_file, http_server, content_type, body, says):
    url = http_server(200, content_type, body)
    result = _plan(str(graph_file), "--server", url)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"error: the server at {url} {says}")


def test_layout_emits_the_first_layouts_megatron_arguments_alone():
    result = _layout("--seq-length", "4096", "--emit", "megatron")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("--tensor-model-parallel-size ") and "--global-batch-size 1024" in result.stdout


def test_layout_emit_refuses_an_unknown_framework():
    result = _layout("--seq-length", "4096", "--emit", "jax")
    assert result.exit_code == 2 and "--emit must be one of" in _text(result)


def test_layout_shows_the_tokens_each_layout_trains_per_joule(tmp_path):
    out = tmp_path / "layout.json"
    result = _layout("--seq-length", "4096", "--top-k", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    best = json.loads(out.read_text())["candidates"][0]
    assert best["energy_per_step_j"] > 0
    assert "tokens/J" in result.output and f"{best['tokens_per_joule']:.2f}" in result.output
