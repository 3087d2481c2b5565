"""``cronlock serve``: the HTTP API (``cronlock.http``) on uvicorn, from the 'http' extra."""

from __future__ import annotations

import logging
import signal

import click

from .. import schema
from . import render
from .context import Options, UsageFailure, pass_options, run

__all__ = ["serve"]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--public",
    metavar="SURFACES",
    help="What answers without a token: any of reads, metrics, healthz, comma-separated, or "
    "none (env CRONLOCK_API_PUBLIC; default: healthz).",
)
@click.option(
    "--insecure-open",
    is_flag=True,
    help="With no token, listen on a non-loopback --host anyway: anyone who can reach it may "
    "enqueue jobs and read them.",
)
@pass_options
def serve(options: Options, host: str, port: int, public: str | None, insecure_open: bool) -> None:
    """The HTTP API (POST /jobs, GET /jobs/{id}, /runs, /healthz, /metrics) and the
    dashboard (/dashboard/) on uvicorn.

    Every endpoint but /healthz needs $CRONLOCK_API_TOKEN as a bearer token
    ($CRONLOCK_API_READ_TOKEN for all but writes). With neither set, everything is open, and
    only a loopback --host is allowed unless --insecure-open."""
    try:
        import uvicorn

        from ..http import TOKEN_ENV, Access, create_api, is_loopback
    except ImportError:
        raise UsageFailure(
            "`cronlock serve` needs the 'http' extra: pip install 'cronlock[http]'"
        ) from None
    access = Access.configure(public=public)
    if access.open and not is_loopback(host) and not insecure_open:
        raise UsageFailure(
            f"refusing to listen on {host} with no API token: anyone who can reach it could "
            f"enqueue jobs and read them; set {TOKEN_ENV} (or pass --insecure-open)"
        )
    app = options.load_app()
    database = options.database(app)
    # As worker and scheduler do: a database that is not migrated is one line and exit 2 now,
    # not a 503 for every request later.
    run(lambda: schema.ensure_ready(database), database)
    api = create_api(app, public=public)
    if access.open:
        note = render.open_api(host, port, loopback=is_loopback(host), token_env=TOKEN_ENV)
        click.echo(note, err=True)
    # uvicorn runs its own loop and its own graceful shutdown on SIGTERM/SIGINT; once done it
    # raises the signal again for the handler it found. Found ours, the stop is a success and
    # the exit code 0, as `cronlock worker` and `cronlock scheduler` exit.
    stopped: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: stopped.append(signum))
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    uvicorn_logger = logging.getLogger("uvicorn")
    if uvicorn_logger.getEffectiveLevel() > logging.INFO:
        uvicorn_logger.setLevel(logging.INFO)  # its start, stop and access lines
    logging.getLogger("cronlock.cli").info(
        render.serve_started(host, port, database), extra={"action": "serve_started"}
    )
    try:
        # uvicorn's own lines go through the logging configured here (cronlock.logs), not
        # its own handlers and format.
        uvicorn.run(api, host=host, port=port, log_level="info", log_config=None)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
