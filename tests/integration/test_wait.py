"""Results on demand (issue 25, item 2): ``app.wait``, its sync twin, ``GET /jobs/{id}?wait=``
and ``cronlock jobs wait``, woken by the completion's notification (the jobs_ended trigger,
migration 0017). Every commit and queue mode: the matrix's row "app.wait" (test_matrix.py)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
import pytest
from cli import invoke_async
from pgbouncer import running_pgbouncer
from sqlalchemy import text
from testdb import libpq_url
from waiting import ended_within, eventually

from cronlock import App, ConfigurationError, Database, JobFailed, JobNotFound
from cronlock.http import create_api
from cronlock.queue import waits
from cronlock.sql.tables import ended_channel


def _app() -> App:
    app = App()

    @app.job("double")
    async def double(_session: Any, payload: Any) -> Any:
        return {"twice": payload["n"] * 2}

    @app.job("fails", max_retries=0)
    async def fails(_session: Any, _payload: Any) -> None:
        raise ValueError("no luck")

    return app


@pytest.fixture
def slow_safety(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a notification can end a wait in time: the safety read is put off for an hour."""
    monkeypatch.setattr(waits, "SAFETY_INTERVAL", 3600.0)


@asynccontextmanager
async def _on(database: Database, **use: Any) -> AsyncIterator[App]:
    app = _app()
    app.use_database(str(database.url), **use)
    try:
        yield app
    finally:
        await app.aclose()


@asynccontextmanager
async def _worker(app: App) -> AsyncIterator[None]:
    drainer = app.drainer(poll_interval=0.05)
    task = asyncio.create_task(drainer.work())
    try:
        yield
    finally:
        drainer.stop()
        await ended_within([task], timeout=30, about="the worker")


async def _waits(database: Database) -> int:
    async with database.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM cronlock.job_waits")) or 0)


async def _no_waits(database: Database) -> bool:
    return await _waits(database) == 0


async def test_a_wait_ends_at_the_completions_notification(
    database: Database, slow_safety: None
) -> None:
    async with _on(database) as app:
        job = await app.enqueue("double", {"n": 21})
        waiting = asyncio.create_task(app.wait(job.id, timeout=30))
        await eventually(lambda: _waits(database))  # registered before the job runs
        assert not waiting.done()
        async with _worker(app):
            assert await waiting == {"twice": 42}
        await eventually(lambda: _no_waits(database))  # removed beside the answer
        # A job that has ended answers at once, from its row.
        assert await app.wait(job.id, timeout=5) == {"twice": 42}


async def test_a_job_that_has_ended_is_answered_without_a_write(database: Database) -> None:
    async with _on(database) as app:
        job = await app.enqueue("double", {"n": 4})
        assert (await app.drain()).stats["processed"] == 1
        blocker = await asyncpg.connect(libpq_url(database.url))
        try:  # a wait row's insert would queue behind this lock until the timeout
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("LOCK TABLE cronlock.job_waits IN ACCESS EXCLUSIVE MODE")
            assert await app.wait(job.id, timeout=5) == {"twice": 8}
            await tx.rollback()
        finally:
            await blocker.close()


async def test_a_completion_in_flight_when_the_wait_registers_is_waited_for(
    database: Database, slow_safety: None
) -> None:
    # The race of enqueue-then-wait: the completion's statement (and its trigger, which finds
    # no wait row) runs before the wait's row commits, and its commit comes after the read that
    # follows. Only that read can see it: the safety read is off.
    async with _on(database) as app:
        job = await app.enqueue("double", {"n": 5})
        completer = await asyncpg.connect(libpq_url(database.url))
        try:
            tx = completer.transaction()
            await tx.start()
            await completer.execute(
                "UPDATE cronlock.jobs SET status = 'completed', result = '{\"twice\": 10}',"
                " completed_at = now() WHERE id = $1",
                job.id,
            )
            waiting = asyncio.create_task(app.wait(job.id, timeout=10))
            await eventually(lambda: _blocked_on_the_row(database))  # the read waits on it
            await tx.commit()
            assert await waiting == {"twice": 10}
        finally:
            await completer.close()


