"""The metrics' rollup of finished runs (cronlock/sql/rollups.py): what /metrics reports of the
periodic tasks equals a count of the whole table (sql.RUN_TOTALS, the scrape's old way) through
folds, across the fold's boundary (the consecutive failures, the last success), for a run
committed out of id order, a chunked run still running when folded, prunes, and a TRUNCATE."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from testdb import RESET, libpq_url

from cronlock import Database, sql
from cronlock.observe.prometheus import fold_runs, render_metrics, scrape
from cronlock.retention import Retention, prune
from cronlock.sql.tables import RUN_STATUSES, metric_marks, run_totals

_MEASURES = ("duration", "lateness")


def _bound(index: int) -> str:
    return repr(float(sql.LATENCY_BUCKETS[index]))


def _empty() -> dict[str, Any]:
    row: dict[str, Any] = {"runs": {}, "last_success": None, "consecutive": 0}
    for measure in _MEASURES:
        row[measure] = {"count": 0, "sum": 0.0, "buckets": [0] * len(sql.LATENCY_BUCKETS)}
    return row


async def _from_scratch(database: Database) -> dict[str, dict[str, Any]]:
    """Per task, the runs' metrics counted from every row of runs."""
    async with database.connect() as conn:
        rows = (await conn.execute(sql.RUN_TOTALS)).mappings().all()
    found = {}
    for row in rows:
        task = _empty()
        task["runs"] = {status: int(row[status]) for status in RUN_STATUSES}
        when = row["last_success_at"]
        task["last_success"] = when.timestamp() if when is not None else None
        task["consecutive"] = int(row["consecutive_failures"])
        for measure in _MEASURES:
            task[measure] = {
                "count": int(row[f"{measure}_count"]),
                "sum": round(float(row[f"{measure}_sum"]), 3),
                "buckets": [int(row[f"{measure}_le_{i}"]) for i in range(16)],
            }
        found[row["task"]] = task
    return found


async def _scraped(database: Database, now: datetime) -> dict[str, dict[str, Any]]:
    """Per task, the same numbers as /metrics reports them."""
    text = render_metrics(await scrape(database, now=now)).decode()
    bounds = {_bound(i): i for i in range(len(sql.LATENCY_BUCKETS))}
    found: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "task" not in sample.labels or sample.name.startswith("cronlock_task_overdue"):
                continue
            task = found.setdefault(sample.labels["task"], _empty())
            name = sample.name.removeprefix("cronlock_task_")
            if name == "runs_total":
                task["runs"][sample.labels["status"]] = int(sample.value)
            elif name == "last_success_timestamp_seconds":
                task["last_success"] = sample.value
            elif name == "consecutive_failures":
                task["consecutive"] = int(sample.value)
            for measure in _MEASURES:
                if name == f"{measure}_seconds_count":
                    task[measure]["count"] = int(sample.value)
                elif name == f"{measure}_seconds_sum":
                    task[measure]["sum"] = round(sample.value, 3)
                elif name == f"{measure}_seconds_bucket" and sample.labels["le"] in bounds:
                    task[measure]["buckets"][bounds[sample.labels["le"]]] = int(sample.value)
    return found


