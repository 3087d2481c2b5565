"""The ``cronlock`` command line (click). ``asyncio.run`` lives here and nowhere else.

Exit codes (DESIGN.md): 0 completed or skipped, 1 the run failed and rolled back, 2 usage or
configuration error (one line on stderr, never a traceback), 3 partial.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

import click
from sqlalchemy.exc import DBAPIError

from . import embedded, schema
from .app import App
from .database import Database
from .errors import CronlockError, DatabaseUnavailable, InvalidJobOption
from .loader import load_app
from .outcome import DrainResult, RunResult, RunStatus
from .queue.drainer import DEFAULT_BATCH_SIZE, DEFAULT_POLL_INTERVAL, CommitMode
from .queue.jobs import Enqueued
from .scheduler import DEFAULT_SHUTDOWN_GRACE, Scheduler
from .service import DEFAULT_GRACE_PERIOD, serve_drain, serve_scheduler, serve_worker
from .sql.tables import DEFAULT_QUEUE

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "cli", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3

T = TypeVar("T")


class UsageFailure(click.ClickException):
    exit_code = EXIT_USAGE


@dataclass
class Options:
    app_spec: str
    app_given: bool
    database_url: str | None
    schema: str | None
    pgbouncer: bool

    def load_app(self) -> App:
        return load_app(self.app_spec)

    def database(self, app: App | None = None) -> Database:
        url = self.database_url or (app.database_url if app else None)
        if url is None:
            server = embedded.start()
            url = server.url
            click.echo(
                server.created_line()
                if server.created
                else f"cronlock: using the embedded PostgreSQL in {server.directory} "
                "(set CRONLOCK_DATABASE_URL to use your own)",
                err=True,
            )
        if app is not None:
            return app.use_database(url, schema=self.schema, pgbouncer=self.pgbouncer)
        return Database(url, schema=self.schema or "cronlock", pgbouncer=self.pgbouncer)


class CronlockGroup(click.Group):
    """Turns cronlock's errors into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CronlockError as exc:
            raise UsageFailure(str(exc)) from None
        except BrokenPipeError:  # stdout closed early (`| head`): nothing left to say
            sys.stderr.close()
            sys.exit(EXIT_OK)
        except (OSError, DBAPIError, TimeoutError) as exc:
            original = getattr(exc, "orig", None) or exc
            raise UsageFailure(f"database error: {type(original).__name__}: {original}") from None


def _run(coro_fn: Callable[[], Awaitable[T]], *closing: App | Database) -> T:
    async def main() -> T:
        try:
            return await coro_fn()
        finally:
            for item in closing:
                await (item.aclose() if isinstance(item, App) else item.dispose())

    return asyncio.run(main())


def _exit(code: int) -> NoReturn:
    sys.exit(code)


@click.group(cls=CronlockGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--app",
    "app_spec",
    envvar="CRONLOCK_APP",
    default=None,
    help="MODULE[:ATTR] holding the cronlock App (env CRONLOCK_APP; default: tasks).",
)
@click.option(
    "--database-url",
    envvar="CRONLOCK_DATABASE_URL",
    help="postgresql://… (env CRONLOCK_DATABASE_URL; default: the embedded PostgreSQL).",
)
@click.option("--schema", envvar="CRONLOCK_SCHEMA", help="PostgreSQL schema for cronlock's tables.")
@click.option(
    "--pgbouncer",
    envvar="CRONLOCK_PGBOUNCER",
    is_flag=True,
    help="The URL is a PgBouncer in transaction mode (env CRONLOCK_PGBOUNCER=1).",
)
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
@click.version_option(package_name="cronlock")
@click.pass_context
def cli(
    ctx: click.Context,
    app_spec: str | None,
    database_url: str | None,
    schema: str | None,
    pgbouncer: bool,
    verbose: int,
) -> None:
    """Periodic tasks and a job queue that need nothing but PostgreSQL."""
    logging.basicConfig(
        level=max(logging.WARNING - 10 * verbose, logging.DEBUG),
        format="cronlock: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    ctx.obj = Options(
        app_spec=app_spec or "tasks",
        app_given=app_spec is not None,
        database_url=database_url,
        schema=schema,
        pgbouncer=pgbouncer,
    )


