"""Control of periodic tasks (issue 23, items 1 and 2): pause, resume and run-now from Python,
the command line, HTTP and the dashboard; items that keep failing parked, retried, cleared;
the README's reindex example settling into completed runs with its 3 bad posts parked.

Slots are driven with the runs' injected ``now`` (and the scheduler's ``wake(now=...)``), never
with real minutes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import ModuleType

import httpx
import pytest
from cli import invoke_async
from sqlalchemy import insert, select

from cronlock import App, Database, Run, RunStatus
from cronlock.errors import ConfigurationError, UnknownTask
from cronlock.http import PUBLIC_ENV, READ_TOKEN_ENV, TOKEN_ENV, create_api
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.observe.status import collect
from cronlock.periodic import backlog
from cronlock.scheduler import Scheduler
from cronlock.sql.tables import runs
from tasks.models import BAD_POSTS, Post

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)  # a slot of every minutely and */15 task
MINUTE = timedelta(minutes=1)
TOKEN = "s3cret-token"
READ = "read-only-token"
BASE = "https://cronlock.test"
ORIGIN = {"Origin": BASE}


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


@dataclass
class Batch:
    """What the test's ``batch`` task processes: its keys, the bad ones, what it did."""

    keys: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    bad: set[int] = field(default_factory=lambda: {2})
    done: list[int] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event | None = None


def control_app(database: Database, batch: Batch, *, park_after: int | None = 2) -> App:
    app = App(retention=False)
    app.use_database(str(database.url))

    @app.periodic("tick", cron="* * * * *")
    async def tick(run: Run) -> None:
        batch.started.set()
        if batch.release is not None:
            await batch.release.wait()

    @app.periodic("batch", cron="* * * * *", park_after=park_after)
    async def process(run: Run) -> None:
        for key in run.skip_parked(batch.keys):
            async with run.item(key):
                if key in batch.bad:
                    raise ValueError(f"bad key {key}")
                batch.done.append(key)

    return app


@pytest.fixture
async def batch() -> Batch:
    return Batch()


@pytest.fixture
async def app(database: Database, batch: Batch) -> AsyncIterator[App]:
    app = control_app(database, batch)
    try:
        yield app
    finally:
        await app.aclose()


async def _rows(database: Database, task: str) -> list[tuple[datetime | None, str, str | None]]:
    async with database.connect() as conn:
        found = await conn.execute(
            select(runs.c.slot, runs.c.status, runs.c.skip_reason)
            .where(runs.c.task == task)
            .order_by(runs.c.id)
        )
        return [(row.slot, row.status, row.skip_reason) for row in found]


# -- pause and resume ----------------------------------------------------------------------


async def test_a_paused_task_records_skipped_paused_slots_from_scheduler_and_crontab(
    app: App, database: Database
) -> None:
    task = app.task("tick")
    scheduler = Scheduler(app, database, tasks=["tick"], clock=lambda: T0)
    assert [r.status for r in await scheduler.wake(task, now=T0)] == [RunStatus.COMPLETED]

    paused = await app.tasks.pause("tick", by="alice", now=T0 + timedelta(seconds=30))
    assert (paused.paused, paused.paused_by, paused.changed) == (True, "alice", True)
    again = await app.tasks.pause("tick", by="bob")  # already paused: the first pause stands
    assert (again.changed, again.paused_by) == (False, "alice")

    by_scheduler = await scheduler.wake(task, now=T0 + MINUTE)
    by_crontab = await app.run("tick", now=T0 + 2 * MINUTE + timedelta(seconds=2))
    for result in (*by_scheduler, by_crontab):
        assert (result.status, result.skip_reason) == (RunStatus.SKIPPED, "paused")
        assert result.error is not None and "paused by alice" in result.error
    # Paused, it owes nothing: not overdue, however long the pause.
    later = T0 + timedelta(hours=3)
    async with database.connect() as conn:
        assert (await backlog.overdue_by_task(conn, [task], later))["tick"] is None
    report = await collect(app.tasks, database, now=later)
    entry = next(t for t in report["tasks"] if t["task"] == "tick")
    assert entry["paused"]["paused_by"] == "alice" and entry["overdue"] is None
    metrics = render_metrics(await scrape(database, app.tasks.values(), now=later)).decode()
    assert 'cronlock_task_paused{task="tick"} 1.0' in metrics
    assert 'cronlock_task_overdue_seconds{task="tick"} 0.0' in metrics

    resumed = await app.tasks.resume("tick", now=T0 + 2 * MINUTE + timedelta(seconds=30))
    assert (resumed.paused, resumed.changed) == (False, True)
    assert (await app.tasks.resume("tick")).changed is False
    after = await scheduler.wake(task, now=T0 + 3 * MINUTE)
    by_cron_after = await app.run("tick", now=T0 + 4 * MINUTE + timedelta(seconds=1))
    assert [r.status for r in after] == [RunStatus.COMPLETED]
    assert by_cron_after.status is RunStatus.COMPLETED
    # The slot history is whole: every slot has its row, none was recorded missed (the
    # paused ones are not caught up either).
    assert await _rows(database, "tick") == [
        (T0, "completed", None),
        (T0 + MINUTE, "skipped", "paused"),
        (T0 + 2 * MINUTE, "skipped", "paused"),
        (T0 + 3 * MINUTE, "completed", None),
        (T0 + 4 * MINUTE, "completed", None),
    ]
    # Resumed, it owes the first slot after the resume, not the ones of the pause.
    async with database.connect() as conn:
        late = await backlog.overdue_by_task(conn, [task], T0 + 4 * MINUTE + timedelta(seconds=30))
    assert late["tick"] is None


