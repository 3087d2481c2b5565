"""Every feature in every mode (DESIGN.md invariant 12): one scenario per feature, run in each
of the six cells {strict, batch, lease} by {exclusive, shared} of ``matrix.MATRIX``.

A cell that works runs its scenario; a refused cell expects the one line of its refusal and
nothing written; a known-broken cell runs its scenario as a strict xfail (the run fails the
day it passes: flip it to ``WORKS``, and the README's ✗ to ✓). Each cell has a database of its
own and an app of its own (``Lab``: the handlers every scenario uses, their gates and their
counts), drainers in this process with short intervals, and no waiting on a real clock:
backoffs, delays and snoozes are crossed with an injected clock, everything else is polled
with a deadline or held on a gate.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from jobsupport import job_rows
from matrix import CELLS, MATRIX, Cell, KnownBroken, Refused
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from waiting import Gate, ended_within, eventually

from cronlock import (
    App,
    Backoff,
    ChangeOutcome,
    CronlockError,
    Database,
    DrainResult,
    Enqueued,
    InvalidPayload,
    JobCancel,
    JobFailed,
    JobSnooze,
    RunStatus,
    UnknownJobType,
)
from cronlock.queue import waits
from cronlock.queue.drainer import Drainer
from cronlock.sql.tables import jobs
from cronlock.tracing import instrument

QUEUE = "default"


class Greeting(BaseModel):
    """The typed rows' pydantic payload (with a typed result, ``Greeted``)."""

    name: str
    at: datetime
    times: int = 1


class Greeted(BaseModel):
    text: str


@dataclass
class Shape:
    """The typed rows' dataclass payload, for a plain def handler."""

    sides: int
    label: str | None = None