pass_options = click.make_pass_decorator(Options)


@cli.command()
@pass_options
def migrate(options: Options) -> None:
    """Create or upgrade cronlock's schema (idempotent)."""
    app = options.load_app() if options.app_given else None
    database = options.database(app)
    try:
        _run(lambda: schema.upgrade(database), database)
    except (OSError, DBAPIError, TimeoutError) as exc:
        raise DatabaseUnavailable(schema.describe_connection_error(database, exc)) from None
    click.echo(
        f"cronlock: schema {database.schema!r} is at revision {schema.head_revision()} "
        f"in {database.display_url}"
    )


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--count",
    type=click.IntRange(1, 100),
    default=3,
    show_default=True,
    help="Next fire times shown per task.",
)
@pass_options
def list_tasks(options: Options, as_json: bool, count: int) -> None:
    """Periodic tasks: name, cron, timezone, lock key, next fire times (their zone and UTC)."""
    app = options.load_app()
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for task in sorted(app.tasks.values(), key=lambda t: t.name):
        zone = task.schedule.timezone
        upcoming = list(itertools.islice(task.schedule.fire_times(now), count))
        policy = task.policy
        rows.append(
            {
                "name": task.name,
                "cron": task.schedule.expression,
                "timezone": zone.key,
                "namespace": task.namespace,
                "lock": [task.lock_namespace, task.lock_key],
                "next_fire_time": upcoming[0].astimezone(zone).isoformat() if upcoming else None,
                "next_fire_time_utc": upcoming[0].isoformat() if upcoming else None,
                "next_fire_times": [
                    {"local": t.astimezone(zone).isoformat(), "utc": t.isoformat()}
                    for t in upcoming
                ],
                "misfire": policy.misfire.value,
                "grace_s": policy.grace.total_seconds(),
                "max_lateness_s": None
                if policy.max_lateness is None
                else policy.max_lateness.total_seconds(),
                "catch_up_limit": policy.catch_up_limit,
                "jitter_s": policy.jitter.total_seconds(),
                "description": task.description,
            }
        )
    if as_json:
        click.echo(json.dumps({"tasks": rows}))
        return
    if not rows:
        click.echo("no periodic tasks registered")
        return
    header = ("NAME", "CRON", "TIMEZONE", "LOCK (ns, key)", "MISFIRE", "NEXT (zone)", "NEXT (UTC)")
    table: list[tuple[str, ...]] = [header]
    for row in rows:
        times = row["next_fire_times"] or [{"local": "never", "utc": "never"}]
        for index, fire in enumerate(times):
            first = index == 0
            table.append(
                (
                    str(row["name"]) if first else "",
                    str(row["cron"]) if first else "",
                    str(row["timezone"]) if first else "",
                    f"{row['namespace']} ({row['lock'][0]}, {row['lock'][1]})" if first else "",
                    str(row["misfire"]) if first else "",
                    fire["local"],
                    fire["utc"],
                )
            )
    _print_table(table)


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)
            ).rstrip()
        )


def exit_code(result: RunResult | DrainResult, skipped_exit_code: int = EXIT_OK) -> int:
    return {
        RunStatus.COMPLETED: EXIT_OK,
        RunStatus.SKIPPED: skipped_exit_code,
        RunStatus.FAILED: EXIT_FAILED,
        RunStatus.PARTIAL: EXIT_PARTIAL,
        RunStatus.MISSED: EXIT_OK,
    }[result.status]


def describe(result: RunResult) -> list[str]:
    """A run's outcome in a few readable lines."""
    if result.status is RunStatus.SKIPPED:
        why = {
            "lock_busy": "another run holds the lock",
            "slot_done": f"slot {_iso(result.slot)} already ran",
        }.get(result.skip_reason or "", result.error or "")
        return [f"{result.task}: skipped ({result.skip_reason}: {why})"]
    lines = [
        f"{result.task}: {result.status.value} — {result.items_ok} items ok, "
        f"{result.items_failed} failed, {result.duration_ms:.0f} ms (slot {_iso(result.slot)})"
    ]
    if result.error:
        lines.append(f"  error: {result.error} (nothing of the run was committed)")
    for failure in result.failures[:20]:
        lines.append(f"  item {failure.item}: {failure.error_type}: {failure.message}")
    if result.items_failed > 20:
        lines.append(f"  … and {result.items_failed - 20} more (cronlock status --json)")
    return lines


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment else "none"