async def test_pause_of_an_unknown_task_is_refused(app: App) -> None:
    with pytest.raises(UnknownTask, match="unknown task 'nope'"):
        await app.tasks.pause("nope")
    assert await app.tasks.states() == {}


# -- run now ---------------------------------------------------------------------------------


async def test_run_now_runs_once_under_the_lock_and_even_while_paused(
    app: App, batch: Batch
) -> None:
    await app.tasks.pause("tick", by="alice")
    batch.release = asyncio.Event()
    first = asyncio.create_task(app.tasks.run_now("tick"))
    await asyncio.wait_for(batch.started.wait(), 30)
    second = await app.tasks.run_now("tick")  # the first one holds the lock
    assert (second.status, second.skip_reason) == (RunStatus.SKIPPED, "lock_busy")
    batch.release.set()
    done = await first
    assert done.status is RunStatus.COMPLETED and done.slot is None
    assert done.trigger.value == "manual"


# -- poison items ----------------------------------------------------------------------------


async def test_an_item_is_parked_after_park_after_failures_then_retried_and_cleared(
    app: App, batch: Batch, database: Database
) -> None:
    async def at(minute: int) -> tuple[RunStatus, int, int, int]:
        result = await app.run("batch", now=T0 + minute * MINUTE)
        return result.status, result.items_ok, result.items_failed, result.items_parked

    assert await at(0) == (RunStatus.PARTIAL, 4, 1, 0)
    assert [(i.item, i.failures, i.parked) for i in await app.tasks.parked("batch")] == [
        ("2", 1, False)
    ]
    assert await at(1) == (RunStatus.PARTIAL, 4, 1, 0)  # its second failure parks it
    (item,) = await app.tasks.parked("batch")
    assert (item.failures, item.parked, item.error) == (2, True, "ValueError: bad key 2")
    assert await at(2) == (RunStatus.COMPLETED, 4, 0, 1)  # left out
    assert batch.done.count(2) == 0

    assert await app.tasks.retry_parked("batch", 2) is True
    assert await app.tasks.retry_parked("batch", 2) is False  # not parked any more
    assert await at(3) == (RunStatus.PARTIAL, 4, 1, 0)  # tried again: parked again at once
    assert (await app.tasks.parked("batch"))[0].parked is True

    assert await app.tasks.clear_parked("batch", 2) == 1
    assert await at(4) == (RunStatus.PARTIAL, 4, 1, 0)
    assert [(i.failures, i.parked) for i in await app.tasks.parked("batch")] == [(1, False)]
    batch.bad.clear()  # fixed: its success forgets it
    assert await at(5) == (RunStatus.COMPLETED, 5, 0, 0)
    assert await app.tasks.parked("batch") == []