class Meeting:
    """Jobs that count themselves while they run and wait (up to a deadline) until ``size``
    of them run at once: a peak below ``size`` then means they could not, not that they
    happened not to overlap."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.running = 0
        self.peak = 0
        self.met = asyncio.Event()

    async def attend(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        if self.running >= self.size:
            self.met.set()
        try:
            await asyncio.wait_for(self.met.wait(), 5)
        except TimeoutError:
            self.met.set()  # they cannot meet: the peak says so, and the others need not wait
        finally:
            self.running -= 1


@dataclass
class Lab:
    """One cell's app with every scenario's handlers, and what they did."""

    cell: Cell
    app: App
    database: Database
    gates: dict[str, Gate] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)  # handler calls per gate key
    order: list[int] = field(default_factory=list)  # payload n, as "record" ran them
    pids: list[int] = field(default_factory=list)  # the lane backends "pid_held" ran on
    snoozed: set[str] = field(default_factory=set)
    meetings: dict[str, Meeting] = field(default_factory=dict)
    never: asyncio.Event = field(default_factory=asyncio.Event)
    received: list[Any] = field(default_factory=list)  # what the typed handlers were given

    def gate(self, key: str) -> Gate:
        return self.gates.setdefault(key, Gate())

    def drainer(self, **options: Any) -> Drainer:
        settings: dict[str, Any] = {
            "commit_mode": self.cell.commit_mode,
            "shared": self.cell.shared,
            "poll_interval": 0.05,
            "heartbeat_interval": 0.1,
            "sweep_interval": 0.1,
            **options,
        }
        return self.app.drainer(**settings)

    async def drain(self, **options: Any) -> DrainResult:
        result = await self.drainer(**options).drain(max_seconds=30)
        assert result.error is None, result.error
        return result

    async def add(self, job_type: str, payload: Any = None, **options: Any) -> Enqueued:
        """One job, committed on its own (every scenario enqueues through here)."""
        return await self.app.enqueue(job_type, payload, **options)

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> uuid.UUID:
        return (await self.add(job_type, payload, **options)).id

    async def row(self, job_id: uuid.UUID) -> dict[str, Any]:
        [row] = await job_rows(self.database, id=job_id)
        return row

    async def status(self, job_id: uuid.UUID) -> str:
        return str((await self.row(job_id))["status"])

    async def log(self) -> list[tuple[str, str]]:
        async with self.database.connect() as conn:
            rows = await conn.execute(text("SELECT job, run FROM matrix_log ORDER BY job, run"))
            return [(job, run) for job, run in rows]


def _install(lab: Lab) -> None:
    app = lab.app

    async def write(session: AsyncSession, key: str, run: int) -> None:
        await session.execute(
            text("INSERT INTO matrix_log VALUES (:job, :run)"), {"job": key, "run": str(run)}
        )

    @app.job("noop")
    async def noop(_session: AsyncSession, _payload: Any) -> None:
        return None

    @app.job("record")
    async def record(_session: AsyncSession, payload: Any) -> None:
        lab.order.append(payload["n"])

    async def held_run(session: AsyncSession, payload: Any) -> int:
        """Held on the gate of ``payload["key"]``, writing a line before or after it."""
        key = payload["key"]
        run = lab.runs[key] = lab.runs.get(key, 0) + 1
        gate = lab.gate(key)
        if payload.get("write") == "before":
            await write(session, key, run)
        await gate.hold()
        if payload.get("write") == "after":
            await write(session, key, run)
        return run

    @app.job("held", max_retries=0)
    async def held(session: AsyncSession, payload: Any) -> Any:
        return {"run": await held_run(session, payload)}

    @app.job("held_fragile", max_retries=0, max_lost_runs=1)
    async def held_fragile(session: AsyncSession, payload: Any) -> Any:
        return {"run": await held_run(session, payload)}

    @app.job("held_then_fail", max_retries=2, backoff=Backoff(base=60, jitter=0))
    async def held_then_fail(session: AsyncSession, payload: Any) -> None:
        await held_run(session, payload)
        raise RuntimeError("failed after the gate")

    @app.job("pid_held", max_retries=1, backoff=Backoff(base=60, jitter=0))
    async def pid_held(session: AsyncSession, payload: Any) -> None:
        lab.pids.append(int((await session.execute(select(func.pg_backend_pid()))).scalar_one()))
        await lab.gate(payload["key"]).hold()

    @app.job("fails", max_retries=2, backoff=Backoff(base=10, factor=2, jitter=0))
    async def fails(_session: AsyncSession, _payload: Any) -> None:
        raise RuntimeError("always fails")

    @app.job("fails_now", max_retries=0)
    async def fails_now(_session: AsyncSession, _payload: Any) -> None:
        raise RuntimeError("fails at once")

    @app.job("directed")
    async def directed(_session: AsyncSession, payload: Any) -> Any:
        if payload.get("cancel"):
            return JobCancel("not wanted")
        if payload["key"] not in lab.snoozed:
            lab.snoozed.add(payload["key"])
            return JobSnooze(60)
        return {"done": True}

    @app.job("limited", concurrency_limit=2)
    async def limited(_session: AsyncSession, payload: Any) -> None:
        await lab.meetings[payload["meeting"]].attend()

    @app.job("slow", max_retries=0, timeout=0.05)
    async def slow(_session: AsyncSession, _payload: Any) -> None:
        await lab.never.wait()

    @app.job("untimed", max_retries=0)
    async def untimed(_session: AsyncSession, _payload: Any) -> None:
        await lab.never.wait()

    # Plain def handlers: a sync Session on the job's own transaction, in the drainer's threads.
    @app.job("plain_writes")
    def plain_writes(session: Session, payload: Any) -> Any:
        session.execute(
            text("INSERT INTO matrix_log VALUES (:job, :run)"), {"job": payload["key"], "run": "1"}
        )
        if payload.get("fail"):
            raise RuntimeError("failed after its write")
        return {"wrote": payload["key"]}

    @app.job("typed", max_retries=0, payload=Greeting, result=Greeted)
    async def typed(_session: AsyncSession, payload: Greeting) -> Greeted:
        lab.received.append(payload)
        return Greeted(text=f"hello {payload.name} x{payload.times}")

    @app.job("typed_plain", max_retries=0, payload=Shape)
    def typed_plain(session: Session, payload: Shape) -> Any:
        lab.received.append(payload)
        session.execute(
            text("INSERT INTO matrix_log VALUES (:job, :run)"),
            {"job": f"shape-{payload.sides}", "run": "1"},
        )
        return {"sides": payload.sides}

    @app.job("results")
    async def results(_session: AsyncSession, payload: Any) -> Any:
        return {
            "amount": Decimal("12.30"),
            "day": date(2026, 12, 2),
            "at": datetime(2026, 12, 2, 6, 30, tzinfo=UTC),
            "echo": payload,
        }


@asynccontextmanager
async def _lab(database: Database, cell: Cell) -> AsyncIterator[Lab]:
    async with database.engine.begin() as conn:
        await conn.execute(text("CREATE TABLE matrix_log (job text NOT NULL, run text NOT NULL)"))
    app = App()
    lab = Lab(cell, app, database)
    _install(lab)
    app.use_database(str(database.url))
    try:
        yield lab
    finally:
        lab.never.set()
        for gate in lab.gates.values():
            gate.release.set()
        await app.aclose()


def at(moment: datetime) -> Callable[[], datetime]:
    return lambda: moment


@asynccontextmanager
async def _working(drainer: Drainer) -> AsyncIterator[asyncio.Task[DrainResult]]:
    """``drainer.work()`` in the background; stopped and awaited (with a deadline) after."""
    task = asyncio.create_task(drainer.work())
    try:
        yield task
    finally:
        drainer.stop()
        await ended_within([task], timeout=30, about="the drainer")


async def _reached(gate: Gate) -> None:
    await asyncio.wait_for(gate.reached.wait(), 10)


async def _waiting_with_key(database: Database, key: str) -> list[uuid.UUID]:
    """The jobs that hold ``key`` now: waiting or running (the key's promise)."""
    async with database.connect() as conn:
        rows = await conn.execute(
            select(jobs.c.id).where(
                jobs.c.dedup_key == key,
                jobs.c.status.in_(["pending", "retrying", "processing"]),
            )
        )
        return list(rows.scalars())


async def _backends(database: Database, *names: str) -> list[int]:
    async with database.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = ANY(:names)"
            ),
            {"names": list(names)},
        )
        return [pid for (pid,) in rows]