@cli.command("run")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--skipped-exit-code",
    type=click.IntRange(0, 255),
    default=EXIT_OK,
    show_default=True,
    help="Exit code for a skipped run (for systemd or Kubernetes).",
)
@click.option(
    "--manual",
    is_flag=True,
    help="Run now outside any slot (recorded as manual; claims no slot).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds after a fire time that still belong to its slot (default: the task's).",
)
@pass_options
def run_task(
    options: Options,
    task: str,
    as_json: bool,
    skipped_exit_code: int,
    manual: bool,
    grace: float | None,
) -> None:
    """One run of TASK now, under its lock, for the slot it belongs to.

    From crontab the invocation maps to the fire time it is for (up to the task's grace
    late); a slot that already ran is skipped (slot_done). Outside every slot's grace nothing
    runs (skipped, no_slot) unless --manual. TASK may be the built-in `drain` (the job queue:
    see `cronlock drain`).
    """
    if task == "drain":
        _drain(options, DrainOptions(), None, as_json, skipped_exit_code)
    app = options.load_app()
    app.task(task)  # an unknown task fails before any connection is made
    database = options.database(app)
    grace_delta = None if grace is None else timedelta(seconds=grace)

    async def go() -> RunResult:
        await schema.ensure_ready(database)
        return await app.run(task, manual=manual, grace=grace_delta)

    result = _run(go, app)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        for line in describe(result):
            click.echo(line)
    _exit(exit_code(result, skipped_exit_code))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="Runs shown per task.",
)
@pass_options
def status(options: Options, as_json: bool, limit: int) -> None:
    """Last runs per task; the queue: counts, oldest due job, failures, rates, drainers."""
    from .observe.status import collect

    app = options.load_app()
    database = options.database(app)

    async def go() -> dict[str, Any]:
        await schema.ensure_ready(database)
        return await collect(app, database, limit=limit)

    report = _run(go, app)
    if as_json:
        click.echo(json.dumps(report))
        return
    for entry in report["tasks"]:
        runs = entry["last_runs"]
        click.echo(f"{entry['task']}: " + ("never ran" if not runs else f"last {len(runs)} runs"))
        click.echo("  " + _health_line(entry))
        for run in runs:
            detail = (
                run["error"]
                or run["skip_reason"]
                or (f"{run['items_ok']} ok, {run['items_failed']} failed")
            )
            slot = run.get("slot") or ("manual" if run.get("trigger") == "manual" else "none")
            click.echo(f"  {run['started_at']}  {run['status']:<9}  slot {slot}  {detail}")
    for line in describe_queue(report["queue"]):
        click.echo(line)


def _health_line(entry: dict[str, Any]) -> str:
    lateness = entry.get("recent_lateness_ms")
    late = (
        "no timed runs yet"
        if not lateness
        else f"lateness last {lateness['last']:.0f} ms, mean {lateness['mean']:.0f} ms, "
        f"max {lateness['max']:.0f} ms over {lateness['runs']} runs"
    )
    return (
        f"last success {entry.get('last_success') or 'never'}; "
        f"{entry.get('consecutive_failures', 0)} failure(s) and "
        f"{entry.get('consecutive_misses', 0)} missed slot(s) in a row; {late}"
    )