async def test_every_new_item_failing_still_fails_a_run_known_bad_ones_do_not(
    app: App, batch: Batch
) -> None:
    batch.keys, batch.bad = [7, 8], {7, 8}
    first = await app.run("batch", now=T0)
    assert first.status is RunStatus.FAILED  # every item failed, and each was new
    second = await app.run("batch", now=T0 + MINUTE)
    # The same two, failing again: known bad, so the run is no failure (and they are parked).
    assert (second.status, second.items_failed) == (RunStatus.PARTIAL, 2)
    assert all(item.parked for item in await app.tasks.parked("batch"))
    batch.keys.append(9)
    batch.bad.add(9)
    third = await app.run("batch", now=T0 + 2 * MINUTE)
    assert (third.status, third.items_parked) == (RunStatus.FAILED, 2)
    assert third.error is not None and "bad key 9" in third.error
    fourth = await app.run("batch", now=T0 + 3 * MINUTE)
    assert fourth.status is RunStatus.PARTIAL  # 9 is known now: one failure, not parked yet
    # 9 failed twice: parked. 10 fails once (new, failed), then beside 11 (new): failed again.
    batch.keys.append(10)
    batch.bad.add(10)
    assert (await app.run("batch", now=T0 + 4 * MINUTE)).status is RunStatus.FAILED
    batch.keys.append(11)
    batch.bad.add(11)
    sixth = await app.run("batch", now=T0 + 5 * MINUTE)
    assert (sixth.status, sixth.items_failed, sixth.items_parked) == (RunStatus.FAILED, 2, 3)
    assert sixth.error is not None
    assert sixth.error.startswith("its one new item failed (1 more were failing already)")


async def test_park_after_none_keeps_no_memory(database: Database, batch: Batch) -> None:
    app = control_app(database, batch, park_after=None)
    batch.keys, batch.bad = [1, 2], {1, 2}
    try:
        for minute in range(4):  # every run whose items all failed is failed, as before
            result = await app.run("batch", now=T0 + minute * MINUTE)
            assert (result.status, result.items_failed, result.items_parked) == (
                RunStatus.FAILED,
                2,
                0,
            )
        assert await app.tasks.parked("batch") == []
    finally:
        await app.aclose()


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_park_after_is_checked_at_declaration(value: object) -> None:
    app = App()
    with pytest.raises(ConfigurationError, match="park_after"):
        app.periodic("t", cron="* * * * *", park_after=value)  # type: ignore[arg-type]


# -- the README's reindex example ------------------------------------------------------------


async def test_the_reindex_example_settles_into_completed_runs_with_3_parked_posts(
    database: Database, examples: ModuleType
) -> None:
    app: App = examples.app
    app.use_database(str(database.url))
    every = timedelta(minutes=15)  # reindex-fts is */15
    try:
        async with database.session() as session:
            await examples.setup_demo(session, posts=800)
        outcomes = []
        for n in range(10):
            result = await app.run("reindex-fts", now=T0 + n * every + timedelta(seconds=3))
            outcomes.append((result.status, result.items_failed, result.items_parked))
        report = await collect(app.tasks, database, now=T0 + 9 * every + timedelta(seconds=10))
        parked = await app.tasks.parked("reindex-fts")
        # A new bad post raises a failure again.
        async with database.session() as session:
            await session.execute(
                insert(Post).values(id=801, title="new", content="new", language="quenya")
            )
            await session.commit()
        new_bad = await app.run("reindex-fts", now=T0 + 10 * every + timedelta(seconds=3))
    finally:
        await app.aclose()

    bad = len(BAD_POSTS)
    assert outcomes[:3] == [(RunStatus.PARTIAL, bad, 0)] * 3
    assert outcomes[3:] == [(RunStatus.COMPLETED, 0, bad)] * 7
    assert sorted(int(item.item) for item in parked) == sorted(BAD_POSTS)
    assert all(item.parked and "does not exist" in item.error for item in parked)
    entry = next(t for t in report["tasks"] if t["task"] == "reindex-fts")
    assert entry["consecutive_failures"] == 0 and entry["parked_count"] == bad
    assert {p["item"] for p in entry["parked"]} == {str(post) for post in BAD_POSTS}
    assert (new_bad.status, new_bad.items_failed, new_bad.items_parked) == (
        RunStatus.FAILED,
        1,
        bad,
    )
    assert [f.item for f in new_bad.failures] == ["801"]