async def _terminate(database: Database, pids: list[int]) -> None:
    """End backends as a dead host's are ended, and wait until they are gone (their locks
    with them)."""
    async with database.connect() as conn:
        for pid in pids:
            await conn.execute(select(func.pg_terminate_backend(pid)))

    async def gone() -> bool:
        return not await _alive(database, pids)

    await eventually(gone)


async def _alive(database: Database, pids: list[int]) -> list[int]:
    async with database.connect() as conn:
        rows = await conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE pid = ANY(:pids)"), {"pids": pids}
        )
        return [pid for (pid,) in rows]


async def _lose_the_worker(lab: Lab) -> None:
    """What PostgreSQL sees of a worker whose host died: its lock connections end (the
    drainer's lock and, in the lease mode, its liveness lock)."""
    names = (f"cronlock-drainer:{QUEUE}", f"cronlock-liveness:{QUEUE}")
    pids = await _backends(lab.database, *names)
    assert len(pids) == (2 if lab.cell.lease else 1), pids
    await _terminate(lab.database, pids)


async def _drained_one(lab: Lab) -> DrainResult:
    """Drain until a drain ran a job (the lost worker's row lock may outlive it a moment)."""
    found: list[DrainResult] = []

    async def ran() -> bool:
        result = await lab.drain()
        found.append(result)
        return bool(result.stats["processed"] or result.stats["failed"])

    await eventually(ran, timeout=15, interval=0.05)
    return found[-1]


# -- the scenarios, one per feature --------------------------------------------------------


async def dedup_while_waiting(lab: Lab) -> None:
    first = await lab.add("noop", {}, dedup_key="k", delay=60)
    again = await lab.add("record", {"n": 1}, dedup_key="k")
    assert (again.created, again.id) == (False, first.id)
    now = datetime.now(UTC)
    done = await lab.drain(clock=at(now + timedelta(seconds=61)))
    assert done.stats["processed"] == 1 and lab.order == []
    assert (await lab.row(first.id))["status"] == "completed"
    # Done for good: the key is free again.
    assert (await lab.add("noop", {}, dedup_key="k")).created


async def dedup_while_running(lab: Lab) -> None:
    gate = lab.gate("a")
    first = await lab.add("held", {"key": "a"}, dedup_key="k")
    draining = asyncio.create_task(lab.drain())
    await _reached(gate)
    again = await lab.add("held", {"key": "a"}, dedup_key="k")
    gate.release.set()
    await ended_within([draining], about="the drain")
    assert (again.created, again.id) == (False, first.id), "a second job while the first ran"
    assert (await lab.row(first.id))["status"] == "completed"
    assert lab.runs == {"a": 1}
    assert (await lab.add("noop", {}, dedup_key="k")).created