async def test_a_wait_locks_no_row_of_a_waiting_job(
    database: Database, slow_safety: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A FOR SHARE lock on a pending job's row, however short, makes a claim's SKIP LOCKED pass
    # it by: a one-shot drain beside the wait ended without the job (CI, test_the_sync_twin).
    # A row lock leaves the locker's id in the row's xmax; the wait must leave it 0.
    reads: list[int] = []
    settle = waits.Waits._settle

    def counted(self: waits.Waits, *args: Any, **kwargs: Any) -> None:
        reads.append(1)
        settle(self, *args, **kwargs)

    monkeypatch.setattr(waits.Waits, "_settle", counted)
    async with _on(database) as app:
        job = await app.enqueue("double", {"n": 3}, delay=3600)
        waiting = asyncio.create_task(app.wait(job.id, timeout=30))
        await eventually(lambda: _reads(reads, 2))  # the first read, and the one after the row
        async with database.connect() as conn:
            xmax = await conn.scalar(
                text("SELECT xmax::text FROM cronlock.jobs WHERE id = :id"), {"id": job.id}
            )
        assert xmax == "0"
        await app.cancel_job(job.id)
        with pytest.raises(JobFailed):
            await waiting


async def _reads(reads: list[int], count: int) -> bool:
    return len(reads) >= count


async def _blocked_on_the_row(database: Database) -> bool:
    async with database.connect() as conn:
        waiting = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%FOR SHARE%'"
            )
        )
    return bool(waiting)


async def test_a_failed_or_cancelled_job_raises_with_its_row(
    database: Database, slow_safety: None
) -> None:
    async with _on(database) as app:
        failing = await app.enqueue("fails", {})
        later = await app.enqueue("double", {"n": 1}, delay=3600)
        waiting = asyncio.gather(
            app.wait(failing.id, timeout=30), app.wait(later.id, timeout=30), return_exceptions=True
        )
        await eventually(lambda: _waits(database))
        await app.cancel_job(later.id)  # a pending job: cancelled at once, by an UPDATE
        async with _worker(app):
            failed, cancelled = await waiting
        assert isinstance(failed, JobFailed) and failed.job.status == "failed"
        assert failed.job.error_message == "ValueError: no luck"
        assert len(failed.job.error_history) == 1
        assert "no luck" in str(failed)
        assert isinstance(cancelled, JobFailed) and cancelled.job.status == "cancelled"
        info = await app.wait_for_end(failing.id, timeout=5)  # the row, without raising
        assert info.status == "failed"


async def test_no_such_job_timeout_and_a_deleted_job(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "SAFETY_INTERVAL", 0.05)
    async with _on(database) as app:
        with pytest.raises(JobNotFound):
            await app.wait(uuid.uuid4(), timeout=5)
        job = await app.enqueue("double", {"n": 1}, delay=3600)
        with pytest.raises(TimeoutError):
            await app.wait(job.id, timeout=0.2)
        await eventually(lambda: _no_waits(database))  # a timed-out wait removes its row too
        waiting = asyncio.create_task(app.wait(job.id, timeout=30))
        await eventually(lambda: _waits(database))
        async with database.engine.begin() as conn:  # gone (no UPDATE, no notification)
            await conn.execute(text("DELETE FROM cronlock.jobs WHERE id = :id"), {"id": job.id})
        with pytest.raises(JobNotFound):
            await waiting


async def test_a_commit_nobody_awaits_notifies_nobody(database: Database) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(libpq_url(database.url))
    try:
        await listener.add_listener(ended_channel("cronlock"), lambda *args: heard.append(args[-1]))
        async with _on(database) as app:
            quiet = await app.enqueue("double", {"n": 1})
            assert (await app.drain()).stats["processed"] == 1
            awaited = await app.enqueue("double", {"n": 2})
            waiting = asyncio.create_task(app.wait(awaited.id, timeout=30))
            await eventually(lambda: _waits(database))
            assert (await app.drain()).stats["processed"] == 1
            await waiting
        # Notifications arrive in commit order: the awaited job's came, the quiet one's never.
        await eventually(lambda: _heard(heard))
        assert heard == [str(awaited.id)] and str(quiet.id) not in heard
    finally:
        await listener.close()