class _Clock:
    """The folds' and scrapes' ``now``: an hour later at every call, far past the lag."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(hours=1)
        return self.now

    def ticks(self, n: int) -> Iterator[datetime]:
        return (self() for _ in range(n))


async def _fold_all(database: Database, clock: _Clock) -> int | None:
    """Three folds: the newest id is noted, becomes the pending point, is folded to."""
    through = None
    for now in clock.ticks(3):
        through = await fold_runs(database, now=now)
    return through


_T0 = datetime(2026, 11, 1, tzinfo=UTC)


async def _insert(
    conn: AsyncConnection,
    task: str,
    status: str,
    minute: float,
    *,
    seconds: float = 1.5,
    late_ms: float | None = 800.0,
) -> int:
    """A run of ``task`` that started ``minute`` minutes after _T0, took ``seconds`` (none if
    it is running), ``late_ms`` after its slot (None: a manual run)."""
    started = _T0 + timedelta(minutes=minute)
    finished = None if status == "running" else started + timedelta(seconds=seconds)
    run_id: int = (
        await conn.execute(
            sql.RUN_INSERT,
            {
                "task": task,
                "slot": started if late_ms is not None else None,
                "status": status,
                "started_at": started,
                "finished_at": finished,
                "lateness_ms": late_ms,
                "trigger": "cron" if late_ms is not None else "manual",
            },
        )
    ).scalar_one()
    return run_id


async def _insert_committed(database: Database, *runs: tuple[str, str, float]) -> list[int]:
    async with database.connect() as conn, conn.begin():
        return [await _insert(conn, task, status, minute) for task, status, minute in runs]


async def _rolled_up(database: Database, task: str) -> dict[str, Any]:
    async with database.connect() as conn:
        row = (
            (await conn.execute(select(run_totals).where(run_totals.c.task == task)))
            .mappings()
            .one()
        )
    return dict(row)


async def _open_ids(database: Database) -> list[int]:
    async with database.connect() as conn:
        ids = (
            await conn.execute(
                select(metric_marks.c.open_ids).where(metric_marks.c.name == sql.RUNS_MARK)
            )
        ).scalar_one()
    return list(ids)


async def test_rollup_matches_a_count_from_scratch_across_the_fold_boundary(
    database: Database,
) -> None:
    """At every step, folded or not: runs by outcome, histograms, and the consecutive failures
    and last success however the task's latest success and failures lie about the mark."""
    clock = _Clock()

    async def agrees() -> dict[str, dict[str, Any]]:
        expected = await _from_scratch(database)
        assert await _scraped(database, clock()) == expected
        return expected

    # Folded: a success, then two failures after it; hourly: successes only, durations of all
    # sizes and a manual run (no lateness).
    await _insert_committed(
        database,
        ("minutely", "completed", 0),
        ("minutely", "failed", 1),
        ("minutely", "skipped", 1.5),
        ("minutely", "failed", 2),
        ("hourly", "completed", 0),
    )
    async with database.connect() as conn, conn.begin():
        await _insert(conn, "hourly", "partial", 60, seconds=400)
        await _insert(conn, "hourly", "completed", 61, late_ms=None, seconds=0.003)
    assert (await agrees())["minutely"]["consecutive"] == 2
    assert await _fold_all(database, clock) is not None
    folded = await _rolled_up(database, "minutely")
    assert (folded["failures_since"], folded["failed"], folded["skipped"]) == (2, 2, 1)
    assert (await agrees())["minutely"]["consecutive"] == 2

    # Above the mark: one more failure (3 in a row, two folded, one not).
    await _insert_committed(database, ("minutely", "failed", 3), ("minutely", "missed", 4))
    assert (await agrees())["minutely"]["consecutive"] == 3
    # A success above the mark ends the streak; a failure after it starts a new one.
    await _insert_committed(database, ("minutely", "partial", 5), ("minutely", "failed", 6))
    assert (await agrees())["minutely"]["consecutive"] == 1
    await _fold_all(database, clock)
    assert (await _rolled_up(database, "minutely"))["failures_since"] == 1
    assert (await agrees())["minutely"]["consecutive"] == 1

    # A success recorded after a failure that started later than it (another host's clock
    # behind): the failure still counts, as a count from scratch says, folded or not.
    await _insert_committed(database, ("minutely", "failed", 8), ("minutely", "completed", 7))
    assert (await agrees())["minutely"]["consecutive"] == 1
    await _fold_all(database, clock)
    assert (await agrees())["minutely"]["consecutive"] == 1
    # The same with the failure folded and the earlier-started success above the mark.
    await _insert_committed(database, ("minutely", "failed", 10))
    await _fold_all(database, clock)
    await _insert_committed(database, ("minutely", "completed", 9))
    expected = await agrees()
    assert expected["minutely"]["consecutive"] == 1
    assert expected["minutely"]["last_success"] == (_T0 + timedelta(minutes=9)).timestamp()
    await _fold_all(database, clock)  # the success folded in after the failure it preceded
    assert (await _rolled_up(database, "minutely"))["failures_since"] == 1
    assert await agrees() == expected
    # A task seen only above the mark.
    await _insert_committed(database, ("new", "failed", 0), ("new", "failed", 1))
    assert (await agrees())["new"]["consecutive"] == 2


