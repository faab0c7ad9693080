"""The ``hyperplace`` command: serve, migrate, keys, worker, plan, layout."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from service.schemas.common import error_path
from service.settings import Settings, get_settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

# No local variables in tracebacks: they hold API keys, the key-hashing secret and database passwords.
app = typer.Typer(
    help="hyperplace: placement backend for deep-learning compilers.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
keys_app = typer.Typer(
    help="API keys (stored only as HMAC hashes).", no_args_is_help=True, pretty_exceptions_show_locals=False
)
app.add_typer(keys_app, name="keys")


def _settings() -> Settings:
    """The settings, or one line per bad ``HYPERPLACE_*`` variable and exit 2."""
    try:
        return get_settings()
    except ValidationError as exc:
        for error in exc.errors():
            name = "HYPERPLACE_" + "_".join(str(part) for part in error["loc"]).upper()
            message = error["msg"].removeprefix("Value error, ")
            typer.echo(message if message.startswith(name) else f"{name} {message}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def _database(settings: Settings) -> Iterator[Engine]:
    """An engine for the configured database; a database that cannot be opened or reached
    is one line naming it (password hidden) and exit 1, not a driver traceback."""
    from sqlalchemy.exc import OperationalError

    from service.storage.db import make_engine

    engine = make_engine(settings.database_url)
    try:
        yield engine
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        typer.echo(f"cannot use the database at {engine.url.render_as_string(hide_password=True)}: {reason}", err=True)
        raise typer.Exit(1) from None


@app.command()
def migrate() -> None:
    """Apply database migrations up to head (HYPERPLACE_DATABASE_URL)."""
    from service.storage.migrate import current_revision, upgrade_to_head

    with _database(_settings()) as engine:
        upgrade_to_head(engine)
        revision = current_revision(engine)
    typer.echo(f"database at revision {revision} ({engine.url.render_as_string(hide_password=True)})")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (HYPERPLACE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (HYPERPLACE_PORT).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="uvicorn worker processes.")] = 1,
) -> None:
    """Run the HTTP service with uvicorn, with the limits of service/server.py."""
    from service.app import NotMigrated, ensure_migrated
    from service.server import run_server

    settings = _settings()
    with _database(settings) as engine:
        try:
            ensure_migrated(engine, settings)
        except NotMigrated as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
    run_server(settings, host or settings.host, port or settings.port, workers)


@app.command()
def worker() -> None:
    """Run planning jobs from the database until interrupted (any number, on any machine)."""
    from service.domain.jobs import run_worker
    from service.logging import configure_logging
    from service.storage.db import make_session_factory

    settings = _settings()
    configure_logging(settings.log_level, settings.log_json)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with _database(settings) as engine:
        run_worker(make_session_factory(engine), settings, stop)


def _shown_url(url: str) -> str:
    """``url`` as it may be printed: a password in it becomes ``***``."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()
    except ValueError:  # not even a URL: nothing in it can be told apart as a password
        return url


def _one_line(text: str, secret: str | None) -> str:
    """``text`` on one line, with ``secret`` (the API key) never shown."""
    line = " ".join(str(text).split())
    return line.replace(secret, "***") if secret else line


def _problem_text(problem: object) -> str:
    """The title, detail and first few field errors of a problem-details answer."""
    if not isinstance(problem, dict):
        return str(problem)
    text = ": ".join(str(problem[key]) for key in ("title", "detail") if problem.get(key))
    errors = problem.get("errors") if isinstance(problem.get("errors"), list) else []
    named = [
        f"{e.get('field', '?')}: {e.get('message', '')}"
        for e in errors
        if isinstance(e, dict) and str(e.get("message", "")) not in text
    ]  # the detail often says it already
    if named:
        text += f" ({'; '.join(named[:3])}{'; ...' if len(named) > 3 else ''})"
    return text


class _NotAPlan(ValueError):
    """A JSON answer to a plan request that is not a plan."""