@cli.command()
@click.option(
    "--directory",
    type=click.Path(file_okay=False),
    help="Project directory the lines cd to, for --app to import (default: this one).",
)
@click.option(
    "--cronlock",
    "cronlock_command",
    help="The command the lines run (default: this environment's cronlock, by absolute path).",
)
@click.option(
    "--log",
    help="File the lines append their output to (default: ~/.local/state/cronlock/cron.log).",
)
@click.option(
    "--env-file",
    help="A file of KEY=value lines (CRONLOCK_DATABASE_URL=…) each line sources: the place "
    "for a password.",
)
@click.option(
    "--cron-timezone",
    help="The zone cron runs in on the host the lines are for (default: this host's).",
)
@click.option("--user", help="System crontab format (/etc/cron.d) with this user field.")
@click.option(
    "--task", "task_names", multiple=True, help="Only this task (repeatable; no drain line)."
)
@pass_options
def crontab(
    options: Options,
    directory: str | None,
    cronlock_command: str | None,
    log: str | None,
    env_file: str | None,
    cron_timezone: str | None,
    user: str | None,
    task_names: tuple[str, ...],
) -> None:
    """Print crontab lines for the registered tasks that run as they are under cron."""
    from . import crontab as lines

    app = options.load_app()
    setup = lines.setup_for(
        app,
        options.app_spec,
        database_url=options.database_url,
        schema=options.schema,
        pgbouncer=options.pgbouncer,
        directory=directory,
        cronlock=cronlock_command,
        log=log,
        env_file=env_file,
        cron_timezone=cron_timezone,
        user=user,
        tasks=task_names,
    )
    text = lines.render(app, setup)
    for warning in lines.warnings(setup):
        click.echo(f"cronlock: warning: {warning}", err=True)
    click.echo(text, nl=False)


@cli.command()
@pass_options
def demo(options: Options) -> None:
    """The whole story on the embedded default, end to end, with a summary."""
    from .demo import demo_app, run_demo

    app, setup, app_spec = demo_app(options.app_spec if options.app_given else None)
    where = (
        f"the embedded PostgreSQL in {embedded.data_directory()}"
        if options.database_url is None and app.database_url is None
        else "your database"
    )
    database = options.database(app)
    if logging.getLogger().level >= logging.WARNING:  # the summary lists the failed items
        logging.getLogger("cronlock.periodic").setLevel(logging.ERROR)
    lines = _run(lambda: run_demo(app, database, setup, where, app_spec), app)
    for line in lines:
        click.echo(line)


@cli.group("embedded")
def embedded_group() -> None:
    """The embedded PostgreSQL (the default with no database configured): status, stop, remove."""


@embedded_group.command("status")
def embedded_status() -> None:
    """Where the embedded server is, who owns it, and whether it is running."""
    click.echo(_embedded_line(embedded.state()))


@embedded_group.command("stop")
def embedded_stop() -> None:
    """Stop the embedded server (the next command that needs it starts it again)."""
    before = embedded.stop()
    click.echo(f"stopped: {before.directory}" if before.running else _embedded_line(before))


@embedded_group.command("remove")
def embedded_remove() -> None:
    """Stop the embedded server and delete its data directory (everything cronlock made)."""
    before = embedded.remove()
    click.echo(f"removed: {before.directory}" if before.exists else _embedded_line(before))


def _embedded_line(state: embedded.State) -> str:
    if not state.exists:
        return f"absent: {state.directory} (nothing created yet)"
    if state.running:
        where = f": {state.url}" if state.url else ", still starting"
        return f"running: {state.directory} (pid {state.pid}, as {state.owner}){where}"
    return f"stopped: {state.directory} (owned by {state.owner})"


# -- the job queue: enqueue, drain, worker ---------------------------------------------------


