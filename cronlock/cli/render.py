"""Every line the command line prints for people: tables, outcomes, status, notes.

Functions here take values from the library (results, reports, tasks) and return lines; the
commands echo them. ``--json`` output is the values' own ``to_dict()`` or report, not this.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import embedded
from ..app import App
from ..database import Database
from ..outcome import DrainResult, RunResult, RunStatus
from ..queue.control import QueueInfo, QueueState
from ..queue.drainer import Drainer
from ..queue.jobs import Enqueued
from ..queue.operate import JobChange, JobInfo, JobPage, JobsChanged
from ..retention import PruneResult, Retention

__all__ = [
    "bench_failed",
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
    "jobs_changed",
    "migrated",
    "nothing_changed",
    "open_api",
    "overdue_line",
    "pruned",
    "queue_state",
    "queue_table",
    "retention_entry",
    "scheduler_started",
    "serve_started",
    "signal_received",
    "table",
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


def bench_failed(exc: Exception) -> str:
    return f"cronlock bench: {exc}"


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


def task_table(rows: list[dict[str, Any]]) -> list[str]:
    """``cronlock list`` for people: a line per upcoming fire time."""
    if not rows:
        return ["no periodic tasks registered"]
    header = ("NAME", "CRON", "TIMEZONE", "LOCK (ns, key)", "MISFIRE", "NEXT (zone)", "NEXT (UTC)")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        times = row["next_fire_times"] or [{"local": "never", "utc": "never"}]
        for index, fire in enumerate(times):
            first = index == 0
            lines.append(
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
    return table(lines)


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
        kept = (
            f"its {result.chunks} committed chunk(s), {result.items_ok} items, stay"
            if result.chunks
            else "nothing of the run was committed"
        )
        lines.append(f"  error: {result.error} ({kept})")
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
        return [f"{command} {result.queue}: skipped ({result.skip_reason})"]
    outcome = (
        result.status.value
        if interrupted is None or result.status is RunStatus.FAILED
        else f"interrupted ({interrupted.name})"
    )
    lines = [
        f"{command} {result.queue}: {outcome} — {stats['processed']} completed, "
        f"{stats['retried']} retrying, {stats['failed']} failed in {stats['elapsed_seconds']} s "
        f"({stats['throughput_per_sec']} jobs/s, p95 {stats['p95_latency_ms']} ms)"
    ]
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


def migrated(database: Database, revision: str) -> str:
    return (
        f"cronlock: schema {database.schema!r} is at revision {revision} in {database.display_url}"
    )


def describe_status(report: dict[str, Any]) -> list[str]:
    """``cronlock status`` for people: each task's last runs and health, then the queue."""
    lines = []
    for entry in report["tasks"]:
        runs = entry["last_runs"]
        lines.append(f"{entry['task']}: " + ("never ran" if not runs else f"last {len(runs)} runs"))
        lines.append("  " + health_line(entry))
        if entry.get("overdue"):
            lines.append("  " + overdue_line(entry["overdue"]))
        for run in runs:
            detail = (
                run["error"]
                or run["skip_reason"]
                or (f"{run['items_ok']} ok, {run['items_failed']} failed")
            )
            slot = run.get("slot") or ("manual" if run.get("trigger") == "manual" else "none")
            lines.append(f"  {run['started_at']}  {run['status']:<9}  slot {slot}  {detail}")
    return lines + describe_queue(report["queue"])


def health_line(entry: dict[str, Any]) -> str:
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


def overdue_line(overdue: dict[str, Any]) -> str:
    return (
        f"OVERDUE {overdue['seconds']:.0f} s: slot {overdue['slot']} has no outcome "
        f"(due by {overdue['due_by']})"
    )


def describe_queue(queue: dict[str, Any]) -> list[str]:
    """``cronlock status``'s queue part in readable lines."""
    lines = []
    for entry in queue["queues"]:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(entry["counts"].items()))
        age = entry["oldest_due_age_seconds"]
        oldest = f"; {entry['due']} due, oldest waiting {age:.1f} s" if age is not None else ""
        flags = ""
        if entry.get("paused"):
            flags = f" — PAUSED since {entry['paused_at']} (cronlock queue resume)"
        elif entry.get("unserved"):
            flags = " — UNSERVED: due jobs and no live drainer (start a worker or a drain)"
        lines.append(f"queue {entry['queue']}: {counts or 'empty'}{oldest}{flags}")
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
        f"  started     {_iso(job.started_at)}",
        f"  finished    {_iso(job.completed_at)}",
        f"  dedup key   {job.dedup_key or 'none'}",
        f"  payload     {json.dumps(job.payload)}",
        f"  result      {json.dumps(job.result)}",
    ]
    if job.error_message:
        lines.append(f"  error       {job.error_message}")
    for entry in job.error_history:
        lines.append(f"  attempt {entry.get('attempt')} at {entry.get('at')}: {entry.get('error')}")
    return lines


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


def queue_table(queues: list[QueueInfo]) -> list[str]:
    """``cronlock queue list``."""
    if not queues:
        return ["no queues"]
    rows: list[tuple[str, ...]] = [("QUEUE", "STATE", "DUE", "OLDEST DUE", "DRAINERS", "JOBS")]
    for queue in queues:
        state = "paused" if queue.paused else "UNSERVED" if queue.unserved else "running"
        age = queue.oldest_due_age_seconds
        counts = ", ".join(f"{n} {status}" for status, n in sorted(queue.counts.items()))
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
    times = ", ".join(entry["next_fire_times"]) or "never"
    return [f"{entry['name']} ({entry['cron']} UTC; next {times}): {entry['description']}"]