@contextmanager
def _talking_to(server: str, api_key: str | None) -> Iterator[None]:
    """Any failure to get an answer from ``server`` as one line naming the server and why,
    not a traceback (whose local variables would show the API key): exit 2 when the
    server refused the request (4xx: fix the request), 1 otherwise."""
    import httpx

    from service.client import ApiError

    shown = _shown_url(server)

    def fail(message: str, code: int = 1) -> typer.Exit:
        typer.echo(_one_line(f"error: {message}", api_key), err=True)
        return typer.Exit(code)

    try:
        yield
    except ApiError as exc:
        raise fail(
            f"the server at {shown} answered {exc.status} {_problem_text(exc.problem)}",
            2 if 400 <= exc.status < 500 else 1,
        ) from None
    except httpx.TimeoutException as exc:
        kind = type(exc).__name__.removesuffix("Timeout").lower() or "read"
        raise fail(f"the server at {shown} did not answer in time ({kind} timeout)") from None
    except httpx.ConnectError as exc:
        reason = str(exc).split("] ", 1)[-1] or "connection failed"  # "[Errno 111] Connection refused"
        raise fail(f"cannot connect to the server at {shown}: {reason.lower()}") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise fail(f"cannot talk to the server at {shown}: {exc or type(exc).__name__}") from None
    except json.JSONDecodeError:  # a 2xx answer that is not JSON
        raise fail(f"the server at {shown} did not answer with JSON: is it a hyperplace service?") from None
    except _NotAPlan as exc:
        raise fail(f"the server at {shown} did not answer with a plan ({exc}): is it a hyperplace service?") from None
    except TimeoutError as exc:  # wait_for_plan gave up polling
        raise fail(f"the server at {shown}: {exc}") from None


def _parse_pairs(pairs: list[str], what: str) -> dict:
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"{what} must look like name=value, got {pair!r}")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"{what} {path} is not JSON ({exc})") from None


def _parse_dims(pairs: list[str]) -> dict[str, int]:
    dims = _parse_pairs(pairs, "--dim")
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise typer.BadParameter(f"--dim {name} must be a positive integer, got {value!r}")
    return dims


def _print_plan(plan: dict, *, to_stderr: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=to_stderr)
    summary = plan["summary"]
    table = Table(title=f"plan {plan.get('id') or '(offline)'}: strategy {plan['strategy']}", show_header=False)
    table.add_row("makespan", f"{summary['makespan_s'] * 1e3:.3f} ms")
    if summary.get("lower_bound_s") and summary.get("optimality_gap") is not None:
        table.add_row(
            "lower bound",
            f"{summary['lower_bound_s'] * 1e3:.3f} ms ({summary['lower_bound_by']}): at most "
            f"{summary['optimality_gap']:.1%} above the best possible",
        )
    if summary.get("one_device_makespan_s") and summary.get("makespan_before_tiers_s"):
        speedup = summary["one_device_makespan_s"] / summary["makespan_before_tiers_s"]
        table.add_row("speed-up over one device", f"{speedup:.2f}x (both in main memory)")
    table.add_row("devices used", str(summary["devices_used"]))
    table.add_row("communication", f"{summary['comm_bytes'] / 1e6:.2f} MB")
    table.add_row("feasible", "yes" if summary["feasible"] else f"no: {summary.get('infeasible_reason')}")
    peak = max(summary["peak_memory_bytes"].values(), default=0.0)
    table.add_row("peak memory (max device)", f"{peak / 1e9:.2f} GB")
    console.print(table)
    candidates = Table(title="candidates")
    for column in ("strategy", "makespan (ms)", "feasible", "devices", "comm (MB)"):
        candidates.add_column(column)
    for c in plan.get("candidates") or []:
        makespan = "-" if c["makespan_s"] is None else f"{c['makespan_s'] * 1e3:.3f}"
        comm = "-" if c["comm_bytes"] is None else f"{c['comm_bytes'] / 1e6:.2f}"
        candidates.add_row(c["strategy"], makespan, "yes" if c["feasible"] else "no", str(c["devices_used"]), comm)
    console.print(candidates)
    for note in plan.get("notes") or []:
        console.print(f"note: {note}", markup=False, highlight=False)


