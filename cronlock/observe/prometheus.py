"""Prometheus metrics read from the tables at scrape time, so every scraper sees the truth.

``SELECT * FROM jobs`` is the whole truth, and so are the metrics: queue depth by status, the
age of the oldest due job, jobs finished and retries made, the created→completed latency
histogram, active and standby drainers, paused and unserved queues, and per periodic task its
runs by outcome, last success, consecutive failures, how overdue it is (from its schedule at
scrape time, so it rises while nothing runs at all; 0 while it is paused), whether it is paused
and how many of its items are parked, and duration and lateness histograms.
Names follow Prometheus conventions (``cronlock_…_total``, ``_seconds``).

A scrape must stay cheap however long the history (/metrics may be open to anyone): the
counters and the latency histogram of finished jobs come from a rollup, ``job_totals``, which
the scrapes fold forward themselves (``fold``, under a SKIP LOCKED lock of its mark, so two
scrapes never both fold), plus the few jobs finished above its mark and the jobs still open
(cronlock/sql/rollups.py says why no completion, even one committed late, is missed or counted
twice). So pruning no longer lowers the job counters: a job counted stays counted, and
``cronlock_jobs{status="completed"}`` is the completed jobs ever, like
``cronlock_jobs_processed_total``; the gauge's other statuses are the rows in the table now.
The periodic tasks' metrics likewise come from ``run_totals``, folded by run id (``fold_runs``),
plus the runs above its mark and the chunked runs that were still running when folded; pruning
runs lowers none of them either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Row, RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from .. import sql
from ..database import Database
from ..periodic import PeriodicTask, backlog
from ..sql.tables import JOB_STATUSES, RUN_STATUSES
from .serving import is_unserved, live_active

__all__ = [
    "CONTENT_TYPE",
    "FOLD_LAG",
    "fold",
    "fold_runs",
    "render_metrics",
    "scrape",
    "serve_metrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# How far behind the database's clock the rollup's next mark is chosen: the margin for a
# completed_at a little older than its transaction's id (a worker's clock behind the
# database's; the instants between a statement's clock and its first write).
FOLD_LAG = timedelta(seconds=30)


class _Snapshot(Collector):
    """Families computed before the (synchronous) scrape; a registry needs a collector."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _histogram(
    name: str, documentation: str, label: str, rows: Iterable[Mapping[Any, Any]], prefix: str = ""
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=[label])
    for row in rows:
        buckets = [
            (_bound(bound), float(row[f"{prefix}le_{index}"]))
            for index, bound in enumerate(sql.LATENCY_BUCKETS)
        ]
        buckets.append(("+Inf", float(row[f"{prefix}count"])))
        family.add_metric([row[label]], buckets, float(row[f"{prefix}sum"]))
    return family


def _bound(value: float) -> str:
    return repr(float(value))