def _parse_run_at(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidJobOption(f"--run-at: not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        raise InvalidJobOption(f"--run-at: give a timezone (e.g. {value}+00:00 or {value}Z)")
    return moment


@cli.command()
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
    as_json: bool,
) -> None:
    """Add a job of JOB_TYPE (PAYLOAD is JSON, default null); prints its id."""
    from .queue.jobs import handler_for, parse_json

    app = options.load_app()
    # Everything is checked before any connection is made: bad input writes nothing.
    handler_for(app.handlers, job_type)
    value = None if payload is None else parse_json(payload, "PAYLOAD")
    moment = _parse_run_at(run_at)
    database = options.database(app)

    async def go() -> Enqueued:
        await schema.ensure_ready(database)
        async with database.session() as session:
            answer = await app.enqueue(
                session,
                job_type,
                value,
                max_retries=max_retries,
                delay=delay,
                run_at=moment,
                priority=priority,
                queue=queue,
                dedup_key=dedup_key,
            )
            await session.commit()
            return answer

    answer = _run(go, app)
    if as_json:
        click.echo(json.dumps({"job_type": job_type, **answer.to_dict()}))
    elif answer.created:
        click.echo(str(answer.id))
    else:
        click.echo(f"{answer.id} (already waiting with dedup key {dedup_key!r})")


@dataclass(frozen=True)
class DrainOptions:
    queue: str = DEFAULT_QUEUE
    commit_mode: str = CommitMode.STRICT.value
    batch_size: int | None = None
    concurrency: int = 1
    grace_period: float = DEFAULT_GRACE_PERIOD
    poll_interval: float = DEFAULT_POLL_INTERVAL


def _drainer_options(command: Callable[..., Any]) -> Callable[..., Any]:
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
                "a crash rolls back the batch).",
            ),
            click.option(
                "--batch-size",
                type=click.IntRange(1, 10_000),
                help=f"Jobs per claim in batch mode (default {DEFAULT_BATCH_SIZE}).",
            ),
            click.option(
                "--concurrency",
                type=click.IntRange(1, 64),
                default=1,
                show_default=True,
                help="Jobs run at once, each on its own connection (for IO-bound handlers).",
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
        command = option(command)
    return command


def _metrics_server() -> Any:
    try:
        from .observe.prometheus import serve_metrics
    except ImportError:
        raise UsageFailure(
            "--metrics-port needs the 'metrics' extra: pip install 'cronlock[metrics]'"
        ) from None
    return serve_metrics


def _drain(
    options: Options,
    drain_options: DrainOptions,
    max_seconds: float | None,
    as_json: bool,
    skipped_exit_code: int,
    *,
    daemon: bool = False,
    metrics_address: tuple[str, int] | None = None,
) -> NoReturn:
    app = options.load_app()
    serve_metrics = _metrics_server() if metrics_address else None
    database = options.database(app)

    async def go() -> DrainResult:
        await schema.ensure_ready(database)
        if serve_metrics is not None and metrics_address is not None:
            await serve_metrics(database, *metrics_address)
        drainer = app.drainer(
            queue=drain_options.queue,
            commit_mode=drain_options.commit_mode,
            batch_size=drain_options.batch_size,
            concurrency=drain_options.concurrency,
            poll_interval=drain_options.poll_interval,
        )
        grace = drain_options.grace_period
        if daemon:
            return await serve_worker(drainer, grace_period=grace, handle_signals=True)
        return await serve_drain(
            drainer, max_seconds=max_seconds, grace_period=grace, handle_signals=True
        )

    result = _run(go, app)
    if as_json or daemon:
        click.echo(json.dumps(result.to_dict()))
    else:
        for line in describe_drain(result):
            click.echo(line)
    if daemon:
        _exit(EXIT_FAILED if result.status is RunStatus.FAILED else EXIT_OK)
    _exit(exit_code_of_drain(result, skipped_exit_code))


def describe_queue(queue: dict[str, Any]) -> list[str]:
    """``cronlock status``'s queue part in readable lines."""
    lines = []
    for entry in queue["queues"]:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(entry["counts"].items()))
        age = entry["oldest_due_age_seconds"]
        oldest = f"; {entry['due']} due, oldest waiting {age:.1f} s" if age is not None else ""
        lines.append(f"queue {entry['queue']}: {counts or 'empty'}{oldest}")
    if not queue["queues"]:
        lines.append("queue: no jobs")
    rates = queue["rates"]
    lines.append(
        f"  completed/min: {rates['completed_per_min_1m']} (1 m), "
        f"{rates['completed_per_min_5m']} (5 m), {rates['completed_per_min_15m']} (15 m); "
        f"failed/min: {rates['failed_per_min_1m']} (1 m), {rates['failed_per_min_5m']} (5 m)"
    )
    for worker in queue["workers"]:
        lines.append(
            f"  drainer {worker['host']}:{worker['pid']} queue {worker['queue']}: "
            f"{worker['state']} (heartbeat {worker['heartbeat_age_seconds']:.1f} s ago, "
            f"{worker['processed']} completed, {worker['in_flight']} in flight)"
        )
    for failure in queue["recent_failures"]:
        lines.append(
            f"  {failure['status']:<8} {failure['job_type']} {failure['id']} "
            f"(retry {failure['retry_count']}/{failure['max_retries']}): {failure['error_message']}"
        )
    return lines


def exit_code_of_drain(result: DrainResult, skipped_exit_code: int = EXIT_OK) -> int:
    """0 nothing failed (or skipped), 3 some attempts failed (jobs retrying or failed, the
    rest committed), 1 the drainer itself failed (its lock or its database went away)."""
    return exit_code(result, skipped_exit_code)