async def dedup_retry_of_a_job_whose_key_another_took(lab: Lab) -> None:
    # An operator's retry of a failed job whose key a newer job holds leaves it alone.
    failed = await lab.enqueue("fails_now", {}, dedup_key="k")
    assert (await lab.drain()).stats["failed"] == 1
    newer = await lab.add("noop", {}, dedup_key="k")
    assert newer.created
    assert (await lab.app.retry_job(failed)).outcome is ChangeOutcome.DEDUP_KEY_HELD
    assert (await lab.drain()).stats["processed"] == 1
    assert (await lab.row(failed))["status"] == "failed"
    # A job that fails while it runs: its retry keeps the key, whatever was enqueued with the
    # key meanwhile (the sequence), and the worker goes on.
    gate = lab.gate("r")
    first = await lab.enqueue("held_then_fail", {"key": "r"}, dedup_key="r")
    drainer = lab.drainer()
    async with _working(drainer) as working:
        await _reached(gate)
        later = await lab.add("noop", {}, dedup_key="r", delay=60)
        gate.release.set()

        async def retried() -> bool:
            return working.done() or await lab.status(first) == "retrying"

        await eventually(retried)
        assert not working.done(), f"the worker ended: {working.result()}"
    assert (await working).error is None
    row = await lab.row(first)
    assert (row["status"], row["retry_count"]) == ("retrying", 1)
    assert (later.created, later.id) == (False, first)
    assert await _waiting_with_key(lab.database, "r") == [first]
    assert (await lab.drain()).status is not RunStatus.FAILED  # a new drainer starts


async def dedup_concurrent_enqueues(lab: Lab) -> None:
    answers = await asyncio.gather(*(lab.add("noop", {}, dedup_key="k") for _ in range(8)))
    assert sum(answer.created for answer in answers) == 1
    assert len({answer.id for answer in answers}) == 1
    assert (await lab.drain()).stats["processed"] == 1
    assert len(await job_rows(lab.database)) == 1


async def per_key_concurrency_limit(lab: Lab) -> None:
    lab.meetings = {"keyed": Meeting(2), "free": Meeting(2)}
    for _ in range(10):
        await lab.add("limited", {"meeting": "keyed"}, concurrency_key="k")
        await lab.add("limited", {"meeting": "free"})
    # Exclusive: one drainer of four lanes; shared: two of two.
    drainers = (
        [lab.drainer(concurrency=2, batch_size=2) for _ in range(2)]
        if lab.cell.shared
        else [lab.drainer(concurrency=4, batch_size=2)]
    )
    while True:
        # A lane ends when its claim finds nothing, which a key's slots held for a moment by
        # other lanes' claims can make it find: drained again until a round runs nothing.
        results = await asyncio.gather(*(d.drain(max_seconds=30) for d in drainers))
        assert [r.error for r in results] == [None] * len(drainers)
        if not sum(r.stats["processed"] for r in results):
            break
        drainers = [lab.drainer(concurrency=d.concurrency, batch_size=2) for d in drainers]
    statuses = {row["status"] for row in await job_rows(lab.database)}
    assert statuses == {"completed"}, statuses
    assert lab.meetings["keyed"].peak == 2  # the limit, reached and never passed
    assert lab.meetings["free"].peak >= 2  # the lanes do run jobs at once


async def priority(lab: Lab) -> None:
    for n, rank in enumerate([0, 5, 1, 10, -3]):
        await lab.enqueue("record", {"n": n}, priority=rank)
    assert (await lab.drain()).stats["processed"] == 5
    assert lab.order == [3, 1, 2, 0, 4]


async def delay_and_run_at(lab: Lab) -> None:
    start = datetime.now(UTC)
    await lab.enqueue("record", {"n": 1})
    await lab.enqueue("record", {"n": 2}, delay=60)
    await lab.enqueue("record", {"n": 3}, run_at=start + timedelta(seconds=120))
    for seconds, expected in ((5, [1]), (59, [1]), (65, [1, 2]), (121, [1, 2, 3])):
        await lab.drain(clock=at(start + timedelta(seconds=seconds)))
        assert lab.order == expected, seconds