# -- the command line ------------------------------------------------------------------------


async def test_task_verbs_on_the_command_line(
    database: Database, database_url: str, examples: ModuleType
) -> None:
    app: App = examples.app
    app.use_database(str(database.url))
    try:
        async with database.session() as session:
            await examples.setup_demo(session, posts=20)  # post 17 is the one bad post
        for n in range(3):
            await app.run("reindex-fts", manual=True, now=T0 + n * MINUTE)

        async def cli(*args: str) -> tuple[int, str]:
            done = await invoke_async("--app", "tasks", *args, database_url=database_url)
            return done.returncode, done.stdout + done.stderr

        code, out = await cli("task", "pause", "reindex-fts", "--by", "bob", "--json")
        assert code == 0 and json.loads(out)["paused_by"] == "bob"
        assert (await app.tasks.states())["reindex-fts"].paused
        code, out = await cli("task", "pause", "reindex-fts")
        assert code == 0 and "already paused by bob" in out
        code, out = await cli("task", "run-now", "reindex-fts")
        assert code == 0 and "1 parked item(s) left out" in out
        code, out = await cli("task", "resume", "reindex-fts")
        assert (code, out.strip()) == (0, "reindex-fts: resumed")
        assert not (await app.tasks.states())["reindex-fts"].paused
        code, out = await cli("task", "pause", "nosuch")
        assert code == 2 and "unknown task 'nosuch'" in out

        code, out = await cli("task", "parked", "reindex-fts")
        assert code == 0 and re.search(r"^17\s+parked\s+3\s", out, re.MULTILINE), out
        assert "klingon" in out
        code, out = await cli("task", "parked", "reindex-fts", "--retry", "17")
        assert (code, out.strip()) == (0, "reindex-fts: item 17 retried")
        code, out = await cli("task", "parked", "reindex-fts", "--retry", "17")
        assert code == 1 and "not parked" in out
        code, out = await cli("task", "parked", "reindex-fts", "--clear", "17", "--json")
        assert code == 0 and json.loads(out)["items"] == 1
        code, out = await cli("task", "parked", "reindex-fts", "--clear", "17")
        assert code == 1
        code, out = await cli("task", "parked", "reindex-fts", "--clear-all")
        assert code == 0
        code, out = await cli("task", "parked", "reindex-fts", "--retry", "1", "--clear-all")
        assert code == 2
        code, out = await cli("task", "parked", "reindex-fts", "--json")
        assert code == 0 and json.loads(out) == {"task": "reindex-fts", "items": []}
    finally:
        await app.aclose()


# -- HTTP and the dashboard ------------------------------------------------------------------


@pytest.fixture
async def client(app: App) -> AsyncIterator[httpx.AsyncClient]:
    api = create_api(app, token=TOKEN, read_token=READ)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        yield http


async def test_pause_resume_run_and_parked_over_http(app: App, client: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await client.post("/tasks/tick/pause")).status_code == 401
    read_only = {"Authorization": f"Bearer {READ}"}
    assert (await client.post("/tasks/tick/pause", headers=read_only)).status_code == 403
    assert await app.tasks.states() == {}

    answer = await client.post("/tasks/tick/pause", params={"by": "carol"}, headers=auth)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["paused"], answer.json()["paused_by"]) == (True, "carol")
    skipped = await app.run("tick", now=T0)
    assert skipped.skip_reason == "paused"
    answer = await client.post("/tasks/tick/resume", headers=auth)
    assert (answer.status_code, answer.json()["paused"]) == (200, False)
    missing = await client.post("/tasks/nope/pause", headers=auth)
    assert missing.status_code == 404 and "unknown task" in missing.json()["detail"]

    ran = await client.post("/tasks/batch/run", headers=auth)
    assert ran.status_code == 200, ran.text
    assert (ran.json()["status"], ran.json()["trigger"]) == ("partial", "manual")
    await client.post("/tasks/batch/run", headers=auth)
    parked = await client.get("/tasks/batch/parked", headers=read_only)
    assert parked.status_code == 200
    assert [(p["item"], p["parked"], p["error"]) for p in parked.json()] == [
        ("2", True, "ValueError: bad key 2")
    ]
    await client.post("/tasks/batch/run", headers=auth)
    recent = await client.get("/runs", params={"task": "batch", "limit": 1}, headers=read_only)
    assert recent.json()[0]["items_parked"] == 1
    assert (await client.get("/tasks/nope/parked", headers=read_only)).status_code == 404


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html
    return found.group(1)