def describe_drain(result: DrainResult) -> list[str]:
    stats = result.stats
    if result.status is RunStatus.SKIPPED:
        return [f"drain {result.queue}: skipped ({result.skip_reason})"]
    lines = [
        f"drain {result.queue}: {result.status.value} — {stats['processed']} completed, "
        f"{stats['retried']} retrying, {stats['failed']} failed in {stats['elapsed_seconds']} s "
        f"({stats['throughput_per_sec']} jobs/s, p95 {stats['p95_latency_ms']} ms)"
    ]
    if result.error:
        lines.append(f"  error: {result.error}")
    return lines


@cli.command()
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
    help="Exit code when another drainer is active.",
)
@_drainer_options
@pass_options
def drain(
    options: Options,
    max_seconds: float | None,
    as_json: bool,
    skipped_exit_code: int,
    queue: str,
    commit_mode: str,
    batch_size: int | None,
    concurrency: int,
    grace_period: float,
) -> None:
    """Process due jobs until none is due or S seconds passed; skip if another drainer is
    active. Exit 0 all went well, 3 some attempts failed, 1 the drainer failed."""
    _drain(
        options,
        DrainOptions(queue, commit_mode, batch_size, concurrency, grace_period),
        max_seconds,
        as_json,
        skipped_exit_code,
    )