async def retries_and_backoff(lab: Lab) -> None:
    start = datetime.now(UTC) + timedelta(seconds=5)  # after the enqueue
    job = await lab.enqueue("fails", {})
    first = await lab.drain(clock=at(start))
    assert (first.stats["retried"], first.status) == (1, RunStatus.PARTIAL)
    row = await lab.row(job)
    assert (row["status"], row["retry_count"]) == ("retrying", 1)
    assert row["run_at"] == row["next_retry_at"] == start + timedelta(seconds=10)
    early = await lab.drain(clock=at(start + timedelta(seconds=9)))
    assert early.stats["retried"] == early.stats["failed"] == 0
    await lab.drain(clock=at(start + timedelta(seconds=10)))
    row = await lab.row(job)
    assert row["retry_count"] == 2
    assert row["run_at"] == start + timedelta(seconds=30)  # 10 s, then 20 s
    last = await lab.drain(clock=at(start + timedelta(seconds=30)))
    assert last.stats["failed"] == 1
    row = await lab.row(job)
    assert (row["status"], row["retry_count"]) == ("failed", 2)
    assert row["error_message"] == "RuntimeError: always fails"
    assert [entry["attempt"] for entry in row["error_history"]] == [1, 2, 3]


async def timeout_of_the_type(lab: Lab) -> None:
    job = await lab.enqueue("slow", {})
    assert (await lab.drain()).stats["failed"] == 1
    row = await lab.row(job)
    assert row["status"] == "failed"
    assert row["error_message"] == (
        "TimeoutError: the handler ran longer than its timeout of 0.05 s"
    )


async def timeout_per_job(lab: Lab) -> None:
    job = await lab.enqueue("untimed", {}, timeout=0.05)  # the type has none
    assert (await lab.drain()).stats["failed"] == 1
    row = await lab.row(job)
    assert row["status"] == "failed"
    assert row["error_message"].startswith("TimeoutError"), row["error_message"]


async def cancel_and_snooze_returned(lab: Lab) -> None:
    start = datetime.now(UTC) + timedelta(seconds=5)  # after the enqueues
    cancelled = await lab.enqueue("directed", {"cancel": True})
    snoozed = await lab.enqueue("directed", {"key": "s"})
    first = await lab.drain(clock=at(start))
    assert first.status is RunStatus.COMPLETED  # outcomes, not failures
    assert (first.stats["cancelled"], first.stats["snoozed"], first.stats["failed"]) == (1, 1, 0)
    row = await lab.row(cancelled)
    assert (row["status"], row["retry_count"]) == ("cancelled", 0)
    assert row["error_message"] == "cancelled by its handler: not wanted"
    row = await lab.row(snoozed)
    assert (row["status"], row["retry_count"]) == ("pending", 0)
    assert row["run_at"] == start + timedelta(seconds=60)
    then = await lab.drain(clock=at(start + timedelta(seconds=61)))
    assert (then.stats["processed"], then.stats["snoozed"]) == (1, 0)
    row = await lab.row(snoozed)
    assert (row["status"], row["retry_count"], row["result"]) == ("completed", 0, {"done": True})
    assert [entry["outcome"] for entry in row["error_history"]] == ["snoozed"]


async def cooperative_cancel(lab: Lab) -> None:
    gate = lab.gate("c")
    target = await lab.enqueue("held", {"key": "c", "write": "before"})
    other = await lab.enqueue("noop", {})
    drainer = lab.drainer()
    async with _working(drainer):
        await _reached(gate)
        change = await lab.app.cancel_job(target, wait=10)
        assert change.outcome is ChangeOutcome.CANCELLED, change.detail

        async def other_done() -> bool:
            return await lab.status(other) == "completed"

        await eventually(other_done)
    row = await lab.row(target)
    assert (row["status"], row["retry_count"]) == ("cancelled", 0)
    [entry] = row["error_history"]
    assert entry["outcome"] == "cancelled" and "by an operator while running" in entry["error"]
    assert await lab.log() == []  # its write rolled back
    assert drainer.stats.cancelled == 1 and drainer.stats.failed == 0


async def pause_and_resume(lab: Lab) -> None:
    await lab.app.pause_queue(QUEUE)
    job = await lab.enqueue("noop", {})
    assert (await lab.drain()).stats["processed"] == 0
    assert (await lab.row(job))["status"] == "pending"
    await lab.app.resume_queue(QUEUE)
    assert (await lab.drain()).stats["processed"] == 1
    assert (await lab.row(job))["status"] == "completed"


