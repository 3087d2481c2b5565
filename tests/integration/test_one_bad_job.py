"""One job's state never stops a worker (issue 22, items 1 and 3), in every commit mode.

The lease + dedup wedge first, as a new user met it: a failing job with a dedup key runs under
a ``lease`` worker, the same key is enqueued again meanwhile, the first job's retry comes. Then
rows no write of one job can get past, injected with real SQL in the test's own database (a
trigger that raises for one job id): the job ends failed with the error in its history, or is
left where it is, and the worker, its other jobs and its sweep go on; a new worker starts.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from jobsupport import job_rows
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from waiting import eventually

from cronlock import App, Backoff, Database, RunStatus
from cronlock.queue.drainer import Drainer

MODES = ["strict", "batch", "lease"]


class Gate:
    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()


@asynccontextmanager
async def _app(database: Database) -> AsyncIterator[tuple[App, Gate]]:
    gate = Gate()
    app = App()

    @app.job("fails", max_retries=2, backoff=Backoff(base=0, jitter=0))
    async def fails(_session: AsyncSession, payload: Any) -> None:
        if payload.get("hold"):
            gate.reached.set()
            await gate.release.wait()
        raise RuntimeError("it fails")

    @app.job("ok")
    async def ok(_session: AsyncSession, _payload: Any) -> str:
        return "done"

    app.use_database(str(database.url))
    try:
        yield app, gate
    finally:
        await app.aclose()


async def _row(database: Database, job_id: uuid.UUID) -> dict[str, Any]:
    (row,) = await job_rows(database, id=job_id)
    return row


async def _status(database: Database, job_id: uuid.UUID) -> str:
    return str((await _row(database, job_id))["status"])


async def _worker(app: App, mode: str) -> tuple[Drainer, asyncio.Task[Any]]:
    drainer = app.drainer(commit_mode=mode, poll_interval=0.05, sweep_interval=0.05)
    return drainer, asyncio.create_task(drainer.work())


async def _stop(drainer: Drainer, task: asyncio.Task[Any]) -> Any:
    assert not task.done(), task.result()
    drainer.stop()
    return await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("mode", MODES)
async def test_the_dedup_key_is_held_while_its_job_runs_and_its_retries_go_on(
    database: Database, mode: str
) -> None:
    """The issue's sequence: the second enqueue while the first job runs creates nothing."""
    async with _app(database) as (app, gate):
        first = await app.enqueue("fails", {"hold": True}, dedup_key="K")
        drainer, task = await _worker(app, mode)
        await asyncio.wait_for(gate.reached.wait(), 10)
        again = await app.enqueue("fails", {}, dedup_key="K", delay=60)
        assert again.created is False and again.id == first.id
        gate.release.set()
        await eventually(lambda: _failed(database, first.id))
        result = await _stop(drainer, task)
        assert result.status is not RunStatus.FAILED, result.error
        # A new worker of the same mode starts and serves.
        fresh = await app.enqueue("ok", {})
        drained = await app.drain(commit_mode=mode)
    assert drained.status is RunStatus.COMPLETED, drained.error
    row = await _row(database, first.id)
    assert row["retry_count"] == 2 and len(row["error_history"]) == 3
    assert (await _row(database, fresh.id))["status"] == "completed"
    assert len(await job_rows(database)) == 2


async def _failed(database: Database, job_id: uuid.UUID) -> bool:
    return await _status(database, job_id) == "failed"


async def test_a_key_taken_before_the_index_held_it_does_not_wedge_the_lease_mode(
    database: Database,
) -> None:
    """A database where another job took a running job's key (the index before migration 0014
    let it): the retry cannot be written, so the job fails with the reason in its history,
    the worker goes on, and a new lease worker starts."""
    async with _app(database) as (app, gate):
        first = await app.enqueue("fails", {"hold": True}, dedup_key="K")
        drainer, task = await _worker(app, "lease")
        await asyncio.wait_for(gate.reached.wait(), 10)
        async with database.engine.begin() as conn:  # the index before 0014, and its hole
            await conn.execute(text("DROP INDEX cronlock.uq_jobs_dedup_key"))
            await conn.execute(
                text(
                    "CREATE UNIQUE INDEX uq_jobs_dedup_key ON cronlock.jobs (dedup_key) WHERE "
                    "dedup_key IS NOT NULL AND status IN ('pending', 'retrying')"
                )
            )
            second = await conn.scalar(
                text(
                    "INSERT INTO cronlock.jobs (job_type, payload, dedup_key, run_at) VALUES "
                    "('fails', '{}', 'K', now() + interval '60 s') RETURNING id"
                )
            )
        gate.release.set()
        await eventually(lambda: _failed(database, first.id))
        after = await app.enqueue("ok", {})
        await eventually(lambda: _completed(database, after.id))
        result = await _stop(drainer, task)
        assert result.status is not RunStatus.FAILED, result.error
        drained = await app.drain(commit_mode="lease")
    assert drained.status is RunStatus.COMPLETED, drained.error
    row = await _row(database, first.id)
    assert row["retry_count"] == 0
    assert "uq_jobs_dedup_key" in row["error_message"]
    assert "its outcome could not be written" in row["error_history"][-1]["error"]
    assert await _status(database, uuid.UUID(str(second))) == "pending"