async def scrape(
    database: Database, periodic: Iterable[PeriodicTask] = (), *, now: datetime | None = None
) -> list[Metric]:
    """Every cronlock metric, read from ``database`` now; ``periodic``, the app's tasks, gives
    the overdue gauge its schedules (``now``: the clock, unless a test says otherwise)."""
    async with database.connect() as conn:
        async with conn.begin():  # both folds, one commit
            await conn.execute(sql.METRICS_FOLD_LOCAL)
            job_mark = await _fold_jobs(conn, now=now, lag=FOLD_LAG)
            run_mark = await _fold_runs(conn, now=now, lag=FOLD_LAG)
        now = now or datetime.now(UTC)
        await conn.execute(sql.METRICS_NO_JIT_LOCAL)  # for this transaction's reads
        counts = (await conn.execute(sql.JOB_COUNTS_OPEN)).mappings().all()
        due = (await conn.execute(sql.JOB_OLDEST_DUE)).mappings().all()
        totals = await _job_totals(conn, job_mark, {row["queue"] for row in counts})
        drainers = (await conn.execute(sql.WORKER_LIST)).mappings().all()
        tasks = await _run_totals(conn, run_mark)
        late = await backlog.overdue_by_task(conn, periodic, now)
        paused = [row.name for row in await conn.execute(sql.QUEUE_LIST) if row.paused_at]
        task_states = {row.name: row.paused_at for row in await conn.execute(sql.TASK_STATES)}
        parked: dict[str, int] = {
            row.task: row.parked for row in await conn.execute(sql.ITEMS_PARKED_COUNTS)
        }

    jobs = GaugeMetricFamily(
        "cronlock_jobs", "Jobs in the jobs table by queue and status.", labels=["queue", "status"]
    )
    seen: dict[str, dict[str, int]] = {}
    for row in counts:
        seen.setdefault(row["queue"], {})[row["status"]] = int(row["count"])
    for total in totals:
        seen.setdefault(total["queue"], {})["completed"] = int(total["completed"])
    for queue, by_status in sorted(seen.items()):
        for status in JOB_STATUSES:
            jobs.add_metric([queue, status], by_status.get(status, 0))

    due_jobs = GaugeMetricFamily("cronlock_jobs_due", "Jobs due now, by queue.", labels=["queue"])
    oldest = GaugeMetricFamily(
        "cronlock_oldest_due_job_age_seconds",
        "How long the oldest due job of each queue has been waiting.",
        labels=["queue"],
    )
    for row in due:
        due_jobs.add_metric([row["queue"]], int(row["due"]))
        age = (row["now"] - row["oldest_due_at"]).total_seconds() if row["oldest_due_at"] else 0
        oldest.add_metric([row["queue"]], max(age, 0.0))

    processed = CounterMetricFamily(
        "cronlock_jobs_processed", "Jobs completed, by queue.", labels=["queue"]
    )
    failed = CounterMetricFamily(
        "cronlock_jobs_failed",
        "Jobs failed for good (retries exhausted), by queue.",
        labels=["queue"],
    )
    retried = CounterMetricFamily(
        "cronlock_jobs_retried",
        "Retries scheduled after failed attempts, by queue.",
        labels=["queue"],
    )
    cancelled = CounterMetricFamily(
        "cronlock_jobs_cancelled",
        "Jobs cancelled (by an operator or by their handler's JobCancel), by queue.",
        labels=["queue"],
    )
    snoozed = CounterMetricFamily(
        "cronlock_jobs_snoozed",
        "Snoozes (a handler's JobSnooze: run again later, the attempt not counted), by queue.",
        labels=["queue"],
    )
    latency_rows = []
    for total in totals:
        cancelled.add_metric([total["queue"]], int(total["cancelled"]))
        snoozed.add_metric([total["queue"]], int(total["snoozes"]))
        processed.add_metric([total["queue"]], int(total["completed"]))
        failed.add_metric([total["queue"]], int(total["failed"]))
        retried.add_metric([total["queue"]], int(total["retries"]))
        latency_rows.append({**total, "count": total["completed"], "sum": total["latency_sum"]})
    latency = _histogram(
        "cronlock_job_latency_seconds",
        "Time from enqueue (created_at) to completion (completed_at) of completed jobs, both "
        "on the database's clock.",
        "queue",
        latency_rows,
    )

    drainer_states = GaugeMetricFamily(
        "cronlock_drainers",
        "Drainer processes with a live heartbeat row, by queue and state (active or standby).",
        labels=["queue", "state"],
    )
    by_state: dict[tuple[str, str], int] = {}
    for row in drainers:
        if not row["alive"]:
            continue  # a drainer that died and left its row (sql.WORKER_LIST's liveness rule)
        key = (row["queue"], row["state"])
        by_state[key] = by_state.get(key, 0) + 1
    for (queue, state), number in sorted(by_state.items()):
        drainer_states.add_metric([queue, state], number)

    paused_gauge, unserved_gauge = _queue_control(due, drainers, paused)

    runs_total = CounterMetricFamily(
        "cronlock_task_runs", "Runs of each periodic task by outcome.", labels=["task", "status"]
    )
    last_success = GaugeMetricFamily(
        "cronlock_task_last_success_timestamp_seconds",
        "When the last run that did the work (completed or partial) started, Unix time.",
        labels=["task"],
    )
    consecutive = GaugeMetricFamily(
        "cronlock_task_consecutive_failures",
        "Failed runs since the task's last success.",
        labels=["task"],
    )
    for row in tasks:
        for status in RUN_STATUSES:
            runs_total.add_metric([row["task"], status], int(row[status]))
        when: datetime | None = row["last_success_at"]
        if when is not None:
            last_success.add_metric([row["task"]], when.timestamp())
        consecutive.add_metric([row["task"]], int(row["consecutive_failures"]))
    overdue = GaugeMetricFamily(
        "cronlock_task_overdue_seconds",
        "How long past its grace the first slot with no outcome is (0: on schedule), per "
        "registered task, from its schedule at scrape time.",
        labels=["task"],
    )
    for name, behind in sorted(late.items()):
        overdue.add_metric([name], 0.0 if behind is None else behind.seconds)
    task_paused = GaugeMetricFamily(
        "cronlock_task_paused",
        "1 while the task is paused (cronlock task pause): its slots are recorded skipped.",
        labels=["task"],
    )
    items_parked = GaugeMetricFamily(
        "cronlock_task_items_parked",
        "Items of the task parked after failing in park_after runs in a row: left out of runs.",
        labels=["task"],
    )
    for name in sorted(set(late) | set(task_states)):
        task_paused.add_metric([name], 0.0 if task_states.get(name) is None else 1.0)
    for name in sorted(set(late) | set(parked)):
        items_parked.add_metric([name], parked.get(name, 0))
    duration = _histogram(
        "cronlock_task_duration_seconds", "How long runs took.", "task", tasks, "duration_"
    )
    lateness = _histogram(
        "cronlock_task_lateness_seconds",
        "How long after its slot (scheduled fire time) a run started.",
        "task",
        tasks,
        "lateness_",
    )
    return [
        jobs,
        due_jobs,
        oldest,
        processed,
        failed,
        retried,
        cancelled,
        snoozed,
        latency,
        drainer_states,
        paused_gauge,
        unserved_gauge,
        runs_total,
        last_success,
        consecutive,
        overdue,
        task_paused,
        items_parked,
        duration,
        lateness,
    ]


