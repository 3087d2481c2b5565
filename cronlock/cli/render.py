"""Every line the command line prints for people: tables, outcomes, status, notes.

Functions here take values from the library (results, reports, tasks) and return lines; the
commands echo them. ``--json`` output is the values' own ``to_dict()`` or report, not this.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..outcome import DrainResult, JobStatus, RunResult, RunStatus

if TYPE_CHECKING:
    # What the lines describe, for the annotations only: rendering a run's result must not
    # import the queue's machinery (issue 26: `cronlock run TASK`'s start-up).
    from .. import embedded
    from ..app import App
    from ..database import Database
    from ..queue.control import QueueDeletion, QueueInfo, QueueState, Running
    from ..queue.drainer import Drainer
    from ..queue.jobs import Enqueued
    from ..queue.operate import JobChange, JobInfo, JobPage, JobsChanged
    from ..retention import PruneResult, Retention

__all__ = [
    "ago",
    "builtin_lines",
    "describe",
    "describe_drain",
    "describe_queue",
    "describe_status",
    "embedded_note",
    "embedded_removed",
    "embedded_state",
    "embedded_stopped",
    "enqueued",
    "health_line",
    "job_change",
    "job_lines",
    "job_table",
    "job_type_entries",
    "job_type_table",
    "jobs_changed",
    "migrated",
    "migration_check",
    "nothing_changed",
    "open_api",
    "overdue_line",
    "pruned",
    "queue_idle",
    "queue_state",
    "queue_table",
    "retention_entry",
    "scheduler_started",
    "serve_started",
    "signal_received",
    "table",
    "task_control_lines",
    "task_entries",
    "task_table",
    "warning",
    "worker_started",
]


def embedded_note(server: embedded.Server) -> str:
    """A command on the embedded server: what it created, or where it is."""
    return server.note()


def embedded_state(state: embedded.State) -> str:
    """``cronlock embedded status`` (and stop/remove when there was nothing to do)."""
    if not state.exists:
        return f"absent: {state.directory} (nothing created yet)"
    if state.running:
        where = f": {state.url}" if state.url else ", still starting"
        return f"running: {state.directory} (pid {state.pid}, as {state.owner}){where}"
    return f"stopped: {state.directory} (owned by {state.owner})"


def embedded_stopped(before: embedded.State) -> str:
    return f"stopped: {before.directory}" if before.running else embedded_state(before)


def embedded_removed(before: embedded.State) -> str:
    return f"removed: {before.directory}" if before.exists else embedded_state(before)


def warning(message: str) -> str:
    return f"cronlock: warning: {message}"


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows in left-aligned columns two spaces apart (the first row is the header)."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


# -- periodic tasks and their runs -----------------------------------------------------------


def task_entries(app: App, now: datetime, count: int) -> list[dict[str, Any]]:
    """``cronlock list``: one entry per task (its JSON shape), by name."""
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
                "commit_every": task.commit_every,
                "description": task.description,
            }
        )
    return rows


def task_table(rows: list[dict[str, Any]], now: datetime | None = None) -> list[str]:
    """``cronlock list`` for people: a line per upcoming fire time, in the task's zone and,
    for a task not in UTC, in UTC beside it."""
    if not rows:
        return ["no periodic tasks registered"]
    now = now or datetime.now(UTC)
    header = ("NAME", "CRON", "TIMEZONE", "LOCK (ns, key)", "MISFIRE", "NEXT", "")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        times = row["next_fire_times"] or [{"local": None, "utc": None}]
        utc = row["timezone"] in ("UTC", "Etc/UTC")
        for index, fire in enumerate(times):
            first = index == 0
            if fire["utc"] is None:
                when, relative = "never", ""
            elif utc:
                when, relative = _clock_full(fire["utc"]), _ago(fire["utc"], now)
            else:
                local = _moment(fire["local"]).strftime("%Y-%m-%d %H:%M %z")
                when = f"{local} = {_moment(fire['utc']).strftime('%H:%MZ')}"
                relative = _ago(fire["utc"], now)
            lines.append(
                (
                    str(row["name"]) if first else "",
                    str(row["cron"]) if first else "",
                    str(row["timezone"]) if first else "",
                    f"{row['namespace']} ({row['lock'][0]}, {row['lock'][1]})" if first else "",
                    str(row["misfire"]) if first else "",
                    when,
                    relative,
                )
            )
    return table(lines)


def _clock_full(value: str | datetime) -> str:
    return _moment(value).astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")


def job_type_entries(app: App) -> list[dict[str, Any]]:
    """``cronlock list``'s job types (its JSON shape): handled or only declared, by name."""
    entries = []
    for name in sorted(app.job_types):
        defaults = app.job_types[name]
        handler = app.handlers.get(name)
        entries.append(
            {
                "job_type": name,
                "queue": defaults.queue,
                "max_retries": defaults.max_retries,
                "timeout_s": handler.timeout if handler is not None else None,
                "handler": handler is not None,
            }
        )
    return entries