async def _completed(database: Database, job_id: uuid.UUID) -> bool:
    return await _status(database, job_id) == "completed"


async def _refuse(database: Database, job_id: uuid.UUID, statuses: tuple[str, ...]) -> None:
    """A trigger that raises for one job whenever it would get one of ``statuses``."""
    listed = ", ".join(f"'{s}'" for s in statuses)
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF NEW.id = '{job_id}' AND NEW.status IN ({listed}) THEN "
                "RAISE EXCEPTION 'refused for this job'; END IF; RETURN NEW; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse BEFORE UPDATE ON cronlock.jobs "
                "FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
        )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", ["completed", "retrying"])
async def test_an_outcome_the_database_refuses_fails_its_job_and_the_worker_goes_on(
    database: Database, mode: str, status: str
) -> None:
    async with _app(database) as (app, _gate):
        job_type = "ok" if status == "completed" else "fails"
        bad = await app.enqueue(job_type, {}, priority=1)
        others = [await app.enqueue("ok", {}) for _ in range(3)]
        await _refuse(database, bad.id, (status,))
        drainer = app.drainer(commit_mode=mode, batch_size=4 if mode != "strict" else None)
        result = await drainer.drain()
        assert result.status is not RunStatus.FAILED, result.error
        row = await _row(database, bad.id)
        assert row["status"] == "failed" and row["retry_count"] == 0
        assert row["error_message"].startswith(f"its outcome could not be written ({status})")
        assert "refused for this job" in row["error_history"][-1]["error"]
        for other in others:
            assert await _completed(database, other.id)
        # A new worker starts and serves.
        after = await app.enqueue("ok", {})
        drained = await app.drain(commit_mode=mode)
    assert drained.status is RunStatus.COMPLETED, drained.error
    assert await _status(database, after.id) == "completed"


async def test_a_lost_job_the_database_refuses_to_return_fails_and_the_sweep_goes_on(
    database: Database,
) -> None:
    async with _app(database) as (app, gate):
        held = await app.enqueue("fails", {"hold": True})
        lost = await app.enqueue("ok", {})
        async with database.engine.begin() as conn:  # two jobs of a dead worker
            await conn.execute(
                text(
                    "UPDATE cronlock.jobs SET status = 'processing', owner = gen_random_uuid(), "
                    "attempt = 1 WHERE id IN (:a, :b)"
                ),
                {"a": held.id, "b": lost.id},
            )
        await _refuse(database, held.id, ("pending",))
        result = await app.drain(commit_mode="lease")  # its start-up sweep returns them
        assert result.status is not RunStatus.FAILED, result.error
        assert result.stats["lost_returned"] == 1 and result.stats["processed"] == 1
        row = await _row(database, held.id)
        assert row["status"] == "failed" and row["owner"] is None
        assert "refused for this job" in row["error_message"]
        assert "could not be returned" in row["error_history"][-1]["error"]
        assert await _status(database, lost.id) == "completed"
        assert not gate.reached.is_set()


async def test_a_job_the_database_refuses_to_hand_out_fails_and_the_lease_lane_claims_on(
    database: Database,
) -> None:
    async with _app(database) as (app, _gate):
        bad = await app.enqueue("ok", {}, priority=1)
        others = [await app.enqueue("ok", {}) for _ in range(3)]
        await _refuse(database, bad.id, ("processing",))
        result = await app.drain(commit_mode="lease", batch_size=4)
        assert result.status is not RunStatus.FAILED, result.error
        assert result.stats["processed"] == 3
        row = await _row(database, bad.id)
        assert row["status"] == "failed" and row["owner"] is None
        assert row["error_message"].startswith("it could not be claimed: RaiseError: refused")
        for other in others:
            assert await _completed(database, other.id)


@pytest.mark.parametrize("mode", MODES)
async def test_a_payload_this_process_cannot_read_fails_its_job_not_the_lane(
    database: Database, mode: str
) -> None:
    """JSON nested deeper than Python's recursion limit, which plain SQL can store."""
    async with _app(database) as (app, _gate):
        others = [await app.enqueue("ok", {}) for _ in range(2)]
        deep = "[" * 5000 + "]" * 5000
        async with database.engine.begin() as conn:
            bad = await conn.scalar(
                text(
                    "INSERT INTO cronlock.jobs (job_type, payload, priority) VALUES "
                    "('ok', jsonb_build_object('deep', CAST(:deep AS jsonb)), 1) RETURNING id"
                ),
                {"deep": deep},
            )
        result = await app.drain(commit_mode=mode, batch_size=3 if mode != "strict" else None)
        assert result.status is not RunStatus.FAILED, result.error
        assert result.stats["processed"] == 2 and result.stats["failed"] == 1
        async with database.connect() as conn:  # not its payload: this process cannot read it
            row = (
                await conn.execute(
                    text("SELECT status, error_message FROM cronlock.jobs WHERE id = :id"),
                    {"id": bad},
                )
            ).one()
        assert row.status == "failed"
        assert row.error_message == "its payload could not be read: RecursionError: " + (
            "maximum recursion depth exceeded while decoding a JSON array from a unicode string"
        )
        for other in others:
            assert await _completed(database, other.id)