async def fold(
    database: Database, *, now: datetime | None = None, lag: timedelta = FOLD_LAG
) -> datetime | None:
    """Move the jobs rollup forward (cronlock/sql/rollups.py), in a transaction of its own;
    its mark after (None: another scrape holds it, and folds). ``now``: the database's clock
    unless a test says otherwise; ``lag``: how far behind it a new pending point is chosen."""
    async with database.connect() as conn, conn.begin():
        await conn.execute(sql.METRICS_FOLD_LOCAL)
        return await _fold_jobs(conn, now=now, lag=lag)


async def _take_mark(
    conn: AsyncConnection, take: Executable, values: dict[str, Any]
) -> Row[Any] | None:
    """The mark row ``take`` locks (None: another scrape holds it). With no row (its migration
    writes it; a TRUNCATE of cronlock's tables takes it) one is made now, so this fold chooses
    its first point."""
    mark = (await conn.execute(take, values)).one_or_none()
    if mark is None and (await conn.execute(sql.METRIC_MARK_GET, values)).first() is None:
        await conn.execute(sql.METRIC_MARK_CREATE, values)
        mark = (await conn.execute(take, values)).one_or_none()
    return mark


async def _fold_jobs(
    conn: AsyncConnection, *, now: datetime | None, lag: timedelta
) -> datetime | None:
    """``fold``'s work, in the caller's transaction."""
    values = {"mark": sql.JOBS_MARK, "now": now, "lag_seconds": lag.total_seconds()}
    mark = await _take_mark(conn, sql.METRIC_MARK_TAKE, values)
    if mark is None:
        return None
    through: datetime = mark.through
    pending: datetime | None = mark.pending_through
    if pending is not None and not mark.ready:
        return through  # a transaction the pending point waits for is still open
    if pending is not None:
        await conn.execute(sql.JOB_TOTALS_FOLD, {"after": through, "through": pending})
        through = pending
    candidate: datetime = mark.candidate
    if candidate > through:
        new = {"new_pending_through": candidate, "new_pending_xids": list(mark.holders)}
    else:
        new = {"new_pending_through": None, "new_pending_xids": None}
    await conn.execute(sql.METRIC_MARK_MOVE, {"mark": sql.JOBS_MARK, "new_through": through, **new})
    return through