async def tracing_spans(lab: Lab) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        instrument(lab.app, tracer_provider=provider)
        ok = await lab.enqueue("noop", {})
        bad = await lab.enqueue("fails_now", {})
        await lab.drain()
        spans = exporter.get_finished_spans()
    finally:
        provider.shutdown()
    enqueues = [span for span in spans if span.name.startswith("enqueue ")]
    assert len(enqueues) == 2
    attempts: dict[str, Any] = {}
    for span in spans:
        if span.name.startswith("job ") and span.attributes is not None:
            attempts[str(span.attributes["cronlock.job_id"])] = span
    assert set(attempts) == {str(ok), str(bad)}, [span.name for span in spans]
    for job_id, enqueue in ((ok, enqueues[0]), (bad, enqueues[1])):
        span = attempts[str(job_id)]
        assert span.context.trace_id == enqueue.context.trace_id
        assert span.parent is not None and span.parent.span_id == enqueue.context.span_id
    outcomes = {job: span.attributes["cronlock.outcome"] for job, span in attempts.items()}
    assert outcomes == {str(ok): "completed", str(bad): "failed"}


async def lost_worker(lab: Lab) -> None:
    gate = lab.gate("a")
    job = await lab.enqueue("held", {"key": "a", "write": "after"})
    lost = lab.drainer()
    async with _working(lost) as working:
        await _reached(gate)
        await _lose_the_worker(lab)
        if not lab.cell.lease:
            # Its lock gone, it rolls its jobs in flight back at once and stops.
            await ended_within([working], about="the worker that lost its lock")
        lab.gates["a"] = Gate()  # the next run goes through
        lab.gates["a"].release.set()
        taken = await _drained_one(lab)
        assert taken.stats["processed"] == 1
        gate.release.set()  # the lost worker wakes, if it still can
    row = await lab.row(job)
    assert (row["status"], row["result"], row["retry_count"]) == ("completed", {"run": 2}, 0)
    if lab.cell.lease:
        assert row["lost_runs"] == 1  # returned by whichever worker's sweep saw it first
        [entry] = [e for e in row["error_history"] if "lost_run" in e]
        assert entry["error"] == f"worker lost: {lost.worker_id} ended while the job ran"
        # Its completion, late, was not applied: recorded, and counted.
        [fenced] = [e for e in row["error_history"] if "fenced" in e]
        assert fenced["fenced"] == {"owner": str(lost.worker_id), "attempt": 1}
        assert lost.stats.fenced == 1
    else:
        # The transaction is the lease: nothing of the lost run committed, not even its loss.
        assert row["lost_runs"] == 0 and row["error_history"] == []
        assert lost.stats.processed == 0
    assert await lab.log() == [("a", "2")]  # the successor's write, once


async def stopped_after_lost_runs(lab: Lab) -> None:
    if lab.cell.lease:
        # max_lost_runs=1: the first lost worker is the last.
        gate = lab.gate("f")
        job = await lab.enqueue("held_fragile", {"key": "f", "write": "after"})
        lost = lab.drainer()
        async with _working(lost):
            await _reached(gate)
            await _lose_the_worker(lab)
            assert (await lab.drain()).stats["processed"] == 0
            gate.release.set()
        row = await lab.row(job)
        assert (row["status"], row["retry_count"], row["lost_runs"]) == ("failed", 0, 1)
        assert row["error_message"] == "stopped: its worker was lost 1 times while it ran"
        assert await lab.log() == []
        return
    # The transaction is the lease: a worker's death leaves no trace in the row to count, so
    # the bound is the drainer's: a job whose connection is cut three times in a row while it
    # runs is charged a failed attempt (lanes.MAX_LOST_RUNS), and retried after its backoff.
    job = await lab.enqueue("pid_held", {"key": "p"})
    async with _working(lab.drainer()):
        for cut in range(3):
            gate = lab.gate("p")
            await _reached(gate)
            assert len(lab.pids) == cut + 1
            await _terminate(lab.database, [lab.pids[-1]])
            lab.gates["p"] = Gate()
            gate.release.set()  # the handler returns to a connection that is gone

        async def charged() -> bool:
            return await lab.status(job) == "retrying"

        await eventually(charged)
    row = await lab.row(job)
    assert (row["retry_count"], row["lost_runs"]) == (1, 0)
    assert row["error_message"].startswith(
        "its connection was lost 3 times in a row while it ran"
    ), row["error_message"]


async def plain_def_handler(lab: Lab) -> None:
    # Its write commits with its job and rolls back with its failure, as an async handler's.
    kept = await lab.enqueue("plain_writes", {"key": "kept"})
    lost = await lab.enqueue("plain_writes", {"key": "lost", "fail": True}, max_retries=0)
    stats = (await lab.drain()).stats
    assert (stats["processed"], stats["failed"]) == (1, 1), stats
    assert (await lab.row(kept))["result"] == {"wrote": "kept"}
    assert await lab.status(lost) == "failed"
    assert await lab.log() == [("kept", "1")]