@cli.command()
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
@pass_options
def worker(
    options: Options,
    queue: str,
    commit_mode: str,
    batch_size: int | None,
    concurrency: int,
    grace_period: float,
    poll_interval: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Long-running drainer: stands by while another is active, takes over when it stops or
    dies. SIGTERM/SIGINT stop it gracefully; it prints its stats (one JSON object) on exit."""
    _drain(
        options,
        DrainOptions(queue, commit_mode, batch_size, concurrency, grace_period, poll_interval),
        None,
        True,
        EXIT_OK,
        daemon=True,
        metrics_address=(metrics_host, metrics_port) if metrics_port else None,
    )


@cli.command()
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
    """The HTTP API (POST /jobs, GET /jobs/{id}, /runs, /healthz, /metrics) on uvicorn.

    Every endpoint but /healthz needs $CRONLOCK_API_TOKEN as a bearer token
    ($CRONLOCK_API_READ_TOKEN for all but writes). With neither set, everything is open, and
    only a loopback --host is allowed unless --insecure-open."""
    try:
        import uvicorn

        from .http import TOKEN_ENV, Access, create_api, is_loopback
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
    options.database(app)
    api = create_api(app, public=public)
    if access.open:
        reach = "any process on this machine" if is_loopback(host) else "anyone who can reach it"
        click.echo(
            f"cronlock serve: {host}:{port} has no token: {reach} may enqueue jobs and read "
            f"their payloads, results and errors (set {TOKEN_ENV})",
            err=True,
        )
    uvicorn.run(api, host=host, port=port, log_level="info")


# -- cronlock bench (issue 5) ----------------------------------------------------------------


@cli.command()
@click.option("--quick", is_flag=True, help="Small sizes and a short latency run (about 15 s).")
@click.option(
    "--sizes",
    metavar="N,N,…",
    help="Jobs per drain run [default: 100,1000,10000,100000; --quick: 100,1000].",
)
@click.option("--modes", metavar="MODE,…", help="Commit modes to drain in [default: strict,batch].")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    help=f"Jobs per batch in batch mode ({DEFAULT_BATCH_SIZE}).",
)
@click.option(
    "--latency-rate",
    type=click.FloatRange(0, 10_000, min_open=True),
    help="Jobs/s sent one at a time to an idle worker (also during recovery) [default: 50].",
)
@click.option(
    "--latency-seconds",
    type=click.FloatRange(0, 3600, min_open=True),
    help="How long the latency run sends [default: 10; --quick: 2].",
)
@click.option(
    "--items",
    type=click.IntRange(1, 1_000_000),
    help="Items of the periodic run [default: 10000; --quick: 1000].",
)
@click.option(
    "--recovery-kills",
    type=click.IntRange(0, 100),
    help="SIGKILLs of the active worker, 0 to skip [default: 3; --quick: 1].",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 100),
    help="Runs of everything, interleaved; figures are median (min..max) [default: 1].",
)
@click.option(
    "--only",
    metavar="SECTION,…",
    help="Sections to run: enqueue,drain,latency,periodic,recovery [default: all].",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of the table."
)
@click.option("--fail-at", hidden=True, help="Fail this section (tests of the cleanup).")
@pass_options
def bench(
    options: Options,
    quick: bool,
    sizes: str | None,
    modes: str | None,
    batch_size: int | None,
    latency_rate: float | None,
    latency_seconds: float | None,
    items: int | None,
    recovery_kills: int | None,
    repeats: int | None,
    only: str | None,
    as_json: bool,
    fail_at: str | None,
) -> None:
    """Measure cronlock on this database: enqueue and drain rates, latency, a periodic run,
    recovery after SIGKILL of the active worker; print a table (or --json).

    It works in a fresh schema, cronlock_bench_<random hex>, with its own queue, and never
    touches cronlock's own schema or jobs; two `cronlock worker` processes are started for
    latency and recovery. The schema is dropped and the workers are killed at the end, also
    when a step fails or on Ctrl-C/SIGTERM. --app, --schema and --pgbouncer are not used
    (point it at PostgreSQL itself; its user needs CREATE on the database).

    Exit codes: 0 measured, 1 a step failed (or interrupted), 2 bad option or no database.
    The default run drains 100,000 jobs per commit mode (a few minutes);
    --quick takes about 15 s.
    """
    from . import bench as benchmark
    from .bench.progress import Bar, Lines

    given: dict[str, Any] = {
        name: value
        for name, value in {
            "batch_size": batch_size,
            "latency_rate": latency_rate,
            "latency_seconds": latency_seconds,
            "items": items,
            "recovery_kills": recovery_kills,
            "repeats": repeats,
            "fail_at": fail_at,
        }.items()
        if value is not None
    }
    if sizes is not None:
        given["sizes"] = benchmark.options.parse_sizes(sizes)
    if modes is not None:
        given["modes"] = benchmark.options.parse_modes(modes)
    if only is not None:
        given["sections"] = benchmark.options.parse_sections(only)
    settings = benchmark.bench_options(quick=quick, **given)
    database = options.database()
    progress = Bar() if sys.stderr.isatty() and not as_json else Lines()
    try:
        url = database.url.render_as_string(hide_password=False)
        report = _run(lambda: benchmark.run_bench(url, settings, progress), database)
    except benchmark.BenchFailed as exc:
        click.echo(f"cronlock bench: {exc}", err=True)
        _exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(report))
    else:
        for line in benchmark.render(report):
            click.echo(line)


def main() -> None:
    cli(prog_name="cronlock")


# -- scheduling (issue 4) -------------------------------------------------------------------


@cli.command()
@click.option(
    "--task",
    "task_names",
    multiple=True,
    help="Fire only this task (repeatable; default: every registered task).",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_SHUTDOWN_GRACE,
    show_default=True,
    help="Seconds a run in flight may take to finish after SIGTERM before it is rolled back.",
)
@click.option(
    "--with-drainer",
    is_flag=True,
    help="Also drain the job queue in this process (a small deployment in one process).",
)
@pass_options
def scheduler(
    options: Options, task_names: tuple[str, ...], shutdown_grace: float, with_drainer: bool
) -> None:
    """Long-running: fire every periodic task on time (APScheduler); SIGTERM is graceful.

    Each firing takes the same path as `cronlock run` (advisory lock, slot claim, savepoints),
    so several schedulers and crontab lines may fire the same task: one run per slot. On start,
    slots missed while no scheduler ran are handled by each task's misfire policy.
    """
    app = options.load_app()
    for name in task_names:
        app.task(name)
    database = options.database(app)

    async def go() -> None:
        await schema.ensure_ready(database)
        daemon = Scheduler(app, tasks=task_names or None, shutdown_grace=shutdown_grace)
        click.echo(
            f"cronlock: scheduler firing {len(daemon.tasks)} task(s); SIGTERM stops it", err=True
        )
        await serve_scheduler(
            daemon, drainer=app.drainer if with_drainer else None, handle_signals=True
        )

    _run(go, app)