async def fold_runs(
    database: Database, *, now: datetime | None = None, lag: timedelta = FOLD_LAG
) -> int | None:
    """Move the runs rollup forward (cronlock/sql/rollups.py), in a transaction of its own;
    its mark's id after (None: another scrape holds it, and folds). ``now`` and ``lag`` as
    ``fold``'s: a run id seen at one scrape becomes the pending point at the first scrape
    ``lag`` later, and is folded to at the first after that whose waited-for transactions
    have all ended."""
    async with database.connect() as conn, conn.begin():
        await conn.execute(sql.METRICS_FOLD_LOCAL)
        mark = await _fold_runs(conn, now=now, lag=lag)
    return None if mark is None else mark[0]


async def _fold_runs(
    conn: AsyncConnection, *, now: datetime | None, lag: timedelta
) -> tuple[int, list[int]] | None:
    """``fold_runs``' work, in the caller's transaction; the mark after (its id, its open
    ids), None if another scrape holds it."""
    values: dict[str, Any] = {"mark": sql.RUNS_MARK, "now": now, "lag_seconds": lag.total_seconds()}
    mark = await _take_mark(conn, sql.RUN_MARK_TAKE, values)
    if mark is None:
        return None
    through: int = mark.through_id
    opened: list[int] = list(mark.open_ids)
    pending: int | None = mark.pending_id
    waiting: list[str] | None = mark.pending_xids
    noted: int | None = mark.noted_id
    noted_at: datetime | None = mark.noted_at
    if pending is not None:
        if not mark.ready:
            return through, opened  # a transaction the pending point waits for is open
        values = {"after": through, "through": pending, "open_ids": opened}
        folded = (await conn.execute(sql.RUN_TOTALS_FOLD, values)).one()
        through, opened, pending, waiting = pending, sorted(folded.running), None, None
    if noted is not None and noted_at is not None and noted_at <= mark.candidate:
        if noted > through:
            pending, waiting = noted, list(mark.holders)
        noted = noted_at = None
    if noted is None and mark.newest is not None and mark.newest > through:
        noted, noted_at = mark.newest, mark.clock
    moved = {
        "new_through_id": through,
        "new_open_ids": opened,
        "new_pending_id": pending,
        "new_pending_xids": waiting,
        "new_noted_id": noted,
        "new_noted_at": noted_at,
    }
    await conn.execute(sql.RUN_MARK_MOVE, {"mark": sql.RUNS_MARK, **moved})
    return through, opened


async def _run_totals(
    conn: AsyncConnection, mark: tuple[int, list[int]] | None
) -> Sequence[RowMapping]:
    """Per task, the runs' totals (sql.RUN_TOTALS' columns): the rollup plus the runs above
    its ``mark`` (as this scrape's fold left it; None: read it) and the open ones, read again
    in the rare case another fold committed since."""
    while True:
        if mark is None:
            marked = (await conn.execute(sql.RUN_MARK_GET, {"mark": sql.RUNS_MARK})).first()
            mark = (marked.through_id, list(marked.open_ids)) if marked else (0, [])
        through, opened = mark
        values: dict[str, Any] = {"through": through, "open_ids": opened}
        rows = (await conn.execute(sql.RUN_TOTALS_NOW, values)).mappings().all()
        if all(row["mark"] in (None, through) for row in rows):
            return rows
        mark = None