async def unknown_job_type(lab: Lab) -> None:
    with pytest.raises(UnknownJobType, match="ghost"):
        await lab.enqueue("ghost", {})
    assert await job_rows(lab.database) == []  # refused before anything was written
    job = await lab.enqueue("ghost", {}, allow_unknown=True, max_retries=0)
    assert (await lab.drain()).stats["failed"] == 1
    row = await lab.row(job)
    assert row["status"] == "failed"
    assert row["error_message"] == "no handler registered for job type 'ghost'"


async def results_round_trip(lab: Lab) -> None:
    payload = {"price": Decimal("0.10"), "on": date(2026, 1, 31)}
    job = await lab.enqueue("results", payload)
    assert (await lab.drain()).stats["processed"] == 1
    row = await lab.row(job)
    assert row["payload"] == {"price": "0.10", "on": "2026-01-31"}
    assert row["result"] == {
        "amount": "12.30",
        "day": "2026-12-02",
        "at": "2026-12-02T06:30:00+00:00",
        "echo": {"price": "0.10", "on": "2026-01-31"},
    }
    assert Decimal(row["result"]["amount"]) == Decimal("12.30")  # exact, not a float's
    assert date.fromisoformat(row["result"]["day"]) == date(2026, 12, 2)


async def wait_for_results(lab: Lab) -> None:
    # app.wait wakes on the completion's notification alone (the safety read is put off for
    # an hour), returns the result, and raises a failed job's error.
    waits.SAFETY_INTERVAL = 3600.0
    try:
        done = await lab.enqueue("results", {"price": Decimal("1"), "on": date(2026, 1, 1)})
        failed = await lab.enqueue("fails", {}, max_retries=0)
        waiting = asyncio.gather(
            lab.app.wait(done, timeout=30), lab.app.wait(failed, timeout=30), return_exceptions=True
        )
        await eventually(lambda: _wait_rows(lab.database, 2))  # both waits registered
        async with _working(lab.drainer()):
            result, error = await waiting
        assert isinstance(result, dict) and result["amount"] == "12.30"
        assert isinstance(error, JobFailed) and error.job.status == "failed"
        assert await _wait_rows(lab.database, 0)  # every wait removed its row
    finally:
        waits.SAFETY_INTERVAL = 1.0


async def _wait_rows(database: Database, count: int) -> bool:
    async with database.connect() as conn:
        found = await conn.scalar(text("SELECT count(*) FROM cronlock.job_waits"))
    return bool(found == count)


async def typed_payload(lab: Lab) -> None:
    at = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    with pytest.raises(InvalidPayload) as refused:
        await lab.enqueue("typed", {"name": "a", "at": "soon"})
    assert [error["loc"] for error in refused.value.errors] == [["at"]]
    assert str(refused.value).startswith("the payload does not fit Greeting: at: ")
    assert await job_rows(lab.database) == []  # refused before anything was written
    first = await lab.enqueue("typed", Greeting(name="a", at=at))
    second = await lab.enqueue("typed", {"name": "b", "at": at.isoformat(), "times": 2})
    shape = await lab.enqueue("typed_plain", Shape(3))
    assert (await lab.drain()).stats["processed"] == 3
    assert sorted(lab.received, key=repr) == sorted(
        [Greeting(name="a", at=at), Greeting(name="b", at=at, times=2), Shape(3)], key=repr
    )
    assert (await lab.row(first))["result"] == {"text": "hello a x1"}
    assert (await lab.row(second))["result"] == {"text": "hello b x2"}
    assert (await lab.row(shape))["result"] == {"sides": 3}
    assert await lab.log() == [("shape-3", "1")]  # the def handler's write, with its job


