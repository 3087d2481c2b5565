"""The job queue's commands: ``enqueue``, ``drain``, ``worker``.

``drain`` and ``worker`` are ``cronlock.serve_drain`` and ``cronlock.serve_worker`` with the
signals handled; their options' defaults are the library's (``App.drainer``'s, the service's).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, NoReturn

import click

from .. import schema
from ..observe.stats import DrainStats
from ..outage import Reconnect
from ..outcome import DrainResult, RunStatus
from ..queue.drainer import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_POLL_INTERVAL,
    CommitMode,
    Drainer,
    DrainOptions,
)
from ..queue.jobs import Enqueued
from ..queue.workers import HEARTBEAT_FILE_ENV
from ..service import DEFAULT_GRACE_PERIOD, serve_drain, serve_worker
from ..sql.tables import DEFAULT_QUEUE
from . import render
from .context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGNAL_BASE,
    Options,
    UsageFailure,
    emit,
    exit_code,
    exit_with,
    give_up_option,
    moment,
    pass_options,
    run,
    run_ready,
)
from .startup import StartUp

__all__ = ["drain", "drain_queue", "enqueue", "worker"]

logger = logging.getLogger("cronlock.cli")


@click.command()
@click.argument("job_type")
@click.argument("payload", required=False)
@click.option(
    "--max-retries", type=int, help="Retries after a failed attempt (default: the handler's)."
)
@click.option("--delay", type=float, help="Seconds from now before the job is due.")
@click.option("--run-at", help="When the job is due (ISO 8601 with a timezone).")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--queue", help="Queue name (default: the handler's).")
@click.option("--dedup-key", help="No new job while one with this key is waiting.")
@click.option(
    "--concurrency-key",
    help="At most --concurrency-limit jobs with this key run at once, across every worker.",
)
@click.option(
    "--concurrency-limit",
    type=int,
    help="Jobs with the --concurrency-key that may run at once (default: the type's, else 1).",
)
@click.option(
    "--timeout",
    type=float,
    help="Seconds a run may take before it is a failed attempt (default: the job type's).",
)
@click.option(
    "--allow-unknown",
    is_flag=True,
    help="Enqueue a job type the app neither handles nor declares (a drainer must know it).",
)
@click.option(
    "--depends-on",
    "depends_on",
    multiple=True,
    metavar="ID",
    help="A job that must complete first (repeat for more); the job waits blocked until then.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_options
def enqueue(
    options: Options,
    job_type: str,
    payload: str | None,
    max_retries: int | None,
    delay: float | None,
    run_at: str | None,
    priority: int,
    queue: str | None,
    dedup_key: str | None,
    concurrency_key: str | None,
    concurrency_limit: int | None,
    timeout: float | None,
    allow_unknown: bool,
    depends_on: tuple[str, ...],
    as_json: bool,
) -> None:
    """Add a job of JOB_TYPE (PAYLOAD is JSON, default null); prints its id."""
    from ..queue.enqueue import prepare
    from ..queue.jobs import handler_for, parse_json

    app = options.load_app()
    # Everything is checked before any connection is made: bad input writes nothing.
    handler_for(app.job_types, job_type, allow_unknown=allow_unknown)
    if not app.knows(job_type):
        click.echo(
            render.warning(
                f"job type {job_type!r} has no handler or declaration in this app: only a "
                "drainer whose app registers its handler runs it"
            ),
            err=True,
        )
    value = None if payload is None else parse_json(payload, "PAYLOAD")
    # The options enqueue and prepare (its checks) take alike.
    given: dict[str, Any] = {
        "max_retries": max_retries,
        "delay": delay,
        "run_at": moment("--run-at", run_at),
        "priority": priority,
        "queue": queue,
        "concurrency_limit": concurrency_limit,
        "timeout": timeout,
        "allow_unknown": allow_unknown,
        "depends_on": list(depends_on) or None,
    }
    # Every check of the enqueue's, the payload's model included, before connecting.
    prepare(
        app.job_types,
        job_type,
        [value],
        dedup_keys=None if dedup_key is None else [dedup_key],
        concurrency_keys=None if concurrency_key is None else [concurrency_key],
        **given,
    )
    options.database(app)
    answer: Enqueued = run_ready(
        app,
        lambda: app.enqueue(
            job_type, value, dedup_key=dedup_key, concurrency_key=concurrency_key, **given
        ),
    )
    emit(as_json, {"job_type": job_type, **answer.to_dict()}, render.enqueued(answer, dedup_key))


def _drainer_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The drainer's options, given to ``command`` as one ``drain_options`` (a
    ``DrainOptions``), and ``--grace-period``."""

    @functools.wraps(command)
    def given(
        *args: Any,
        queue: str,
        commit_mode: str,
        batch_size: int | None,
        concurrency: int,
        threads: int | None,
        shared: bool,
        **rest: Any,
    ) -> Any:
        chosen = DrainOptions(
            queue=queue,
            commit_mode=commit_mode,
            batch_size=batch_size,
            concurrency=concurrency,
            threads=threads,
            shared=shared,
        )
        return command(*args, drain_options=chosen, **rest)

    decorated: Callable[..., Any] = given
    for option in reversed(
        [
            click.option(
                "--queue", default=DEFAULT_QUEUE, show_default=True, help="Queue to drain."
            ),
            click.option(
                "--commit-mode",
                type=click.Choice([mode.value for mode in CommitMode]),
                default=CommitMode.STRICT.value,
                show_default=True,
                help="strict: a transaction per job; batch: one per batch (faster, "
                "a crash rolls back the batch); lease: the claim commits and handlers run "
                "outside any transaction (long jobs).",
            ),
            click.option(
                "--batch-size",
                type=click.IntRange(1, 10_000),
                help=f"Jobs per claim in batch mode (default {DEFAULT_BATCH_SIZE}) and in "
                "lease mode (default 1).",
            ),
            click.option(
                "--concurrency",
                type=click.IntRange(1, 64),
                default=1,
                show_default=True,
                help="Jobs run at once, each on its own connection (for IO-bound handlers).",
            ),
            click.option(
                "--threads",
                type=click.IntRange(1, 256),
                help="Plain def handlers run at once, in a thread pool (default: --concurrency).",
            ),
            click.option(
                "--shared",
                is_flag=True,
                help="One of any number of active drainers of the queue, on any hosts "
                "(default: exclusive, one active and standbys; the two kinds never meet: "
                "exit 2).",
            ),
            click.option(
                "--grace-period",
                type=click.FloatRange(0),
                default=DEFAULT_GRACE_PERIOD,
                show_default=True,
                help="Seconds jobs in flight get to finish after SIGTERM/SIGINT.",
            ),
        ]
    ):
        decorated = option(decorated)
    return decorated


