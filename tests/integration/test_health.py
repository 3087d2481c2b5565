"""Health that tells the truth (issue 12, part 5): a run whose every item failed is no success.

It is recorded ``failed`` (exit 1), commits nothing — what its body wrote outside its items
included, so that ``failed`` keeps meaning what README's Outcomes table says — and leaves the
task's last success where it was in ``status``, ``/metrics`` and ``GET /runs``. A run with no
items at all (a single statement) is a success.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cli import invoke_async
from itemsupport import count
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, select
from testapps import health

from cronlock import App, Database, RunStatus
from cronlock.http import create_api
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.observe.status import collect
from cronlock.sql.tables import runs

SLOT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def minute(n: int, seconds: float = 0.5) -> datetime:
    """``n`` minutes after SLOT, ``seconds`` into that minute."""
    return SLOT + timedelta(minutes=n, seconds=seconds)


@pytest.fixture
async def app(database: Database) -> AsyncIterator[App]:
    async with database.engine.begin() as conn:
        await conn.run_sync(health.scratch.create_all)
    app = health.create_app()
    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


async def switch_on(database: Database, name: str) -> None:
    async with database.session() as session:
        await session.execute(insert(health.switch).values(name=name))
        await session.commit()


async def switch_off(database: Database, name: str) -> None:
    async with database.session() as session:
        await session.execute(health.switch.delete().where(health.switch.c.name == name))
        await session.commit()


def samples(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render_metrics(families).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def task_health(report: dict[str, Any], name: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = [t for t in report["tasks"] if t["task"] == name]
    [entry] = entries
    return entry


async def test_every_item_failed_is_failed_and_commits_nothing(
    app: App, database: Database
) -> None:
    await switch_on(database, "broken")

    result = await app.run("batch", now=minute(0))
    again = await app.run("batch", now=minute(0, 20))

    assert result.status is RunStatus.FAILED
    assert (result.items_ok, result.items_failed) == (0, 3)
    assert result.error == "all 3 items failed; the first: ValueError: item 0 cannot be done"
    assert [f.item for f in result.failures] == ["0", "1", "2"]
    # Nothing stays, not even the note the body wrote outside its items.
    assert await count(database, health.done) == 0
    assert await count(database, health.notes) == 0
    # It claimed its slot, like any failed run: the next invocation for it does nothing.
    assert (again.status, again.skip_reason) == (RunStatus.SKIPPED, "slot_done")
    async with database.connect() as conn:
        row = (await conn.execute(select(runs).where(runs.c.status == "failed"))).mappings().one()
    assert (row["slot"], row["items_ok"], row["items_failed"]) == (SLOT, 0, 3)
    assert row["error"] == result.error
    assert len(row["failures"]) == 3


async def test_one_item_that_failed_is_said_so(app: App, database: Database) -> None:
    await switch_on(database, "broken")
    result = await app.run("one-item", now=minute(0))
    assert result.status is RunStatus.FAILED
    assert result.error == "its one item failed: LookupError: nothing to look up"


async def test_a_run_without_items_is_a_success(app: App, database: Database) -> None:
    single = await app.run("single", now=minute(0))
    assert (single.status, single.items_ok, single.items_failed) == (RunStatus.COMPLETED, 0, 0)
    assert await count(database, health.notes, health.notes.c.task == "single") == 1
    report = await collect(app.tasks, app.database, now=minute(0, 30))
    # status's last success is when that run finished; the metric's, when it started.
    assert task_health(report, "single")["last_success"] == single.finished_at.isoformat()


async def test_all_failed_runs_leave_the_last_success_where_it_was(
    app: App, database: Database
) -> None:
    first = await app.run("batch", now=minute(0))
    await switch_on(database, "broken")
    await app.run("batch", now=minute(1))
    await app.run("batch", now=minute(2))
    assert first.status is RunStatus.COMPLETED

    report = await collect(app.tasks, app.database, now=minute(2, 30))
    batch = task_health(report, "batch")
    assert batch["last_success"] == first.finished_at.isoformat()
    assert batch["consecutive_failures"] == 2

    m = samples(await scrape(app.database, app.tasks.values(), now=minute(2, 30)))
    assert m[("cronlock_task_last_success_timestamp_seconds", (("task", "batch"),))] == (
        first.started_at.timestamp()
    )
    assert m[("cronlock_task_consecutive_failures", (("task", "batch"),))] == 2
    assert m[("cronlock_task_runs_total", (("status", "failed"), ("task", "batch")))] == 2
    assert m[("cronlock_task_runs_total", (("status", "partial"), ("task", "batch")))] == 0

    transport = httpx.ASGITransport(app=create_api(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        answer = await http.get("/runs", params={"task": "batch"})
    assert answer.status_code == 200
    assert [(r["status"], r["items_ok"], r["items_failed"]) for r in answer.json()] == [
        ("failed", 0, 3),
        ("failed", 0, 3),
        ("completed", 3, 0),
    ]

    # Back to health: the next good run is the new last success, the streak ends.
    await switch_off(database, "broken")
    fixed = await app.run("batch", now=minute(3))
    report = await collect(app.tasks, app.database, now=minute(3, 30))
    assert task_health(report, "batch")["last_success"] == fixed.finished_at.isoformat()
    assert task_health(report, "batch")["consecutive_failures"] == 0


async def test_the_command_line_exits_1_and_status_counts_the_failure(
    app: App, database: Database, database_url: str
) -> None:
    await switch_on(database, "broken")
    # --manual: at whatever time it is now, not at one of the task's slots.
    done = await invoke_async(
        "--app", "testapps.health", "run", "batch", "--manual", "--json",
        database_url=database_url,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    payload = json.loads(done.stdout)
    assert (payload["status"], payload["items_ok"], payload["items_failed"]) == ("failed", 0, 3)
    assert payload["error"].startswith("all 3 items failed; the first: ValueError")
    plain = await invoke_async(
        "--app", "testapps.health", "run", "batch", "--manual", database_url=database_url
    )
    assert plain.returncode == 1
    assert "error: all 3 items failed; the first: ValueError: item 0 cannot be done" in (
        plain.stdout
    )
    assert "(nothing of the run was committed)" in plain.stdout
    shown = await invoke_async("--app", "testapps.health", "status", database_url=database_url)
    assert "batch: last success never; 2 failures and 0 missed slots in a row" in shown.stdout