async def typed_stale_row(lab: Lab) -> None:
    # Rows the models no longer take (as from before a model change, or written by plain SQL).
    async with lab.database.engine.begin() as conn:
        rows = await conn.execute(
            insert(jobs).returning(jobs.c.id),
            [
                {"job_type": "typed", "payload": {"name": "a"}, "max_retries": 0},
                {"job_type": "typed_plain", "payload": {"sides": "three"}, "max_retries": 0},
            ],
        )
        stale, stale_plain = rows.scalars().all()
    good = await lab.enqueue("typed", Greeting(name="c", at=datetime.now(UTC)))
    result = await lab.drain()  # the worker goes on: its drain ends, no error
    assert (result.stats["processed"], result.stats["failed"]) == (1, 2), result.stats
    row = await lab.row(stale)
    assert (row["status"], row["error_message"]) == (
        "failed",
        "its payload does not fit Greeting: at: Field required",
    )
    assert len(row["error_history"]) == 1
    row = await lab.row(stale_plain)
    assert (row["status"], row["error_message"]) == (
        "failed",
        "its payload does not fit Shape: sides: Input should be a valid integer (got str)",
    )
    assert await lab.status(good) == "completed"
    assert [type(payload) for payload in lab.received] == [Greeting]  # no stale one ran
    assert await lab.log() == []


async def dependencies(lab: Lab) -> None:
    # A chain, a fan-out and a fan-in, and a child of a failed parent (issue 25, item 4).
    first = await lab.enqueue("record", {"n": 1})
    second = await lab.enqueue("record", {"n": 2}, depends_on=[first])
    fanned = await lab.app.enqueue_many("record", [{"n": 3}, {"n": 3}], depends_on=[second])
    last = await lab.enqueue("record", {"n": 4}, depends_on=fanned)
    bad = await lab.enqueue("fails_now", {})
    doomed = await lab.enqueue("record", {"n": 5}, depends_on=[first, bad])
    assert [await lab.status(job) for job in (second, last, doomed)] == ["blocked"] * 3
    done = await lab.drain()
    assert (done.stats["processed"], done.stats["failed"]) == (5, 1), done.stats
    assert lab.order == [1, 2, 3, 3, 4]  # none before its parents, each once
    assert await lab.status(last) == "completed"
    row = await lab.row(doomed)
    assert (row["status"], row["error_message"]) == (
        "cancelled",
        "cancelled: a job it depends on failed or was cancelled",
    )


Scenario = Callable[[Lab], Awaitable[None]]

SCENARIOS: dict[str, Scenario] = {
    "dedup key: while waiting": dedup_while_waiting,
    "dedup key: while running": dedup_while_running,
    "dedup key: a retry of a job whose key another job took": (
        dedup_retry_of_a_job_whose_key_another_took
    ),
    "dedup key: concurrent enqueues": dedup_concurrent_enqueues,
    "per-key concurrency limit": per_key_concurrency_limit,
    "priority": priority,
    "delay and run_at": delay_and_run_at,
    "retries and backoff": retries_and_backoff,
    "timeout (the job type's)": timeout_of_the_type,
    "timeout (per job, at enqueue)": timeout_per_job,
    "JobCancel and JobSnooze returned": cancel_and_snooze_returned,
    "cooperative cancel of a running job": cooperative_cancel,
    "queue pause and resume": pause_and_resume,
    "tracing spans": tracing_spans,
    "a lost worker: its job runs again, not charged; its late completion is fenced": (lost_worker),
    "a job that keeps losing its worker is stopped": stopped_after_lost_runs,
    "a plain def handler: its writes commit with its job": plain_def_handler,
    "an unknown job type": unknown_job_type,
    "results: Decimal and dates": results_round_trip,
    "app.wait: woken by the completion": wait_for_results,
    "typed payload: the handler receives the model": typed_payload,
    "typed payload: a stored payload that no longer fits fails its attempt": typed_stale_row,
    "depends_on: a job runs after its parents, and is cancelled with a failed one": dependencies,
}


def _cells() -> Iterator[Any]:
    for feature, row in MATRIX.items():
        for cell in CELLS:
            expectation = row[cell]
            marks = []
            if isinstance(expectation, KnownBroken):
                marks.append(pytest.mark.xfail(strict=True, reason=expectation.reason))
            yield pytest.param(feature, cell, id=f"{feature}-{cell.id}", marks=marks)


def test_every_feature_has_its_scenario() -> None:
    assert list(SCENARIOS) == list(MATRIX)


@pytest.mark.parametrize(("feature", "cell"), list(_cells()))
async def test_feature_in_mode(database: Database, feature: str, cell: Cell) -> None:
    expectation = MATRIX[feature][cell]
    async with _lab(database, cell) as lab:
        if isinstance(expectation, Refused):
            with pytest.raises(CronlockError) as refused:
                await SCENARIOS[feature](lab)
            assert str(refused.value) == expectation.message
            assert await job_rows(database) == []  # nothing half-written
            return
        await SCENARIOS[feature](lab)