async def test_pause_resume_and_run_now_from_the_dashboard(
    app: App, client: httpx.AsyncClient
) -> None:
    login = await client.post(
        "/dashboard/login", data={"token": TOKEN, "next": "/dashboard/"}, headers=ORIGIN
    )
    assert login.status_code == 303
    page = await client.get("/dashboard/tasks/tick")
    assert page.status_code == 200 and "Pause" in page.text
    csrf = _csrf(page.text)
    # A post with neither the session's CSRF token nor this server's origin changes nothing.
    refused = await client.post("/dashboard/tasks/tick/pause", data={}, headers=ORIGIN)
    assert refused.status_code == 403
    elsewhere = {"Origin": "https://evil.example"}
    refused = await client.post(
        "/dashboard/tasks/tick/pause", data={"csrf": csrf}, headers=elsewhere
    )
    assert refused.status_code == 403
    assert await app.tasks.states() == {}

    done = await client.post("/dashboard/tasks/tick/pause", data={"csrf": csrf}, headers=ORIGIN)
    assert done.status_code == 303 and "paused" in done.headers["location"]
    state = (await app.tasks.states())["tick"]
    assert state.paused and state.paused_by is not None
    assert state.paused_by.startswith("dashboard from")
    page = await client.get("/dashboard/tasks/tick")
    assert "Resume" in page.text and state.paused_by in page.text
    overview = await client.get("/dashboard/")
    assert "badge-paused" in overview.text and state.paused_by in overview.text
    # A scheduler's slot and a crontab line's, while paused from the dashboard.
    scheduler = Scheduler(app, app.database, tasks=["tick"], clock=lambda: T0)
    (by_scheduler,) = await scheduler.wake(app.task("tick"), now=T0)
    by_crontab = await app.run("tick", now=T0 + MINUTE)
    assert by_scheduler.skip_reason == by_crontab.skip_reason == "paused"

    ran = await client.post("/dashboard/tasks/tick/run", data={"csrf": csrf}, headers=ORIGIN)
    assert ran.status_code == 303 and "completed" in ran.headers["location"]
    done = await client.post("/dashboard/tasks/tick/resume", data={"csrf": csrf}, headers=ORIGIN)
    assert done.status_code == 303
    assert not (await app.tasks.states())["tick"].paused
    resumed = await app.run("tick", now=T0 + 2 * MINUTE)
    assert resumed.status is RunStatus.COMPLETED

    for _ in range(2):
        await app.tasks.run_now("batch")
    page = await client.get("/dashboard/tasks/batch")
    assert "Failing items" in page.text and "ValueError: bad key 2" in page.text


async def test_a_chunked_run_remembers_and_parks_its_items_too(
    database: Database, batch: Batch
) -> None:
    app = App(retention=False)
    app.use_database(str(database.url))

    @app.periodic("chunky", cron="* * * * *", commit_every=2, park_after=2)
    async def chunky(run: Run) -> None:
        for key in run.skip_parked(batch.keys):
            async with run.item(key):
                if key in batch.bad:
                    raise ValueError(f"bad key {key}")

    try:
        outcomes = []
        for minute in range(3):
            result = await app.run("chunky", now=T0 + minute * MINUTE)
            outcomes.append(
                (result.status, result.items_ok, result.items_failed, result.items_parked)
            )
        (item,) = await app.tasks.parked("chunky")
    finally:
        await app.aclose()
    assert outcomes == [
        (RunStatus.PARTIAL, 4, 1, 0),
        (RunStatus.PARTIAL, 4, 1, 0),
        (RunStatus.COMPLETED, 4, 0, 1),
    ]
    assert (item.item, item.parked) == ("2", True)
    async with database.connect() as conn:
        parked = await conn.scalar(select(runs.c.items_parked).order_by(runs.c.id.desc()))
    assert parked == 1  # the chunked run's row says so too