def _not_started(queue: str, startup: StartUp) -> DrainResult:
    """The result of a drainer stopped by a signal before it served: nothing claimed."""
    received = startup.received.name if startup.received else "a signal"
    return DrainResult(
        queue=queue,
        status=RunStatus.SKIPPED,
        stats=DrainStats().report(),
        skip_reason=f"stopped by {received} during start-up, before claiming anything",
    )


class _Signals:
    """What ``drain`` and ``worker`` say at each signal (what they wait for, that a second
    signal aborts), and the first signal that came."""

    def __init__(self, command: str, grace_period: float) -> None:
        self.command = command
        self.grace_period = grace_period
        self.drainer: Drainer | None = None
        self.received: signal.Signals | None = None

    def __call__(self, signum: signal.Signals, aborts: bool) -> None:
        if self.received is None:
            self.received = signum
        in_flight = self.drainer.in_flight if self.drainer is not None else 0
        line = render.signal_received(
            self.command, signum, aborts=aborts, in_flight=in_flight, grace=self.grace_period
        )
        logger.warning(line, extra={"action": "signal_received", "state": signum.name})


def drain_queue(
    options: Options,
    drain_options: DrainOptions,
    *,
    max_seconds: float | None,
    grace_period: float,
    as_json: bool,
    skipped_exit_code: int,
) -> NoReturn:
    """``cronlock drain`` (and ``cronlock run drain``): drain once, print, exit.

    A drain stopped by a signal says ``interrupted`` and exits 128 + the signal's number (130
    for Ctrl-C, 143 for SIGTERM), as a shell reports a command a signal ended: what it
    committed stays committed, but the queue was not drained."""
    with StartUp().guarded() as startup:
        app = options.load_app()
        database = options.database(app)
        signals = _Signals("drain", grace_period)

        async def start() -> Drainer:
            await schema.ensure_ready(database)
            return app.drainer(drain_options)

        async def go() -> DrainResult:
            signals.drainer = await startup.run(start())
            if signals.drainer is None:
                return _not_started(drain_options.queue, startup)
            return await serve_drain(
                signals.drainer,
                max_seconds=max_seconds,
                grace_period=grace_period,
                handle_signals=True,
                on_signal=signals,
            )

        result = run(go, app)
    signals.received = signals.received or startup.received
    interrupted = signals.received
    report = result.to_dict()
    if interrupted is not None:
        report["interrupted"] = interrupted.name
    emit(as_json, report, *render.describe_drain(result, interrupted))
    if interrupted is not None and result.status is not RunStatus.FAILED:
        exit_with(EXIT_SIGNAL_BASE + interrupted)
    exit_with(exit_code(result, skipped_exit_code))