async def test_a_run_committed_out_of_id_order_is_counted_once(database: Database) -> None:
    """A run's transaction took its id, then another run took the next and committed first:
    the newest id the fold sees is above a run it cannot see yet. The fold waits for that
    transaction, then counts the run once."""
    clock = _Clock()
    await _insert_committed(database, ("t", "completed", 0))
    async with database.connect() as late, late.begin():
        late_id = await _insert(late, "t", "failed", 1)  # holds its id, uncommitted
        (next_id,) = await _insert_committed(database, ("t", "completed", 2))
        assert next_id > late_id
        await fold_runs(database, now=clock())  # notes next_id, the newest visible
        await fold_runs(database, now=clock())  # the pending point, waiting for `late`
        stayed = await fold_runs(database, now=clock())
        assert stayed == 0  # `late` still holds its transaction: nothing is folded
        assert await _scraped(database, clock()) == await _from_scratch(database)
    # `late` committed: the next fold reads it below the point.
    assert await fold_runs(database, now=clock()) == next_id
    assert (await _rolled_up(database, "t"))["failed"] == 1
    expected = await _from_scratch(database)
    assert expected["t"]["runs"]["failed"] == 1 and expected["t"]["runs"]["completed"] == 2
    assert await _scraped(database, clock()) == expected
    await _fold_all(database, clock)
    assert await _scraped(database, clock()) == expected
    assert (await _rolled_up(database, "t"))["failed"] == 1


async def test_a_running_run_below_the_mark_is_counted_once_when_it_finishes(
    database: Database,
) -> None:
    """A chunked run's row is committed ``running`` and updated when it ends: folded past, it
    is left open, read live, and folded the once it has finished."""
    clock = _Clock()
    (running_id,) = await _insert_committed(database, ("chunky", "running", 0))
    (after,) = await _insert_committed(database, ("chunky", "completed", 1))
    assert await _fold_all(database, clock) == after
    assert await _open_ids(database) == [running_id]
    expected = await _from_scratch(database)
    assert expected["chunky"]["runs"]["running"] == 1
    assert await _scraped(database, clock()) == expected
    async with database.connect() as conn, conn.begin():
        finished = await conn.execute(
            sql.RUN_FINISH,
            {
                "run_id": running_id,
                "new_status": "failed",
                "new_finished_at": _T0 + timedelta(minutes=5),
                "new_items_ok": 0,
                "new_items_failed": 1,
                "new_items_parked": 0,
                "new_failures": [],
                "new_error": "RuntimeError: boom",
                "new_chunks": 3,
                "commits_work": False,
            },
        )
        assert finished.scalar_one() == running_id
    expected = await _from_scratch(database)
    assert expected["chunky"]["runs"]["running"] == 0
    assert expected["chunky"]["runs"]["failed"] == 1
    assert await _scraped(database, clock()) == expected  # still open: read live, once
    (newest,) = await _insert_committed(database, ("chunky", "skipped", 6))
    assert await _fold_all(database, clock) == newest
    assert await _open_ids(database) == []
    assert (await _rolled_up(database, "chunky"))["failed"] == 1
    assert await _scraped(database, clock()) == await _from_scratch(database)


async def test_pruning_runs_does_not_lower_the_counters(database: Database) -> None:
    clock = _Clock()
    now = datetime.now(UTC)
    await _insert_committed(
        database, *[("old", "completed" if n % 2 else "failed", -n) for n in range(1, 7)]
    )
    async with database.connect() as conn, conn.begin():
        for days in (40, 39, 38):  # runs older than the retention's 30 days
            minute = (now - timedelta(days=days) - _T0).total_seconds() / 60
            await _insert(conn, "old", "skipped", minute)
    await _fold_all(database, clock)
    expected = await _from_scratch(database)
    pruned = await prune(database, Retention(), now=now)
    assert pruned.runs > 0
    assert (await _from_scratch(database))["old"]["runs"]["skipped"] < 3
    assert await _scraped(database, clock()) == expected


async def test_a_truncate_of_cronlocks_tables_restarts_the_rollup(database: Database) -> None:
    """As the test pool's reset does between tests: the mark's row goes with the rest, and the
    ids start again at 1; the next fold writes a new mark and counts from there."""
    clock = _Clock()
    await _insert_committed(database, *[("t", "completed", n) for n in range(5)])
    assert await _fold_all(database, clock) == 5
    conn = await asyncpg.connect(libpq_url(database.url))
    try:
        await conn.execute(RESET)
    finally:
        await conn.close()
    assert await _scraped(database, clock()) == {}
    ids = await _insert_committed(database, ("t", "failed", 0), ("t", "completed", 1))
    assert ids == [1, 2]
    expected = await _from_scratch(database)
    assert await _scraped(database, clock()) == expected
    assert await _fold_all(database, clock) == 2
    assert await _scraped(database, clock()) == expected
    assert (await _rolled_up(database, "t"))["completed"] == 1