def job_type_table(entries: list[dict[str, Any]]) -> list[str]:
    if not entries:
        return ["no job types registered"]
    rows: list[tuple[str, ...]] = [("JOB TYPE", "QUEUE", "RETRIES", "TIMEOUT", "HANDLER")]
    for entry in entries:
        timeout = entry["timeout_s"]
        rows.append(
            (
                entry["job_type"],
                entry["queue"],
                str(entry["max_retries"]),
                "-" if timeout is None else f"{timeout:g} s",
                "yes" if entry["handler"] else "declared only",
            )
        )
    return table(rows)


def describe(result: RunResult) -> list[str]:
    """A run's outcome in a few readable lines."""
    if result.status is RunStatus.SKIPPED:
        why = {
            "lock_busy": "another run holds the lock",
            "slot_done": f"slot {_iso(result.slot)} already ran",
        }.get(result.skip_reason or "", result.error or "")
        return [f"{result.task}: skipped ({result.skip_reason}: {why})"]
    lines = [
        f"{result.task}: {result.status.value} — {_plural(result.items_ok, 'item')} ok, "
        f"{result.items_failed:,} failed, {result.duration_ms:.0f} ms (slot {_iso(result.slot)})"
    ]
    if result.error:
        kept = (
            f"its {result.chunks} committed chunk(s), {_plural(result.items_ok, 'item')}, stay"
            if result.chunks
            else "nothing of the run was committed"
        )
        lines.append(f"  error: {result.error} ({kept})")
    if result.items_parked:
        lines.append(
            f"  {result.items_parked} parked item(s) left out (cronlock task parked {result.task})"
        )
    for failure in result.failures[:20]:
        lines.append(f"  item {failure.item}: {failure.error_type}: {failure.message}")
    if result.items_failed > 20:
        lines.append(f"  … and {result.items_failed - 20} more (cronlock status --json)")
    return lines


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment else "none"


def scheduler_started(tasks: Sequence[str], database: Database, drainer: bool) -> str:
    names = ", ".join(tasks) or "no task"
    beside = "; and draining queue default (standby or active)" if drainer else ""
    return (
        f"scheduler started: firing {len(tasks)} task(s) ({names}) on {database.display_url}"
        f"{beside}; SIGTERM stops it"
    )


def worker_started(drainer: Drainer, database: Database) -> str:
    return (
        f"worker started: queue {drainer.queue} on {database.display_url} "
        f"({drainer.commit_mode.value}, concurrency {drainer.concurrency}, pid {os.getpid()}); "
        "active once it holds the queue's lock, standby while another drainer does; SIGTERM "
        "stops it"
    )


def serve_started(host: str, port: int, database: Database) -> str:
    return (
        f"serve started: the HTTP API on http://{host}:{port} for {database.display_url}; "
        "SIGTERM stops it"
    )


# -- the job queue ---------------------------------------------------------------------------


def enqueued(answer: Enqueued, dedup_key: str | None) -> str:
    if answer.created:
        return str(answer.id)
    return f"{answer.id} (already waiting with dedup key {dedup_key!r})"


def describe_drain(
    result: DrainResult, interrupted: signal.Signals | None = None, *, command: str = "drain"
) -> list[str]:
    stats = result.stats
    if result.status is RunStatus.SKIPPED:
        resume = f"; `cronlock queue resume {result.queue}` claims again" if result.paused else ""
        return [f"{command} {result.queue}: skipped ({result.skip_reason}{resume})"]
    outcome = (
        result.status.value
        if interrupted is None or result.status is RunStatus.FAILED
        else f"interrupted ({interrupted.name})"
    )
    # The latency is of completed jobs: with none, there is no figure to show.
    latency = f", p95 {stats['p95_latency_ms']} ms" if stats["processed"] else ""
    lines = [
        f"{command} {result.queue}: {outcome} — {stats['processed']} completed, "
        f"{stats['retried']} retrying, {stats['failed']} failed"
        + "".join(f", {stats[key]} {key}" for key in ("cancelled", "snoozed") if stats.get(key))
        + f" in {stats['elapsed_seconds']} s ({stats['throughput_per_sec']} jobs/s{latency})"
    ]
    if result.paused:
        lines.append(f"  queue {result.queue} is paused: nothing is claimed until it is resumed")
    if result.error:
        lines.append(f"  error: {result.error}")
    return lines


