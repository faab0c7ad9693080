"""The ``hyperplace`` command: serve, migrate, keys, worker, plan."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from service.settings import get_settings

app = typer.Typer(help="hyperplace: placement backend for deep-learning compilers.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys (stored only as HMAC hashes).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@app.command()
def migrate() -> None:
    """Apply database migrations up to head (HYPERPLACE_DATABASE_URL)."""
    from service.storage.db import make_engine
    from service.storage.migrate import current_revision, upgrade_to_head

    settings = get_settings()
    engine = make_engine(settings.database_url)
    upgrade_to_head(engine)
    typer.echo(f"database at revision {current_revision(engine)} ({engine.url.render_as_string(hide_password=True)})")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (HYPERPLACE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (HYPERPLACE_PORT).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="uvicorn worker processes.")] = 1,
) -> None:
    """Run the HTTP service with uvicorn."""
    import uvicorn

    from service.app import NotMigrated, ensure_migrated
    from service.storage.db import make_engine

    settings = get_settings()
    try:
        ensure_migrated(make_engine(settings.database_url), settings)
    except NotMigrated as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        workers=workers,
        log_config=None,
        proxy_headers=False,
    )


@app.command()
def worker() -> None:
    """Run planning jobs from the database until interrupted (any number, on any machine)."""
    from service.domain.jobs import run_worker
    from service.logging import configure_logging
    from service.storage.db import make_engine, make_session_factory

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_json)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_worker(make_session_factory(make_engine(settings.database_url)), settings, stop)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant name; created if new.")],
    scopes: Annotated[str, typer.Option(help="Space-separated: read write moe.")] = "read write moe",
    name: Annotated[str, typer.Option(help="A label for the key.")] = "",
) -> None:
    """Create an API key for a tenant and print it (it is shown only once)."""
    from service.storage.db import make_engine, make_session_factory
    from service.storage.tenants import get_or_create_tenant, issue_api_key

    settings = get_settings()
    factory = make_session_factory(make_engine(settings.database_url))
    with factory() as session, session.begin():
        try:
            issued = issue_api_key(session, get_or_create_tenant(session, tenant), settings.api_key_secret, scopes=tuple(scopes.split()), name=name)
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
    typer.echo(issued.api_key)
    typer.echo(f"key id {issued.key_id}, tenant {tenant}, scopes {' '.join(issued.scopes)}", err=True)


@keys_app.command("list")
def keys_list(tenant: Annotated[str, typer.Option(help="Tenant name.")]) -> None:
    """List a tenant's keys (ids, prefixes, scopes; never the keys)."""
    from service.storage.db import make_engine, make_session_factory
    from service.storage.tenants import get_or_create_tenant, list_api_keys

    factory = make_session_factory(make_engine(get_settings().database_url))
    with factory() as session, session.begin():
        for row in list_api_keys(session, get_or_create_tenant(session, tenant)):
            state = "revoked" if row.revoked_at else "active"
            typer.echo(f"{row.id}  hp_{row.prefix}_...  {row.scopes}  {state}  {row.name}")


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="Key id from `keys list`.")]) -> None:
    """Revoke a key: requests with it get 401 from now on."""
    from service.storage.db import make_engine, make_session_factory
    from service.storage.tenants import revoke_api_key

    factory = make_session_factory(make_engine(get_settings().database_url))
    with factory() as session, session.begin():
        if not revoke_api_key(session, key_id):
            typer.echo(f"no key with id {key_id}", err=True)
            raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


if __name__ == "__main__":
    app()