def _plan_offline(model: Path, inventory: dict, options: dict) -> dict:
    from service.domain.ingest import ingest_inventory, ingest_json_graph, ingest_onnx_graph
    from service.domain.planning import compute_plan
    from service.schemas.plans import PlanOptions

    options = PlanOptions.model_validate(options).model_dump()
    settings = _settings()
    if model.suffix == ".json":
        ingested = ingest_json_graph(_read_json(model, "model"), max_ops=settings.max_graph_ops)
    else:
        ingested = ingest_onnx_graph(
            model.read_bytes(),
            dims=options["dims"],
            max_ops=settings.max_graph_ops,
            memory_bytes=settings.onnx_import_memory_bytes,
        )
    inv = ingest_inventory(inventory)
    strategy, summary, body = compute_plan(ingested.as_stored(), inv.inventory, options)
    for internal in ("trace", "view", "start_order"):
        body.pop(internal, None)
    return {
        "id": None,
        "model_hash": ingested.model_hash,
        "inventory_hash": inv.inventory_hash,
        "status": "done",
        "strategy": strategy,
        "summary": summary,
        "options": options,
        "warnings": list(ingested.graph.warnings),
        **body,
    }


@app.command()
def plan(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="An .onnx file or a JSON graph.")],
    preset: Annotated[str, typer.Option(help="Inventory preset, e.g. dgx-h100.")] = "dgx-h100",
    nodes: Annotated[int, typer.Option(min=1, max=4096, help="Nodes of the preset.")] = 1,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="The preset's dtype whose peak times the operators "
            "(default bf16; e.g. tf32 or fp32 for an fp32 export run as exported)."
        ),
    ] = None,
    inventory: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Inventory JSON file (instead of a preset).")
    ] = None,
    option: Annotated[
        list[str], typer.Option("--option", "-o", help="Plan option name=value (repeatable), e.g. -o micro_batches=4.")
    ] = [],  # noqa: B006
    dim: Annotated[
        list[str], typer.Option("--dim", "-d", help="ONNX dimension name=value (repeatable), e.g. -d batch=8.")
    ] = [],  # noqa: B006
    cost_model: Annotated[
        str | None,
        typer.Option(
            "--cost-model",
            help="Cost-model profile: roofline, eager (the default) or cuda-graphs (docs/costmodel.md).",
        ),
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="Service URL; without it, plans in-process with no database.")
    ] = None,
    api_key: Annotated[str | None, typer.Option(envvar="HYPERPLACE_API_KEY", help="API key for --server.")] = None,
    timeout_s: Annotated[
        float, typer.Option(min=0.001, max=86400, help="Seconds to wait for each answer from --server.")
    ] = 300.0,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where to write the plan JSON (default: standard output, with the summary table on standard error)."
        ),
    ] = None,
) -> None:
    """Plan a model: print a summary table and the plan JSON.

    Without --out the plan JSON goes to standard output and the table to standard
    error, so `hyperplace plan model.onnx > plan.json` works and nothing is written
    beside the model.
    """
    inventory_doc = _read_json(inventory, "--inventory") if inventory else {"preset": preset, "nodes": nodes}
    if dtype is not None and not inventory:
        inventory_doc["default_dtype"] = dtype
    options = _parse_pairs(option, "--option")
    if dim:
        options["dims"] = _parse_dims(dim)
    if cost_model is not None:
        options["cost_model"] = cost_model
    if server is None:
        from pydantic import ValidationError

        from partitioners.errors import InvalidInput

        try:
            result = _plan_offline(model, inventory_doc, options)
        except InvalidInput as exc:
            typer.echo(f"error: {exc.detail}", err=True)
            raise typer.Exit(2) from None
        except ValidationError as exc:
            problems = "; ".join(f"{error_path(e['loc'])}: {e['msg']}" for e in exc.errors())
            typer.echo(f"error: bad --option: {problems}", err=True)
            raise typer.Exit(2) from None
    else:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from service.client import HyperplaceClient

        graph = _read_json(model, "model") if model.suffix == ".json" else None
        with _talking_to(server, api_key), HyperplaceClient(server, api_key, timeout_s=timeout_s) as client:
            if graph is not None:
                result = client.submit_plan(graph=graph, inventory=inventory_doc, options=options)
            else:
                result = client.submit_plan(onnx_path=model, inventory=inventory_doc, options=options)
            if not isinstance(result, dict) or "status" not in result:
                raise _NotAPlan("no status")
            if result["status"] not in ("done", "failed"):
                # on standard error: standard output may be carrying the plan JSON
                with Progress(
                    TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=Console(stderr=True)
                ) as progress:
                    task = progress.add_task(f"plan {result['id']} {result['status']}", total=1.0)

                    def report(state: dict) -> None:
                        progress.update(
                            task,
                            completed=state.get("progress", 0.0),
                            description=f"plan {state['id']} {state['status']}",
                        )

                    result = client.wait_for_plan(result["id"], on_progress=report)
        if result["status"] == "failed":
            typer.echo(f"planning failed: {result.get('error')}", err=True)
            raise typer.Exit(1)
    if out is None:
        _print_plan(result, to_stderr=True)
        typer.echo(json.dumps(result, indent=1))
        return
    out.write_text(json.dumps(result, indent=1))
    _print_plan(result)
    typer.echo(f"plan written to {out}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _print_run(result, comparison: dict) -> None:  # RunResult (onnx_runner, imported lazily)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    parts = Table(title="parts (one ONNX Runtime session each, in run order)")
    for column in ("plan device", "runs on", "stage", "operators", "inputs", "outputs"):
        parts.add_column(column)
    for part in result.parts[:20]:
        parts.add_row(
            part.device,
            result.devices[part.device],
            str(part.stage),
            str(len(part.nodes)),
            str(len(part.inputs)),
            str(len(part.outputs)),
        )
    console.print(parts)
    if len(result.parts) > 20:
        console.print(f"... and {len(result.parts) - 20} more parts")
    for name, (max_abs, max_rel) in result.diffs.items():
        console.print(f"output {name}: max abs diff {max_abs:.3g}, max rel diff {max_rel:.3g} (unsplit model)")
    table = Table(title="predicted vs measured")
    for column in ("", "predicted (ms)", "measured (ms)"):
        table.add_column(column)
    table.add_row("step (makespan)", _ms(comparison["predicted_makespan_s"]), _ms(comparison["measured_makespan_s"]))
    table.add_row("unsplit model, one session", "", _ms(comparison["unsplit_step_s"]))
    for device, busy in comparison["busy_s"].items():
        table.add_row(f"busy {device}", _ms(busy["predicted"]), _ms(busy["measured"]))
    for op_class, seconds in comparison["by_class_s"].items():
        table.add_row(f"class {op_class}", _ms(seconds["predicted"]), _ms(seconds["measured"]))
    console.print(table)
    error = comparison["op_median_rel_error"]
    if error is not None:
        console.print(f"median per-operator relative error: {error:.1%} over {comparison['ops_compared']} operators")
    else:
        console.print("per-operator predictions: the plan carries no trace (plan it through --server for them)")
    moved = sum(t["duration_s"] for t in result.transfers) / max(1, len(result.step_wall_s))
    console.print(
        f"transfers: {len(result.transfers) // max(1, len(result.step_wall_s))} per step, {moved * 1e3:.3f} ms"
    )


def _accuracy_line(block: dict | None) -> str:
    if not block:
        return "-"
    return (
        f"median op error {block.get('op_median_rel_error', 0):.1%}, "
        f"makespan predicted {_ms(block.get('predicted_makespan_s'))} ms vs measured "
        f"{_ms(block.get('measured_makespan_s'))} ms (error {block.get('makespan_rel_error', 0):.1%})"
    )


@app.command()
def run(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The .onnx file the plan was made for.")],
    plan: Annotated[str, typer.Option(help="A plan id (with --server) or a plan JSON file.")],
    server: Annotated[str | None, typer.Option(help="Service URL, to fetch the plan and send feedback.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="HYPERPLACE_API_KEY", help="API key for --server.")] = None,
    dims: Annotated[
        list[str],
        typer.Option("--dims", "-d", help="ONNX dimensions, e.g. batch=1,sequence=128 (default: the plan's dims)."),
    ] = [],  # noqa: B006
    inputs: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="An .npz of input arrays (default: generated).")
    ] = None,
    feedback: Annotated[bool, typer.Option(help="Post the measured timeline to the plan's feedback.")] = False,
    map_: Annotated[
        list[str], typer.Option("--map", help="plan_device=cpu:N or cuda:N (repeatable): where a plan device runs.")
    ] = [],  # noqa: B006
    steps: Annotated[int, typer.Option(min=1, max=10_000, help="Measured steps (after the warm-up).")] = 5,
    warmup: Annotated[int, typer.Option(min=0, max=1000, help="Warm-up steps, not measured.")] = 2,
    threads: Annotated[int | None, typer.Option(min=1, help="Intra-op threads per CPU device.")] = None,
    timeout_s: Annotated[float, typer.Option(min=0.001, max=86400, help="Seconds to wait for each answer.")] = 300.0,
) -> None:
    """Run a plan for real with ONNX Runtime: one session per device, outputs checked against
    the unsplit model, measured times next to the plan's predictions (needs hyperplace[run])."""
    try:
        from service.client import onnx_runner
    except ImportError as exc:
        typer.echo(f"error: {exc}; install the runner with: pip install 'hyperplace[run]'", err=True)
        raise typer.Exit(2) from None
    bound = _parse_dims([pair for item in dims for pair in item.split(",") if pair]) if dims else None
    device_map = {str(k): str(v) for k, v in _parse_pairs(map_, "--map").items()}
    plan_path = Path(plan)
    client = None
    if plan_path.suffix == ".json" or plan_path.is_file():
        if not plan_path.is_file():
            typer.echo(f"error: plan file {plan} does not exist", err=True)
            raise typer.Exit(2)
        document = _read_json(plan_path, "--plan")
        trace = None
    elif server is None:
        typer.echo(f"error: --plan {plan} is not a file; a plan id needs --server", err=True)
        raise typer.Exit(2)
    else:
        from service.client import HyperplaceClient

        client = HyperplaceClient(server, api_key, timeout_s=timeout_s)
        with _talking_to(server, api_key):
            document = client.get_plan(plan)
            trace = client.trace(plan) if document.get("status") == "done" else None
    if not isinstance(document, dict) or document.get("status", "done") != "done":
        status = document.get("status") if isinstance(document, dict) else "not a plan"
        typer.echo(f"error: the plan is {status}, not done", err=True)
        raise typer.Exit(2)
    feeds = None
    if inputs is not None:
        import numpy as np

        with np.load(inputs) as archive:
            feeds = {name: archive[name] for name in archive.files}
    try:
        prepared, result = onnx_runner.run_plan(
            model.read_bytes(),
            document,
            dims=bound,
            inputs=feeds,
            device_map=device_map,
            steps=steps,
            warmup=warmup,
            threads_per_device=threads,
        )
    except onnx_runner.RunError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    _print_run(result, onnx_runner.compare_with_plan(prepared, document, result, trace))
    if not feedback:
        return
    if client is None or server is None or not document.get("id"):
        typer.echo("error: --feedback needs a plan stored on a server: --plan PLAN_ID --server URL", err=True)
        raise typer.Exit(2)
    with _talking_to(server, api_key):
        answer = client.post_feedback(
            document["id"],
            {"format": "simple", "match": "name", "timeline": result.timeline(), "hardware_notes": "hyperplace run"},
        )
        accuracy = client.accuracy(document["id"])
    match = answer.get("match") or {}
    typer.echo(
        f"feedback {answer.get('id')}: {match.get('ops_matched')} of {match.get('ops_total')} operators matched; "
        f"calibration version {(accuracy.get('calibration') or {}).get('version')}"
    )
    typer.echo(f"before calibration: {_accuracy_line(accuracy.get('before'))}")
    typer.echo(f"after calibration:  {_accuracy_line(accuracy.get('after'))}")
    typer.echo(f"re-plan with the calibration: POST {server.rstrip('/')}/v1/plans/{document['id']}/replan")


def _layout_model(document: object, seq_length: int | None) -> dict:
    """The request's ``model``: a Hugging Face config.json, or the planner's shape fields."""
    if not isinstance(document, dict):
        raise typer.BadParameter("the model file must hold a JSON object")
    if "model_type" in document or "text_config" in document:
        if seq_length is None:
            raise typer.BadParameter(
                "--seq-length is required with a Hugging Face config: the length the run "
                "trains at (max_position_embeddings is only the longest the model supports)"
            )
        return {"huggingface_config": document, "seq_length": seq_length}
    return document if seq_length is None else {**document, "seq_length": seq_length}


def _mesh(layout: dict) -> str:
    """``tp4 pp8 dp2``, with cp and ep only where they split anything, and ``etp1`` where experts are folded."""
    shown = [f"{name}{layout[name]}" for name in ("tp", "pp", "cp", "ep") if name in ("tp", "pp") or layout[name] > 1]
    if layout.get("etp", layout["tp"]) < layout["tp"]:
        shown.append(f"etp{layout['etp']}")
    return " ".join([*shown, f"dp{layout['dp']}"])


def _print_layouts(answer: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        # piped or captured: no terminal width to fit, so do not cut the table's cells short
        console = Console(width=120)
    evaluated = answer["mode"] == "evaluate"
    rows = answer["predictions"] if evaluated else answer["candidates"]
    capacity = rows[0]["memory_per_gpu"]["capacity_bytes"] / 2**30 if rows else 0.0
    scale = (
        f"{answer['model']['num_layers']}-layer model"
        if evaluated
        else f"{answer['num_gpus']} GPUs, {answer['model_parameters'] / 1e9:.1f}B parameters"
    )
    what = "the layouts asked for" if evaluated else "fastest predicted layouts"
    table = Table(title=f"{scale}: {what} (memory of {capacity:.1f} GiB)")
    for column in ("layout", "v", "mbs", "ZeRO", "recompute", "step s", "MFU", "tokens/J", "GiB"):
        table.add_column(column, no_wrap=True)
    for c in rows:
        memory = c["memory_per_gpu"]
        tight = any(note.startswith("tight memory") for note in c["notes"])
        verdict = " OOM" if memory["total_bytes"] > memory["capacity_bytes"] else " tight" if tight else ""
        table.add_row(
            _mesh(c),
            str(c["virtual_stages"]),
            str(c["micro_batch_size"]),
            str(c["zero_stage"]),
            c["recompute"],
            f"{c['step_time_s']:.3f}",
            f"{c['mfu']:.3f}",
            "-" if c["tokens_per_joule"] is None else f"{c['tokens_per_joule']:.2f}",
            f"{memory['total_bytes'] / 2**30:.1f}{verdict}",
        )
    console.print(table)
    for c in rows:
        for reason in c["reasons"]:
            console.print(f"{_mesh(c)} cannot run: {reason}")
    # what the first layout's prediction assumed or warns of (ties, uneven stages, tight
    # memory, MoE uncertainty); the others' are in --out
    for note in rows[0]["notes"] if rows else ():
        console.print(f"{_mesh(rows[0])}: {note}")
    for note in answer.get("notes", ()):
        console.print(f"note: {note}")
    # the stack the predictions assumed (pipeline schedule, dispatcher, overlaps; sources in --out)
    assumed = answer.get("assumptions", ())
    if assumed:
        console.print("assumed: " + "; ".join(f"{term['name']}: {term['value']}" for term in assumed))


def _emit_launch(answer: dict, framework: str) -> None:
    """Print the first layout's launch config for ``framework`` alone (so it can be piped), notes on stderr."""
    rows = answer["predictions"] if answer["mode"] == "evaluate" else answer["candidates"]
    known = sorted(rows[0]["launch"]) if rows else ["deepspeed", "megatron", "torchtitan"]
    if framework not in known:
        typer.echo(f"error: --emit must be one of {known}, got {framework!r}", err=True)
        raise typer.Exit(2)
    if not rows:
        typer.echo("error: no layout can run; nothing to emit", err=True)
        raise typer.Exit(1)
    config = rows[0]["launch"][framework]
    if config["config"] is None:
        typer.echo(f"{_mesh(rows[0])}: {framework} cannot run this layout: {config['unavailable']}", err=True)
        raise typer.Exit(1)
    typer.echo(config["config"].rstrip("\n"))
    for note in config["notes"]:
        typer.echo(f"note: {note}", err=True)


@app.command()
def layout(
    model: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="A Hugging Face config.json, or a JSON "
            "object of the planner's model fields (num_layers, hidden_size, ...).",
        ),
    ],
    batch: Annotated[int, typer.Option(min=1, help="Global batch in sequences per optimizer step.")],
    seq_length: Annotated[
        int | None, typer.Option(min=1, help="Training sequence length (required with a Hugging Face config).")
    ] = None,
    preset: Annotated[
        str, typer.Option(help="Node preset, e.g. dgx-h100, dgx-a100, dgx-b200, gb200-nvl72 (a 72-GPU NVLink rack).")
    ] = "dgx-h100",
    nodes: Annotated[int, typer.Option(min=1, help="Nodes of the preset.")] = 1,
    precision: Annotated[str, typer.Option(help="bf16, fp16 or fp8.")] = "bf16",
    training: Annotated[
        list[str],
        typer.Option(
            "--training", "-t", help="Training field name=value (repeatable), e.g. -t software=megatron-lm-2021."
        ),
    ] = [],  # noqa: B006
    constraint: Annotated[
        list[str],
        typer.Option("--constraint", "-c", help="Constraint name=value (repeatable), e.g. -c tp=8 -c zero_stages=[1]."),
    ] = [],  # noqa: B006
    top_k: Annotated[int, typer.Option(min=1, max=100, help="How many (tp, pp) splits to list.")] = 5,
    evaluate: Annotated[
        list[str],
        typer.Option(
            "--evaluate",
            "-e",
            help="Predict this layout instead of searching, "
            "as comma-separated name=value pairs (repeatable), e.g. "
            "-e tp=8,pp=16.",
        ),
    ] = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option(help="Also write the whole answer (rank map included) as JSON.")] = None,
    emit: Annotated[
        str | None,
        typer.Option(
            help="Print only the first layout's launch config for megatron (arguments), torchtitan (TOML) "
            "or deepspeed (JSON), its notes on stderr; exit 1 where that framework cannot run the layout."
        ),
    ] = None,
) -> None:
    """Rank dp x tp x pp (x cp x ep) layouts for training a transformer, in-process (POST /v1/parallel/plan)."""
    from partitioners.errors import InvalidInput
    from service.domain.parallel import parallel_plan
    from service.schemas.parallel import ParallelPlanRequest

    body = {
        "model": _layout_model(_read_json(model, "model"), seq_length),
        "cluster": {"preset": preset, "nodes": nodes},
        "training": {"global_batch_sequences": batch, "precision": precision, **_parse_pairs(training, "--training")},
        "constraints": _parse_pairs(constraint, "--constraint") or None,
        "top_k": top_k,
    }
    if evaluate:
        body["evaluate"] = [
            _parse_pairs([pair for pair in layout_text.split(",") if pair], "--evaluate") for layout_text in evaluate
        ]
    try:
        answer = parallel_plan(ParallelPlanRequest.model_validate(body))
    except ValidationError as exc:
        problems = "; ".join(f"{error_path(e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        typer.echo(f"error: {problems}", err=True)
        raise typer.Exit(2) from None
    except InvalidInput as exc:
        typer.echo(f"error: {exc.detail}", err=True)
        raise typer.Exit(2) from None
    if out is not None:
        out.write_text(json.dumps(answer, indent=1))
    if emit is not None:
        _emit_launch(answer, emit)
        return
    _print_layouts(answer)
    if out is not None:
        typer.echo(f"answer written to {out}")


def _tenant_name(name: str) -> str:
    """A tenant name must name something: an empty or blank one would be a tenant nobody can tell apart."""
    if not name.strip():
        raise typer.BadParameter("must name a tenant, not be empty or only spaces")
    return name


def _scope_names(text: str) -> str:
    """The scopes of a new key, space-separated: at least one, each a known one (a key with none
    can do nothing), each once; commas are read as spaces."""
    from service.storage.tenants import ALL_SCOPES

    names = tuple(dict.fromkeys(name for name in text.replace(",", " ").split()))
    allowed = ", ".join(ALL_SCOPES)
    if not names:
        raise typer.BadParameter(f"must name at least one scope; allowed: {allowed}")
    unknown = [name for name in names if name not in ALL_SCOPES]
    if unknown:
        raise typer.BadParameter(f"unknown scope(s) {', '.join(map(repr, unknown))}; allowed: {allowed}")
    return " ".join(names)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant name; created if new.", callback=_tenant_name)],
    scopes: Annotated[
        str, typer.Option(help="Space-separated, at least one of: read write moe.", callback=_scope_names)
    ] = "read write moe",
    name: Annotated[str, typer.Option(help="A label for the key.")] = "",
) -> None:
    """Create an API key for a tenant and print it (it is shown only once)."""
    from service.storage.db import make_session_factory
    from service.storage.tenants import get_or_create_tenant, issue_api_key

    settings = _settings()
    with _database(settings) as engine, make_session_factory(engine)() as session, session.begin():
        try:
            issued = issue_api_key(
                session,
                get_or_create_tenant(session, tenant),
                settings.api_key_secret,
                scopes=tuple(scopes.split()),
                name=name,
            )
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
    typer.echo(issued.api_key)
    typer.echo(f"key id {issued.key_id}, tenant {tenant}, scopes {' '.join(issued.scopes)}", err=True)


@keys_app.command("list")
def keys_list(tenant: Annotated[str, typer.Option(help="Tenant name.")]) -> None:
    """List a tenant's keys (ids, prefixes, scopes; never the keys)."""
    from service.storage.db import make_session_factory
    from service.storage.tenants import get_tenant_by_name, list_api_keys

    with _database(_settings()) as engine, make_session_factory(engine)() as session, session.begin():
        found = get_tenant_by_name(session, tenant)
        if found is None:  # listing must not create the tenant it looks for
            typer.echo(f"no tenant named {tenant}", err=True)
            raise typer.Exit(1)
        for row in list_api_keys(session, found):
            state = "revoked" if row.revoked_at else "active"
            typer.echo(f"{row.id}  hp_{row.prefix}_...  {row.scopes}  {state}  {row.name}")


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="Key id from `keys list`.")]) -> None:
    """Revoke a key: requests with it get 401 from now on."""
    from service.storage.db import make_session_factory
    from service.storage.tenants import revoke_api_key

    with _database(_settings()) as engine, make_session_factory(engine)() as session, session.begin():
        if not revoke_api_key(session, key_id):
            typer.echo(f"no key with id {key_id}", err=True)
            raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


if __name__ == "__main__":
    app()