def signal_received(
    command: str, signum: signal.Signals, *, aborts: bool, in_flight: int, grace: float
) -> str:
    """What ``drain`` and ``worker`` say when a signal comes: what they wait for, and how to
    stop waiting."""
    jobs = "1 job" if in_flight == 1 else f"{in_flight:,} jobs"
    if aborts:
        return (
            f"{command}: {signum.name} again: aborting; the {jobs} in flight roll back "
            "and stay queued"
        )
    if not in_flight:
        return f"{command}: {signum.name}: stopping (no job in flight)"
    return (
        f"{command}: {signum.name}: stopping; no new jobs; waiting up to {grace:g} s "
        f"for the {jobs} in flight to finish and commit (a second signal aborts them: they "
        "roll back and stay queued)"
    )


# -- the HTTP API ----------------------------------------------------------------------------


def open_api(host: str, port: int, *, loopback: bool, token_env: str) -> str:
    """``cronlock serve`` with no token: who may do what."""
    reach = "any process on this machine" if loopback else "anyone who can reach it"
    return (
        f"cronlock serve: {host}:{port} has no token: {reach} may enqueue jobs and read "
        f"their payloads, results and errors (set {token_env})"
    )


# -- status and the schema -------------------------------------------------------------------


def queue_idle(queue: str, running: Running, timeout: float) -> str:
    if not running:
        return f"queue {queue}: idle (no job of it runs)"
    return (
        f"queue {queue}: still running after {timeout:g} s: {running.processing} lease-mode "
        f"job(s) processing, {running.drainers} drainer(s) busy"
    )


def migration_check(database: Database, current: str | None, pending: list[str] | None) -> str:
    where = f"cronlock: schema {database.schema!r} in {database.display_url}"
    if current is None:
        return f"{where} is not installed: {len(pending or [])} migrations pending"
    if pending is None:
        return f"{where} is at revision {current}, newer than this cronlock's: nothing to migrate"
    if not pending:
        return f"{where} is at revision {current} (head): nothing to migrate"
    return (
        f"{where} is at revision {current}: {len(pending)} migration(s) pending "
        f"(to {pending[-1]}): run `cronlock migrate`"
    )


def migrated(database: Database, revision: str) -> str:
    return (
        f"cronlock: schema {database.schema!r} is at revision {revision} in {database.display_url}"
    )


def describe_status(report: dict[str, Any], now: datetime | None = None) -> list[str]:
    """``cronlock status`` for people, scanned in a second: per task a health line and its
    last runs in aligned columns with relative times (no_slot skips left out, the last run
    that ran its body always shown), then the queue."""
    now = now or datetime.now(UTC)
    lines = []
    for entry in report["tasks"]:
        runs = entry["last_runs"]
        real = entry.get("last_real_run")
        lines.append(f"{entry['task']}: {health_line(entry, now)}")
        if entry.get("registered") is False:
            lines.append(
                "  not a task of this app: its runs are in this schema (another app sharing "
                "it, or a task since removed)"
            )
        if entry.get("overdue"):
            lines.append("  " + overdue_line(entry["overdue"]))
        lines.extend(task_control_lines(entry, now))
        shown = list(runs)
        if real is not None and all(run["id"] != real["id"] for run in runs):
            shown.append(real)  # skips filled the last runs: the last real one, below them
        if not shown:
            lines.append("  never ran")
            continue
        rows: list[tuple[str, ...]] = [("STARTED", "", "STATUS", "SLOT", "TOOK", "DETAIL")]
        for run in shown:
            rows.append(
                (
                    _clock(run["started_at"], now),
                    _ago(run["started_at"], now),
                    run["status"],
                    _clock(run["slot"], now)
                    if run.get("slot")
                    else "manual"
                    if run.get("trigger") == "manual"
                    else "-",
                    _took(run),
                    _run_detail(run),
                )
            )
        lines.extend("  " + line for line in table(rows))
    return lines + describe_queue(report["queue"], now)