async def _job_totals(
    conn: AsyncConnection, through: datetime | None, queues: Collection[str]
) -> list[dict[str, Any]]:
    """Per queue, the jobs' counters: the rollup plus the jobs above its mark ``through`` (as
    this scrape's fold left it; None: read it) plus the open jobs, read again in the rare case
    another fold committed since. ``queues``: queues with open jobs, reported (at 0, so no
    series is missing) though no job of theirs has finished, retried or snoozed."""
    while True:
        if through is None:
            marked = await conn.execute(sql.METRIC_MARK_GET, {"mark": sql.JOBS_MARK})
            through = marked.scalar_one_or_none() or _NO_MARK
        parts = (await conn.execute(sql.JOB_TOTALS_NOW, {"through": through})).mappings().all()
        if all(part["mark"] in (None, through) for part in parts):
            return _add_up(parts, queues)
        through = None


# The mark before any fold (the migration's default): every finished job lies above it.
_NO_MARK = datetime(1970, 1, 1, tzinfo=UTC)

_SUMMED = ("completed", "failed", "cancelled", "retries", "snoozes")


def _add_up(parts: Iterable[Mapping[Any, Any]], queues: Iterable[str]) -> list[dict[str, Any]]:
    """One row per queue from sql.JOB_TOTALS_NOW's parts (rollup, above the mark, open), and
    one of zeros per queue of ``queues`` with none."""
    names = [*_SUMMED, *(f"le_{index}" for index in range(len(sql.LATENCY_BUCKETS)))]
    rows = {
        queue: {"queue": queue, "latency_sum": 0.0, **dict.fromkeys(names, 0)}
        for queue in {*queues, *(part["queue"] for part in parts)}
    }
    for part in parts:
        row = rows[part["queue"]]
        for name in names:
            row[name] += int(part[name])
        row["latency_sum"] += float(part["latency_sum"])
    return [rows[queue] for queue in sorted(rows)]


def _queue_control(
    due: Iterable[Mapping[Any, Any]], drainers: Iterable[Mapping[Any, Any]], paused: list[str]
) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """Paused queues, and queues with due jobs that no live drainer takes (observe.serving's
    rule): computed from rows the scrape already read, plus the small queues table."""
    paused_gauge = GaugeMetricFamily(
        "cronlock_queue_paused", "1 for a queue an operator paused.", labels=["queue"]
    )
    for name in sorted(paused):
        paused_gauge.add_metric([name], 1)
    unserved_gauge = GaugeMetricFamily(
        "cronlock_queue_unserved",
        "1 for a queue whose jobs have been due for over two minutes with no live active "
        "drainer (and not paused), else 0.",
        labels=["queue"],
    )
    active = live_active(drainers)
    for row in due:
        age = (row["now"] - row["oldest_due_at"]).total_seconds() if row["oldest_due_at"] else 0
        flagged = is_unserved(
            due=int(row["due"]),
            oldest_due_age_seconds=age,
            active_drainers=active.get(row["queue"], 0),
            paused=row["queue"] in paused,
        )
        unserved_gauge.add_metric([row["queue"]], 1 if flagged else 0)
    return paused_gauge, unserved_gauge


def render_metrics(families: list[Metric]) -> bytes:
    """The Prometheus text exposition of ``families``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    return generate_latest(registry)


logger = logging.getLogger("cronlock.prometheus")


async def serve_metrics(
    database: Database, host: str, port: int, periodic: Iterable[PeriodicTask] = ()
) -> asyncio.Server:
    """A minimal HTTP endpoint for ``GET /metrics`` inside a worker's own event loop.

    The worker already runs asyncio and holds the database; a scrape is one short read, so a
    thread-based server (prometheus_client's) would only add a second event loop for the DB.
    ``periodic``: the app's tasks, for the overdue gauge.
    """
    tasks = list(periodic)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            method, path, *_ = request.split(b" ", 2)
            if method != b"GET" or path.split(b"?")[0] != b"/metrics":
                status, body, kind = "404 Not Found", b"only GET /metrics here\n", "text/plain"
            else:
                status, kind = "200 OK", CONTENT_TYPE
                body = render_metrics(await scrape(database, tasks))
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except Exception as exc:  # a bad scrape must never take the worker down
            logger.warning("metrics scrape failed: %s", exc, extra={"action": "metrics_failed"})
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port)
