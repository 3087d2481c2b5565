"""The lease commit mode: the claim commits, handlers hold no transaction, the completion's
session commits with the completion, liveness by lock, fencing (DESIGN.md invariants 4, 9, 11).

Each test drives real workers against a real PostgreSQL; a worker's death is what PostgreSQL
sees of it (its backends terminated), a paused worker is a handler held on an event.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from jobsupport import job_rows, scalar
from sqlalchemy import Uuid, cast, func, literal, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from waiting import Gate, eventually

from cronlock import App, Database, RunStatus, pg, sql
from cronlock.queue.drainer import Drainer
from cronlock.queue.liveness import owner_key
from cronlock.sql.tables import jobs

LEASE = "lease"


@asynccontextmanager
async def _app(database: Database) -> AsyncIterator[tuple[App, dict[str, Gate]]]:
    async with database.engine.begin() as conn:
        await conn.execute(text("CREATE TABLE lease_log (job text NOT NULL, run text NOT NULL)"))
    gates: dict[str, Gate] = {}
    app = App()

    @app.job("held", max_retries=0)
    async def held(session: AsyncSession, payload: Any) -> Any:
        run = payload.get("run", "")
        gate = gates[payload["gate"]]
        await gate.hold()
        await session.execute(
            text("INSERT INTO lease_log VALUES (:job, :run)"), {"job": payload["gate"], "run": run}
        )
        return {"gate": payload["gate"]}

    @app.job("write_then_fail", max_retries=0)
    async def write_then_fail(session: AsyncSession, payload: Any) -> None:
        await session.execute(text("INSERT INTO lease_log VALUES ('wtf', '')"))
        await session.commit()  # in the lease mode: a flush; the completion commits
        raise RuntimeError("after writing")

    @app.job("noop")
    async def noop(_session: AsyncSession, _payload: Any) -> None:
        return None

    app.use_database(str(database.url))
    try:
        yield app, gates
    finally:
        await app.aclose()


async def _enqueue(app: App, job_type: str, payload: dict[str, Any]) -> uuid.UUID:
    async with app.database.session() as session:
        enqueued = await app.enqueue_tx(session, job_type, payload)
        await session.commit()
    return enqueued.id


async def _row(database: Database, job_id: uuid.UUID) -> dict[str, Any]:
    [row] = [r for r in await job_rows(database) if r["id"] == job_id]
    return row


async def _log(database: Database) -> list[tuple[str, str]]:
    async with database.connect() as conn:
        rows = await conn.execute(text("SELECT job, run FROM lease_log ORDER BY job, run"))
        return [(job, run) for job, run in rows]


async def _terminate(database: Database, *, pids: list[int]) -> None:
    """Terminate backends and wait until they are gone (their locks with them)."""
    async with database.connect() as conn:
        for pid in pids:
            await conn.execute(select(func.pg_terminate_backend(pid)))

    async def gone() -> bool:
        async with database.connect() as conn:
            left = await conn.scalar(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:pids)"),
                {"pids": pids},
            )
        return bool(left == 0)

    await eventually(gone)


async def _backends(database: Database, application_name: str) -> list[int]:
    async with database.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :name "
                "AND datname = current_database()"
            ),
            {"name": application_name},
        )
        return [pid for (pid,) in rows]


async def test_the_owner_key_is_the_same_in_python_and_in_sql(database: Database) -> None:
    owner = uuid.UUID("0123abcd-ef45-6789-8000-00000000ffff")
    assert owner_key(owner) == 0x0123ABCDEF456789  # pinned: a running job's owner's lock
    negative = uuid.UUID("ffffffff-ffff-ffff-0000-000000000000")
    assert owner_key(negative) == -1
    async with database.connect() as conn:
        for value in (owner, negative, uuid.uuid4()):
            key = await conn.scalar(select(sql.owner_lock_key(cast(literal(str(value)), Uuid))))
            assert key == owner_key(value)


async def test_a_running_lease_job_holds_no_transaction_and_commits_with_its_writes(
    database: Database,
) -> None:
    async with _app(database) as (app, gates):
        gates["a"] = Gate()
        job_id = await _enqueue(app, "held", {"gate": "a"})
        # No heartbeat or sweep during the handler: every cronlock backend must be idle then.
        drainer = app.drainer(
            commit_mode=LEASE, heartbeat_interval=3600, sweep_interval=3600, poll_interval=0.05
        )
        draining = asyncio.create_task(drainer.drain())
        await asyncio.wait_for(gates["a"].reached.wait(), 10)

        row = await _row(database, job_id)
        assert row["status"] == "processing"  # the claim committed
        assert row["owner"] == drainer.worker_id and row["attempt"] == 1
        assert row["started_at"] is not None and row["completed_at"] is None
        async with database.connect() as conn:
            seen = (
                await conn.execute(
                    text(
                        "SELECT application_name, state, backend_xid::text, backend_xmin::text "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name LIKE 'cronlock%' AND pid <> pg_backend_pid()"
                    )
                )
            ).all()
        names = sorted(name for name, *_ in seen)
        assert "cronlock-liveness:default" in names and "cronlock-drainer:default" in names
        assert [r for r in seen if r[2] is not None or r[3] is not None] == []
        # Only the two lock transactions idle in a transaction, without an xid or a snapshot.
        idle_in = sorted(name for name, state, *_ in seen if state == "idle in transaction")
        assert idle_in == ["cronlock-drainer:default", "cronlock-liveness:default"]

        gates["a"].release.set()
        result = await asyncio.wait_for(draining, 10)
    assert result.status is RunStatus.COMPLETED and result.stats["processed"] == 1
    row = await _row(database, job_id)
    assert row["status"] == "completed" and row["result"] == {"gate": "a"}
    assert row["started_at"] <= row["completed_at"]
    assert await _log(database) == [("a", "")]


async def test_a_failing_handler_leaves_none_of_its_writes_even_after_commit(
    database: Database,
) -> None:
    async with _app(database) as (app, _):
        job_id = await _enqueue(app, "write_then_fail", {})
        result = await app.drain(commit_mode=LEASE)
    assert result.stats["failed"] == 1
    row = await _row(database, job_id)
    assert row["status"] == "failed" and row["error_message"] == "RuntimeError: after writing"
    assert row["completed_at"] is not None
    assert await _log(database) == []


async def test_a_dead_workers_job_is_returned_as_lost_and_runs_again_not_charged(
    database: Database,
) -> None:
    async with _app(database) as (app, gates):
        first_gate = gates["a"] = Gate()
        job_id = await _enqueue(app, "held", {"gate": "a", "run": "first"})
        first = app.drainer(commit_mode=LEASE, heartbeat_interval=0.2)
        working = asyncio.create_task(first.work())
        await asyncio.wait_for(first_gate.reached.wait(), 10)
        # Its death as PostgreSQL sees it: the worker's lock and liveness backends go.
        pids = [
            pid
            for name in ("cronlock-liveness:default", "cronlock-drainer:default")
            for pid in await _backends(database, name)
        ]
        assert len(pids) == 2
        await _terminate(database, pids=pids)
        # The next worker returns the job at once and runs it.
        gates["a"] = Gate()
        gates["a"].release.set()
        second = await app.drain(commit_mode=LEASE)
        assert second.stats["processed"] == 1 and second.stats["lost_returned"] == 1
        row = await _row(database, job_id)
        assert row["status"] == "completed" and row["retry_count"] == 0  # not an attempt
        assert row["lost_runs"] == 1 and row["attempt"] == 2
        [lost] = row["error_history"]
        assert lost["lost_run"] == 1 and lost["attempt"] == 1
        assert lost["error"] == f"worker lost: {first.worker_id} ended while the job ran"
        # The first worker noticed it lost its locks and stopped claiming.
        await eventually(lambda: _stopping(first))
        first_gate.release.set()
        result = await asyncio.wait_for(working, 10)
    assert result.status is RunStatus.FAILED and result.stats["fenced"] == 1
    assert await _log(database) == [("a", "first")]  # one run's writes only


async def _stopping(drainer: Drainer) -> bool:
    return drainer.stopping


async def test_a_frozen_workers_completion_is_fenced_and_recorded_not_applied(
    database: Database,
) -> None:
    async with _app(database) as (app, gates):
        frozen_gate = gates["frozen"] = Gate()
        job_id = await _enqueue(app, "held", {"gate": "frozen", "run": "same"})
        frozen = app.drainer(commit_mode=LEASE, heartbeat_interval=0.2)
        working = asyncio.create_task(frozen.work())
        await asyncio.wait_for(frozen_gate.reached.wait(), 10)
        # A frozen VM: its connections are dropped by the server (keepalives), its process
        # does nothing. Another worker takes over, finds the owner gone, re-runs the job.
        pids = [
            pid
            for name in ("cronlock-liveness:default", "cronlock-drainer:default")
            for pid in await _backends(database, name)
        ]
        await _terminate(database, pids=pids)
        gates["frozen"] = Gate()
        gates["frozen"].release.set()
        taken = await app.drain(commit_mode=LEASE)
        assert taken.stats["processed"] == 1
        row = await _row(database, job_id)
        assert row["status"] == "completed" and row["attempt"] == 2
        assert row["owner"] != frozen.worker_id
        # The frozen worker wakes up and completes: its lane's connection is still there,
        # but the job is no longer its own.
        frozen_gate.release.set()
        result = await asyncio.wait_for(working, 10)
    assert result.stats["fenced"] == 1 and result.stats["processed"] == 0
    row = await _row(database, job_id)
    assert row["status"] == "completed" and row["attempt"] == 2
    fenced = [e for e in row["error_history"] if "fenced" in e]
    assert fenced == [
        {
            "attempt": 1,
            "error": fenced[0]["error"],
            "at": fenced[0]["at"],
            "fenced": {"owner": str(frozen.worker_id), "attempt": 1},
        }
    ]
    assert fenced[0]["error"].startswith("fenced: ")
    # Its session's insert rolled back with the fenced completion: the job's writes once.
    assert await _log(database) == [("frozen", "same")]


@pytest.mark.parametrize(
    ("lost_runs", "expected"), [(0, "pending"), (1, "retrying"), (2, "failed")]
)
async def test_lost_runs_are_bounded(database: Database, lost_runs: int, expected: str) -> None:
    """A running job whose owner holds no lock (a uuid no worker has) is returned by a sweep,
    and stopped once its lost runs reach max_lost_runs (3 for 'held')."""
    async with _app(database) as (app, _):
        job_id = await _enqueue(app, "noop", {})
        dead = uuid.uuid4()
        retry_count = 1 if expected == "retrying" else 0
        async with database.engine.begin() as conn:
            await conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id)
                .values(
                    status="processing",
                    owner=dead,
                    attempt=lost_runs + 1,
                    lost_runs=lost_runs,
                    retry_count=retry_count,
                )
            )
        from cronlock.queue.liveness import Sweeper

        sweeper = Sweeper(lambda: app.database.engine, app.handlers, queue="default")
        assert await sweeper.sweep() == 1
        assert await sweeper.sweep() == 0
    row = await _row(database, job_id)
    assert row["status"] == expected and row["owner"] is None
    assert row["lost_runs"] == lost_runs + 1 and row["retry_count"] == retry_count
    [entry] = row["error_history"]
    assert entry["lost_run"] == lost_runs + 1 and str(dead) in entry["error"]
    if expected == "failed":
        assert row["error_message"] == "stopped: its worker was lost 3 times while it ran"
        assert row["completed_at"] is not None
    else:
        assert row["completed_at"] is None


async def test_a_live_owners_running_job_is_left_alone(database: Database) -> None:
    async with _app(database) as (app, gates):
        gates["a"] = Gate()
        job_id = await _enqueue(app, "held", {"gate": "a"})
        drainer = app.drainer(commit_mode=LEASE)
        draining = asyncio.create_task(drainer.drain())
        await asyncio.wait_for(gates["a"].reached.wait(), 10)
        from cronlock.queue.liveness import Sweeper

        sweeper = Sweeper(lambda: app.database.engine, app.handlers, queue="default")
        assert await sweeper.sweep() == 0
        gates["a"].release.set()
        await asyncio.wait_for(draining, 10)
    assert (await _row(database, job_id))["status"] == "completed"


async def test_many_lease_jobs_batched_every_job_once(database: Database) -> None:
    async with _app(database) as (app, _):
        async with app.database.session() as session:
            await app.enqueue_many_tx(session, "noop", [{} for _ in range(500)])
            await session.commit()
        result = await app.drain(commit_mode=LEASE, batch_size=50, concurrency=2)
    assert result.stats["processed"] == 500
    counts = await scalar(
        database, select(func.count()).where(jobs.c.status == "completed", jobs.c.attempt == 1)
    )
    assert counts == 500


@asynccontextmanager
async def _role_with_idle_timeout(database: Database, timeout: str) -> AsyncIterator[Database]:
    """A login role of its own whose sessions get ``idle_in_transaction_session_timeout``
    (as a managed PostgreSQL sets it), with the rights a worker needs; dropped afterwards."""
    role = f"lease_idle_{uuid.uuid4().hex[:12]}"
    async with database.engine.begin() as conn:
        await conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        await conn.execute(
            text(f"ALTER ROLE {role} SET idle_in_transaction_session_timeout = '{timeout}'")
        )
        await conn.execute(text(f"GRANT USAGE ON SCHEMA cronlock TO {role}"))
        await conn.execute(text(f"GRANT ALL ON ALL TABLES IN SCHEMA cronlock TO {role}"))
        await conn.execute(text(f"GRANT ALL ON lease_log TO {role}"))
    as_role = Database(database.url.set(username=role))
    try:
        yield as_role
    finally:
        await as_role.dispose()
        async with database.engine.begin() as conn:
            await conn.execute(text(f"DROP OWNED BY {role}"))
            await conn.execute(text(f"DROP ROLE {role}"))


@pytest.mark.parametrize("mode", ["lease", "strict"])
async def test_a_job_longer_than_the_roles_idle_in_transaction_timeout(
    database: Database, mode: str
) -> None:
    """A 2.5 s job under a 1 s idle_in_transaction_session_timeout: the lease mode holds no
    transaction while it runs and completes it; strict mode's transaction is killed by the
    server (which is why the mode exists)."""
    async with _app(database) as (app, _):
        async with _role_with_idle_timeout(database, "1s") as as_role:

            @app.job("long", max_retries=0)
            async def long(session: AsyncSession, _payload: Any) -> None:
                await asyncio.sleep(2.5)  # the job's own work, a long one
                await session.execute(text("INSERT INTO lease_log VALUES ('long', '')"))

            job_id = await _enqueue(app, "long", {})
            worker = App()
            for handler in app.handlers.values():
                worker.job(handler.job_type, max_retries=handler.max_retries)(handler.func)
            worker.use_database(str(as_role.url))
            try:
                result = await worker.drain(commit_mode=mode)
            finally:
                await worker.aclose()
        row = await _row(database, job_id)
    if mode == "lease":
        assert result.stats["processed"] == 1
        assert row["status"] == "completed"
        assert await _log(database) == [("long", "")]
    else:
        assert row["status"] != "completed"
        assert await _log(database) == []


async def test_an_abort_hands_the_jobs_in_flight_back_counted_once(database: Database) -> None:
    """Nothing of the lease mode rolls back: a job in flight when the drainer aborts is handed
    back (due again, its attempt not charged), and counted as that alone."""
    async with _app(database) as (app, gates):
        gates["a"] = Gate()
        job = await _enqueue(app, "held", {"gate": "a"})
        drainer = app.drainer(commit_mode=LEASE)
        working = asyncio.create_task(drainer.work())
        await asyncio.wait_for(gates["a"].reached.wait(), 30)
        drainer.abort()
        result = await asyncio.wait_for(working, 30)
        row = await _row(database, job)
    assert (result.stats["rolled_back"], result.stats["handed_back"]) == (0, 1)
    assert (row["status"], row["retry_count"]) == ("pending", 0)


async def test_a_batched_completion_matches_each_job_by_owner_and_its_own_attempt(
    database: Database,
) -> None:
    """JOB_LEASE_COMPLETE_MANY reads each row's attempt and result from the arrays at its id's
    position: a job of another owner or of another attempt is left as it is (fenced), the
    others get their own results; with :results NULL every result is NULL."""
    worker, other = uuid.uuid4(), uuid.uuid4()
    owners, attempts = [worker, worker, worker, other, worker], [1, 2, 3, 1, 1]
    ids = [uuid.uuid4() for _ in owners]
    async with database.engine.begin() as conn:
        for job_id, owner, attempt in zip(ids, owners, attempts, strict=True):
            await conn.execute(
                jobs.insert().values(
                    id=job_id,
                    job_type="noop",
                    payload={},
                    status="processing",
                    owner=owner,
                    attempt=attempt,
                )
            )
    statement = pg.AsyncpgStatement.of(sql.JOB_LEASE_COMPLETE_MANY, database.schema)
    async with database.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        # The third is sent with a stale attempt, the fourth is another owner's.
        done = await raw.fetch(
            statement.sql,
            *statement.args(
                ids=ids[:4],
                attempts=[1, 2, 2, 1],
                results=['{"x": 1}', None, '"s"', "2"],
                worker=worker,
                now=None,
            ),
        )
        assert {row[0] for row in done} == {ids[0], ids[1]}
        done = await raw.fetch(
            statement.sql,
            *statement.args(ids=[ids[4]], attempts=[1], results=None, worker=worker, now=None),
        )
        assert [row[0] for row in done] == [ids[4]]
    rows = {row["id"]: row for row in await job_rows(database)}
    assert [rows[i]["status"] for i in ids] == [
        "completed",
        "completed",
        "processing",
        "processing",
        "completed",
    ]
    assert [rows[i]["result"] for i in ids] == [{"x": 1}, None, None, None, None]