async def _heard(heard: list[str]) -> bool:
    return bool(heard)


def test_the_sync_twin(database_url: str) -> None:
    app = _app()
    app.use_database(database_url)
    job = asyncio.run(_enqueued(app, "double", {"n": 5}))

    def drain_soon() -> None:
        other = _app()
        other.use_database(database_url)
        asyncio.run(_drained(other))

    drainer = threading.Thread(target=drain_soon)
    drainer.start()
    try:
        assert app.sync.wait(job, timeout=30) == {"twice": 10}
    finally:
        drainer.join(30)
    failed = asyncio.run(_enqueued(app, "fails", {}))
    asyncio.run(_drained(_app_on(database_url)))
    with pytest.raises(JobFailed, match="no luck"):
        app.sync.wait(failed, timeout=30)


def _app_on(url: str) -> App:
    app = _app()
    app.use_database(url)
    return app


async def _enqueued(app: App, job_type: str, payload: Any) -> uuid.UUID:
    try:
        return (await app.enqueue(job_type, payload)).id
    finally:
        await app.aclose()


async def _drained(app: App) -> None:
    try:
        await app.drain(max_seconds=30)
    finally:
        await app.aclose()


async def test_the_sync_twin_refuses_a_running_loop(database: Database) -> None:
    async with _on(database) as app:
        with pytest.raises(ConfigurationError, match=r"await app\.wait"):
            app.sync.wait(uuid.uuid4(), timeout=1)


async def test_http_long_poll(database: Database, slow_safety: None) -> None:
    async with _on(database) as app:
        job = await app.enqueue("double", {"n": 4})
        transport = httpx.ASGITransport(app=create_api(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            now = await http.get(f"/jobs/{job.id}", params={"wait": 0.1})
            assert now.status_code == 200 and now.json()["status"] == "pending"
            polled = asyncio.create_task(http.get(f"/jobs/{job.id}", params={"wait": 30}))
            await eventually(lambda: _waits(database))
            async with _worker(app):
                answer = await polled
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "completed"
            assert answer.json()["result"] == {"twice": 8}
            missing = await http.get(f"/jobs/{uuid.uuid4()}", params={"wait": 5})
            assert missing.status_code == 404
            too_long = await http.get(f"/jobs/{job.id}", params={"wait": 3600})
            assert too_long.status_code == 422


async def test_cli_jobs_wait(database: Database, database_url: str) -> None:
    app = _app()
    app.use_database(database_url)
    done = await app.enqueue("double", {"n": 3})
    failed = await app.enqueue("fails", {})
    later = await app.enqueue("double", {"n": 1}, delay=3600)
    await app.drain(max_seconds=30)
    await app.aclose()
    base = ("--app", "testapps.jobs")
    ok = await invoke_async(*base, "jobs", "wait", str(done.id), database_url=database_url)
    assert (ok.returncode, ok.stdout.strip()) == (0, '{"twice": 6}'), ok.stderr
    bad = await invoke_async(*base, "jobs", "wait", str(failed.id), database_url=database_url)
    assert bad.returncode == 1 and "failed: ValueError: no luck" in bad.stderr
    slow = await invoke_async(
        *base, "jobs", "wait", str(later.id), "--timeout", "0.2", database_url=database_url
    )
    assert slow.returncode == 3 and "has not ended after 0.2 s" in slow.stderr
    none = await invoke_async(*base, "jobs", "wait", str(uuid.uuid4()), database_url=database_url)
    assert none.returncode == 1 and "no job" in none.stderr


@pytest.fixture
def bouncer(database: Database) -> Iterator[str]:
    with running_pgbouncer(database.url, pool_size=2) as url:
        yield url.render_as_string(hide_password=False)


async def test_behind_pgbouncer_the_safety_read_ends_the_wait(
    database: Database, bouncer: str
) -> None:
    async with _on(database) as direct, _on(database) as through:
        through.use_database(bouncer, pgbouncer=True)
        job = await direct.enqueue("double", {"n": 7})
        waiting = asyncio.create_task(through.wait(job.id, timeout=30))
        await eventually(lambda: _waits(database))
        async with _worker(direct):
            assert await waiting == {"twice": 14}