@click.command()
@click.option(
    "--max-seconds",
    type=click.FloatRange(0, min_open=True),
    help="Stop claiming after this many seconds (cron-friendly: 55 for every minute).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--skipped-exit-code",
    type=click.IntRange(0, 255),
    default=EXIT_OK,
    show_default=True,
    help="Exit code when another drainer is active or the queue is paused.",
)
@_drainer_options
@pass_options
def drain(
    options: Options,
    max_seconds: float | None,
    as_json: bool,
    skipped_exit_code: int,
    drain_options: DrainOptions,
    grace_period: float,
) -> None:
    """Process due jobs until none is due or S seconds passed; skip if another (exclusive)
    drainer is active or the queue is paused (skipped: exit 0, or --skipped-exit-code). Exit 0
    all went well, 3 some attempts failed, 1 the drainer failed,
    2 exclusive and shared drainers met on the queue, 130/143 interrupted by SIGINT/SIGTERM (a
    second signal aborts the jobs in flight)."""
    drain_queue(
        options,
        drain_options,
        max_seconds=max_seconds,
        grace_period=grace_period,
        as_json=as_json,
        skipped_exit_code=skipped_exit_code,
    )


def _metrics_server() -> Any:
    try:
        from ..observe.prometheus import serve_metrics
    except ImportError:
        raise UsageFailure(
            "--metrics-port needs the 'metrics' extra: pip install 'cronlock[metrics]'"
        ) from None
    return serve_metrics


@click.command()
@_drainer_options
@click.option(
    "--poll-interval",
    type=click.FloatRange(0.01),
    default=DEFAULT_POLL_INTERVAL,
    show_default=True,
    help="Seconds between checks when no notification comes (LISTEN/NOTIFY wakes it at once).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics on GET /metrics at this port.",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
)
@click.option("--json", "as_json", is_flag=True, help="Print its stats as one JSON object.")
@click.option(
    "--heartbeat-file",
    type=click.Path(dir_okay=False),
    envvar="CRONLOCK_HEARTBEAT_FILE",
    help="Touch this file at every heartbeat (2 s), for a liveness probe on its age.",
)
@give_up_option
@pass_options
def worker(
    options: Options,
    drain_options: DrainOptions,
    grace_period: float,
    poll_interval: float,
    metrics_port: int | None,
    metrics_host: str,
    as_json: bool,
    heartbeat_file: str | None,
    give_up_after: float | None,
) -> None:
    """Long-running drainer: stands by while another is active, takes over when it stops or
    dies (with --shared: active beside the queue's other shared drainers at once).
    SIGTERM/SIGINT stop it gracefully; it prints its result line on exit, as drain does
    (--json: its stats as one JSON object). A database restart or outage is ridden out
    (reconnecting with backoff; --give-up-after S: exit 1 after S seconds without it). Exit 2
    when exclusive and shared drainers meet on the queue."""
    if heartbeat_file:
        # Read by each drainer's heartbeat (queue/workers.py), active or standing by.
        os.environ[HEARTBEAT_FILE_ENV] = heartbeat_file
    with StartUp().guarded() as startup:
        app = options.load_app()
        serve_metrics = _metrics_server() if metrics_port else None
        database = options.database(app)
        signals = _Signals("worker", grace_period)

        async def start() -> Drainer:
            await schema.ensure_ready(database)
            if serve_metrics is not None:
                await serve_metrics(database, metrics_host, metrics_port, app.tasks.values())
            drainer = app.drainer(drain_options, poll_interval=poll_interval)
            logger.info(
                render.worker_started(drainer, database),
                extra={"action": "worker_started", "queue": drainer.queue},
            )
            return drainer

        async def go() -> DrainResult:
            signals.drainer = await startup.run(start())
            if signals.drainer is None:
                return _not_started(drain_options.queue, startup)
            return await serve_worker(
                signals.drainer,
                grace_period=grace_period,
                reconnect=Reconnect(give_up_after=give_up_after),
                handle_signals=True,
                on_signal=signals,
            )

        result = run(go, app)
    emit(as_json, result.to_dict(), *render.describe_drain(result, command="worker"))
    exit_with(EXIT_FAILED if result.status is RunStatus.FAILED else EXIT_OK)