def _moment(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _clock(value: str | datetime | None, now: datetime) -> str:
    """A time to the second in UTC, the date only when it is not today's."""
    if value is None:
        return "-"
    moment = _moment(value).astimezone(UTC)
    if moment.date() == now.astimezone(UTC).date():
        return moment.strftime("%H:%M:%SZ")
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def ago(seconds: float) -> str:
    """``42 s ago``, ``3 min ago``, ``5 h ago``, ``2 d ago`` (``in …`` for the future)."""
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 36 * 3600:
        text = f"{seconds / 3600:.0f} h"
    else:
        text = f"{seconds / 86400:.0f} d"
    return f"in {text}" if future else f"{text} ago"


def _ago(value: str | datetime | None, now: datetime) -> str:
    if value is None:
        return ""
    return ago((now - _moment(value)).total_seconds())


def _took(run: dict[str, Any]) -> str:
    if not run.get("finished_at") or not run.get("started_at"):
        return ""
    seconds = (_moment(run["finished_at"]) - _moment(run["started_at"])).total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _run_detail(run: dict[str, Any]) -> str:
    if run.get("error"):
        return _short(run["error"], 70)
    if run.get("skip_reason"):
        return str(run["skip_reason"])
    if run["status"] == "missed":
        return ""
    parked = f", {run['items_parked']} parked" if run.get("items_parked") else ""
    return f"{run['items_ok']} ok, {run['items_failed']} failed{parked}"


def health_line(entry: dict[str, Any], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    lateness = entry.get("recent_lateness_ms")
    late = (
        "no timed runs yet"
        if not lateness
        else f"late {_late(lateness['last'])} last, {_late(lateness['mean'])} mean, "
        f"{_late(lateness['max'])} max over {_plural(lateness['runs'], 'run')}"
    )
    success = entry.get("last_success")
    last = f"{_ago(success, now)} ({_clock(success, now)})" if success else "never"
    failures, misses = entry.get("consecutive_failures", 0), entry.get("consecutive_misses", 0)
    return (
        f"last success {last}; {_plural(failures, 'failure')} and "
        f"{_plural(misses, 'missed slot')} in a row; {late}"
    )


def task_control_lines(entry: dict[str, Any], now: datetime) -> list[str]:
    """A task's pause and parked items, under its health line in ``cronlock status``."""
    lines = []
    paused = entry.get("paused")
    if paused:
        since = f"{_ago(paused['paused_at'], now)} ({_clock(paused['paused_at'], now)})"
        lines.append(
            f"  PAUSED by {paused['paused_by']} since {since}: its slots are skipped "
            f"(cronlock task resume {entry['task']})"
        )
    parked = entry.get("parked") or []
    if parked:
        lines.append(
            f"  {_plural(entry.get('parked_count', len(parked)), 'parked item')} "
            f"(cronlock task parked {entry['task']}):"
        )
        lines.extend(f"    {item['item']}: {item['error']}" for item in parked[:5])
    return lines


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _late(value: float) -> str:
    """A lateness; a run that started before its slot (the scheduler's ``early`` window, a
    clock ahead) is early, not late by a negative amount."""
    return _ms(value) if value >= 0 else f"early {_ms(-value)}"


def overdue_line(overdue: dict[str, Any], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return (
        f"OVERDUE {overdue['seconds']:.0f} s: slot {_clock(overdue['slot'], now)} has no outcome "
        f"(due by {_clock(overdue['due_by'], now)})"
    )


def _counts(counts: dict[str, int], capped: Iterable[str]) -> str:
    """``12 pending, at least 10,000 completed``: a count at the read's cap is a floor."""
    at_least = set(capped)
    return ", ".join(
        f"{'at least ' if status in at_least else ''}{n:,} {status}"
        for status, n in sorted(counts.items())
    )


def describe_queue(queue: dict[str, Any], now: datetime | None = None) -> list[str]:
    """``cronlock status``'s queue part: a line per queue, the rates over 1, 5 and 15 minutes,
    the drainers and the latest failures in aligned columns."""
    now = now or datetime.now(UTC)
    lines = []
    for entry in queue["queues"]:
        counts = _counts(entry["counts"], entry.get("counts_capped", ()))
        age = entry["oldest_due_age_seconds"]
        oldest = (
            f"; {entry['due']:,} due, the oldest waiting {ago(age).removesuffix(' ago')}"
            if age is not None
            else ""
        )
        flags = ""
        if entry.get("paused"):
            since = f"{_ago(entry['paused_at'], now)} ({_clock(entry['paused_at'], now)})"
            flags = f" — PAUSED since {since} (cronlock queue resume)"
        elif entry.get("unserved"):
            flags = " — UNSERVED: due jobs and no live drainer (start a worker or a drain)"
        lines.append(f"queue {entry['queue']}: {counts or 'empty'}{oldest}{flags}")
    if not queue["queues"]:
        lines.append("queue: no jobs")
    rates = queue["rates"]
    lines.extend(
        "  " + line
        for line in table(
            [
                ("PER MINUTE", "1 min", "5 min", "15 min"),
                (
                    "completed",
                    *(f"{rates[f'completed_per_min_{w}']:g}" for w in ("1m", "5m", "15m")),
                ),
                ("failed", *(f"{rates[f'failed_per_min_{w}']:g}" for w in ("1m", "5m", "15m"))),
            ]
        )
    )
    if queue["workers"]:
        rows: list[tuple[str, ...]] = [
            ("DRAINER", "QUEUE", "STATE", "HEARTBEAT", "COMPLETED", "IN FLIGHT")
        ]
        for worker in queue["workers"]:
            rows.append(
                (
                    f"{worker['host']}:{worker['pid']}",
                    worker["queue"],
                    worker["state"],
                    ago(worker["heartbeat_age_seconds"]),
                    f"{worker['processed']:,}",
                    str(worker["in_flight"]),
                )
            )
        lines.extend("  " + line for line in table(rows))
    if queue["recent_failures"]:
        rows = [("FAILED JOB", "TYPE", "STATUS", "ATTEMPT", "ERROR")]
        for failure in queue["recent_failures"]:
            rows.append(
                (
                    str(failure["id"]),
                    failure["job_type"],
                    failure["status"],
                    f"{failure['retry_count']}/{failure['max_retries']}",
                    _short(failure["error_message"], 70),
                )
            )
        lines.extend("  " + line for line in table(rows))
    return lines


# -- operating the queue ---------------------------------------------------------------------


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def job_table(page: JobPage) -> list[str]:
    """``cronlock jobs list``: a line per job, newest first, and how to get the next page."""
    if not page.jobs:
        return ["no jobs match"]
    rows: list[tuple[str, ...]] = [("ID", "STATUS", "TYPE", "QUEUE", "CREATED", "RETRIES", "ERROR")]
    for job in page.jobs:
        rows.append(
            (
                str(job.id),
                job.status.value,
                job.job_type,
                job.queue,
                job.created_at.isoformat(timespec="seconds"),
                f"{job.retry_count}/{job.max_retries}",
                _short(job.error_message),
            )
        )
    lines = table(rows)
    if page.next_cursor is not None:
        lines.append(f"more: --cursor {page.next_cursor}")
    return lines


def job_lines(job: JobInfo) -> list[str]:
    """``cronlock jobs show``: the job's row, then its error history."""
    lines = [
        f"job {job.id}",
        f"  status      {job.status.value}",
        f"  type        {job.job_type} (queue {job.queue}, priority {job.priority})",
        f"  retries     {job.retry_count} of {job.max_retries}",
        f"  created     {job.created_at.isoformat()}",
        f"  due         {job.run_at.isoformat()}",
        f"  started     {_iso(job.started_at)}",  # the claim, the database's clock
        f"  finished    {_iso(job.completed_at)}",  # its outcome's statement, the same clock
        f"  dedup key   {job.dedup_key or 'none'}",
        f"  payload     {json.dumps(job.payload)}",
        f"  result      {json.dumps(job.result)}",
    ]
    if job.depends_on:
        left = "" if job.parents_left is None else f" ({job.parents_left} not completed yet)"
        lines.append(f"  parents     {', '.join(map(str, job.depends_on))}{left}")
    if job.cancel_requested_at is not None:
        lines.append(f"  cancel      requested {job.cancel_requested_at.isoformat()}")
    if job.error_message and job.status is not JobStatus.COMPLETED:
        # A completed job's error_message is an earlier attempt's: the history says it.
        lines.append(f"  error       {job.error_message}")
    for entry in job.error_history:
        lines.append(f"  attempt {entry.get('attempt')} at {entry.get('at')}: {_entry(entry)}")
    return lines


def _entry(entry: dict[str, Any]) -> str:
    """One entry of a job's history: a failed attempt's error, or what its handler (or an
    operator) ended it with."""
    outcome = entry.get("outcome")
    if outcome == "snoozed":
        return f"snoozed until {entry.get('until')} (not counted as an attempt)"
    if outcome is not None:
        return f"{outcome}: {entry.get('error')}"
    return str(entry.get("error"))


def job_change(change: JobChange) -> str:
    return f"{change.job_id}: {change.outcome.value} ({change.detail})"


def jobs_changed(done: JobsChanged) -> str:
    past = {"retry": "retried", "cancel": "cancelled", "delete": "deleted"}[done.verb.value]
    left = ", ".join(f"{n} {outcome.value}" for outcome, n in sorted(done.unchanged.items()))
    return f"{done.verb.value}: {done.changed:,} of {done.matched:,} job(s) {past}" + (
        f"; left alone: {left}" if left else ""
    )


def nothing_changed(verb: str, matching: int) -> str:
    if matching == 0:
        return f"{verb}: no job matches"
    return f"{verb}: nothing changed ({matching:,} job(s) match; --yes to {verb} them)"


def queue_state(state: QueueState) -> str:
    if state.paused:
        since = state.paused_at.isoformat() if state.paused_at else "?"
        return f"queue {state.name}: paused since {since}" + (
            "" if state.changed else " (it already was)"
        )
    return f"queue {state.name}: running" + ("" if state.changed else " (it was not paused)")


def queue_deleted(done: QueueDeletion) -> str:
    if done.deleted:
        return f"queue {done.name}: deleted" + (
            " (it was paused: its drainers claim again)" if done.was_paused else ""
        )
    return f"queue {done.name}: not deleted: {done.detail}"


def queue_table(queues: list[QueueInfo]) -> list[str]:
    """``cronlock queue list``."""
    if not queues:
        return ["no queues"]
    rows: list[tuple[str, ...]] = [("QUEUE", "STATE", "DUE", "OLDEST DUE", "DRAINERS", "JOBS")]
    for queue in queues:
        state = "paused" if queue.paused else "UNSERVED" if queue.unserved else "running"
        age = queue.oldest_due_age_seconds
        counts = _counts(queue.counts, queue.counts_capped)
        rows.append(
            (
                queue.name,
                state,
                str(queue.due),
                "-" if age is None else f"{age:.0f} s",
                f"{queue.active_drainers} active, {queue.standby_drainers} standby",
                counts or "none",
            )
        )
    return table(rows)


def pruned(result: PruneResult) -> list[str]:
    """``cronlock prune``: what it removed (or would remove)."""
    if result.skip_reason is not None:
        return [f"prune: skipped ({result.skip_reason})"]
    verb = "would remove" if result.dry_run else "removed"
    lines = [
        f"prune: {verb} {result.completed_jobs:,} completed, {result.failed_jobs:,} failed and "
        f"{result.cancelled_jobs:,} cancelled job(s), {result.runs:,} run(s), "
        f"{result.workers:,} stale worker row(s)"
        + ("" if result.dry_run else f" in {result.batches} batch(es), {result.duration_s:.1f} s")
    ]
    return lines


def retention_entry(retention: Retention, now: datetime, count: int) -> dict[str, Any]:
    """``cronlock list``: the built-in task ``prune``, its schedule and what it keeps."""
    upcoming = list(itertools.islice(retention.schedule.fire_times(now), count))
    return {
        "name": "prune",
        "builtin": True,
        "cron": retention.cron,
        "timezone": "UTC",
        "next_fire_times": [t.isoformat() for t in upcoming],
        "retention": retention.to_dict(),
        "description": "built-in: delete completed jobs after "
        f"{_days(retention.completed)}, failed and cancelled after {_days(retention.failed)}, "
        f"runs after {_days(retention.runs)}",
    }


def _days(duration: Any) -> str:
    seconds = duration.total_seconds()
    if seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    return f"{seconds / 3600:g} h"


def builtin_lines(entry: dict[str, Any]) -> list[str]:
    times = ", ".join(_clock_full(t) for t in entry["next_fire_times"]) or "never"
    return [f"{entry['name']} ({entry['cron']} UTC; next {times}): {entry['description']}"]
