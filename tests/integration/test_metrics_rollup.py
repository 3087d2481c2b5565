"""The metrics' rollup of finished jobs (cronlock/sql/rollups.py): what /metrics reports equals a
count of the whole table (sql.JOB_TOTALS, the scrape's old way), through folds, prunes, a fold
that another scrape holds, and a completion that commits after the mark's point was chosen."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from jobsupport import job_app
from plans import PLAN_MODES, plan_of
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, text

import cronlock
from cronlock import Database, sql
from cronlock.observe.prometheus import FOLD_LAG, fold, render_metrics, scrape
from cronlock.pg import AsyncpgStatement
from cronlock.retention import Retention, prune
from cronlock.sql.tables import job_totals, metric_marks

NO_MARK = datetime(1970, 1, 1, tzinfo=UTC)  # the mark before any fold
_FIELDS = ("completed", "failed", "cancelled", "retries", "snoozes")


def _bucket_name(index: int) -> str:
    return repr(float(sql.LATENCY_BUCKETS[index]))


async def _from_scratch(database: Database) -> dict[str, dict[str, Any]]:
    """Per queue, the counters and histogram counted from every row of jobs."""
    async with database.connect() as conn:
        rows = (await conn.execute(sql.JOB_TOTALS)).mappings().all()
    return {
        row["queue"]: {
            **{name: int(row[name]) for name in _FIELDS},
            "latency_sum": round(float(row["latency_sum"]), 3),
            "buckets": [int(row[f"le_{i}"]) for i in range(len(sql.LATENCY_BUCKETS))],
        }
        for row in rows
    }


async def _scraped(
    database: Database, now: datetime | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]]]:
    """Per queue, the same numbers as /metrics reports them, and the cronlock_jobs gauge."""
    text = render_metrics(await scrape(database, now=now)).decode()
    found: dict[str, dict[str, Any]] = {}
    gauge: dict[str, dict[str, float]] = {}
    names = {
        "cronlock_jobs_processed_total": "completed",
        "cronlock_jobs_failed_total": "failed",
        "cronlock_jobs_cancelled_total": "cancelled",
        "cronlock_jobs_retried_total": "retries",
        "cronlock_jobs_snoozed_total": "snoozes",
    }
    bounds = {_bucket_name(i): i for i in range(len(sql.LATENCY_BUCKETS))}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            queue = sample.labels.get("queue")
            if queue is None:
                continue
            if sample.name == "cronlock_jobs":
                gauge.setdefault(queue, {})[sample.labels["status"]] = sample.value
                continue
            row = found.setdefault(queue, {"buckets": [0] * len(bounds)})
            if sample.name in names:
                row[names[sample.name]] = int(sample.value)
            elif sample.name == "cronlock_job_latency_seconds_sum":
                row["latency_sum"] = round(sample.value, 3)
            elif sample.name == "cronlock_job_latency_seconds_bucket":
                le = sample.labels["le"]
                if le in bounds:
                    row["buckets"][bounds[le]] = int(sample.value)
    return found, gauge


async def _mark(database: Database) -> datetime:
    async with database.connect() as conn:
        through: datetime = (
            await conn.execute(
                select(metric_marks.c.through).where(metric_marks.c.name == sql.JOBS_MARK)
            )
        ).scalar_one()
    return through


async def _rolled_up(database: Database) -> int:
    async with database.connect() as conn:
        total: int = (
            await conn.execute(select(func.coalesce(func.sum(job_totals.c.completed), 0)))
        ).scalar_one()
    return total


def _at(moment: datetime) -> Any:
    def clock() -> datetime:
        return moment

    return clock


async def test_rollup_matches_a_count_from_scratch_through_folds_and_prunes(
    database: Database,
) -> None:
    async with job_app(database) as app:

        async def enqueue_round() -> None:
            async with database.session() as session:
                await app.enqueue_many_tx(session, "echo", [{"n": n} for n in range(5)])
                await app.enqueue_many_tx(session, "echo", [{"n": 1}, {"n": 2}], queue="other")
                await app.enqueue_tx(session, "always_fail", {})  # 3 attempts: 2 retries, failed
                await app.enqueue_tx(session, "gives_up", {})  # cancelled by its handler
                await app.enqueue_tx(session, "snoozy", {"key": str(key), "times": 2, "delay": 60})
                await session.commit()

        # Round 1 finishes at base; the folds choose a point past it, then fold it in.
        key = 1
        await enqueue_round()
        base = datetime.now(UTC)  # the drainers' clocks run from after the first enqueues
        await app.drainer(clock=_at(base)).drain()
        assert await fold(database, now=base + timedelta(hours=1)) == NO_MARK
        # Round 2 at base + 2 h: always_fail retries, the snoozed job runs again, new jobs.
        key = 2
        await enqueue_round()
        await app.drainer(clock=_at(base + timedelta(hours=2))).drain()
        first_point = base + timedelta(hours=1) - FOLD_LAG
        assert await fold(database, now=base + timedelta(hours=3)) == first_point
        assert await _rolled_up(database) > 0
        # Round 3 at base + 4 h: both always_fail jobs move on, the jobs of round 2 fold in.
        await app.drainer(clock=_at(base + timedelta(hours=4))).drain()
        await fold(database, now=base + timedelta(hours=5))
        assert await _mark(database) == base + timedelta(hours=3) - FOLD_LAG

        expected = await _from_scratch(database)
        assert expected["default"]["retries"] >= 3 and expected["default"]["snoozes"] >= 1
        assert expected["default"]["failed"] >= 1 and expected["default"]["cancelled"] == 2
        found, gauge = await _scraped(database, now=base + timedelta(hours=5))
        assert found == expected
        async with database.connect() as conn:
            counts = {
                (queue, status): number
                for queue, status, number in await conn.execute(sql.JOB_COUNTS)
            }
        for (queue, status), number in counts.items():
            assert gauge[queue][status] == number

        # Prune what round 1 finished (folded in): the counters stay, the table has fewer rows.
        pruned = await prune(
            database,
            Retention(completed=timedelta(hours=1), failed=timedelta(hours=1)),
            now=base + timedelta(hours=1, minutes=1),
        )
        assert pruned.completed_jobs > 0 and pruned.cancelled_jobs > 0
        assert (await _from_scratch(database))["default"]["completed"] < expected["default"][
            "completed"
        ]
        found, gauge = await _scraped(database, now=base + timedelta(hours=5))
        assert found == expected
        assert gauge["default"]["completed"] == expected["default"]["completed"]


async def test_a_completion_committed_after_the_point_was_chosen_is_counted_once(
    database: Database,
) -> None:
    """A strict-mode lane holds its claim's transaction (and its id) while the handler runs; its
    completed_at (the worker's clock) is earlier than the point the next folds choose. The fold
    waits for that transaction, then counts the job once."""
    started, release = asyncio.Event(), asyncio.Event()
    app = cronlock.App()

    @app.job("slow")
    async def slow(session: Any, payload: Any) -> None:
        started.set()
        await release.wait()

    @app.job("quick")
    async def quick(session: Any, payload: Any) -> None:
        return None

    app.use_database(str(database.url))
    try:
        async with database.session() as session:
            await app.enqueue_many_tx(session, "quick", [{}, {}, {}])
            await session.commit()
        base = datetime.now(UTC)
        await app.drainer(clock=_at(base)).drain()
        async with database.session() as session:
            await app.enqueue_tx(session, "slow", {})
            await session.commit()
        # The handler's completion will carry base + 10 min, under every point chosen below.
        lane = app.drainer(clock=_at(base + timedelta(minutes=10)))
        draining = asyncio.create_task(lane.drain())
        try:
            await asyncio.wait_for(started.wait(), 30)
            await fold(database, now=base + timedelta(hours=1))  # a point past base + 10 min
            # The lane's transaction is still open: the point is not ready, the mark stays.
            stayed = await fold(database, now=base + timedelta(hours=2))
            found, _ = await _scraped(database, now=base + timedelta(hours=2))
            assert found["default"]["completed"] == 3
        finally:
            release.set()
            await asyncio.wait_for(draining, 30)
        folded = await fold(database, now=base + timedelta(hours=3))
        found, _ = await _scraped(database, now=base + timedelta(hours=4))
        assert found == await _from_scratch(database)
        assert found["default"]["completed"] == 4
        assert stayed == NO_MARK
        assert folded == base + timedelta(hours=1) - FOLD_LAG
        assert await _rolled_up(database) == 4  # the late completion is in the rollup
    finally:
        await app.aclose()


async def test_a_scrape_while_another_folds_reads_without_folding(database: Database) -> None:
    async with job_app(database) as app:
        async with database.session() as session:
            await app.enqueue_many_tx(session, "echo", [{"n": n} for n in range(4)])
            await session.commit()
        base = datetime.now(UTC)
        await app.drainer(clock=_at(base)).drain()
        await fold(database, now=base + timedelta(hours=1))
        await fold(database, now=base + timedelta(hours=2))
        through = await _mark(database)
        async with database.connect() as holder, holder.begin():
            # Another scrape's fold holds the mark (its METRIC_MARK_TAKE): this one skips.
            values = {"mark": sql.JOBS_MARK, "now": None, "lag_seconds": 30.0}
            assert (await holder.execute(sql.METRIC_MARK_TAKE, values)).one_or_none() is not None
            assert await fold(database, now=base + timedelta(hours=3)) is None
            found, _ = await _scraped(database, now=base + timedelta(hours=3))
            assert found == await _from_scratch(database)
        assert await _mark(database) == through


def _scans_of_jobs(node: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(node type, index) of every node of a JSON plan that reads cronlock.jobs."""
    found = []
    if node.get("Relation Name") == "jobs":
        found.append((str(node["Node Type"]), node.get("Index Name")))
    for child in node.get("Plans", []):
        found.extend(_scans_of_jobs(child))
    return found


async def test_the_open_jobs_retries_and_snoozes_are_read_from_their_partial_indexes(
    database: Database,
) -> None:
    """20,000 finished jobs, 2,000 open ones of which 200 retried and 10 snoozed, vacuumed:
    the scrape's read of the jobs (JOB_TOTALS_NOW) touches only the finished ones above the
    mark and the open ones that retried (from ix_jobs_retried alone) or snoozed; never every
    open job's row. The open parts take no parameter, so the generic plan reads them the same
    way; the part above the mark is a range of ix_jobs_finished in the custom plan (the
    generic one, costed for a third of the table above an unknown mark, scans the table:
    PostgreSQL keeps a generic plan only while it costs no more than the custom ones)."""
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO cronlock.jobs (job_type, payload, status, retry_count, "
                "completed_at, error_history) "
                "SELECT 'noop', '{}', s.status, CASE WHEN i % 10 = 1 THEN 1 ELSE 0 END, "
                "CASE s.status WHEN 'completed' THEN now() - interval '1 hour' END, "
                'CASE WHEN i % 200 = 2 THEN \'[{"outcome": "snoozed"}]\'::jsonb '
                "ELSE '[]'::jsonb END "
                "FROM generate_series(1, 22000) i, LATERAL (SELECT CASE WHEN i <= 20000 "
                "THEN 'completed' WHEN i % 10 = 1 THEN 'retrying' ELSE 'pending' END "
                "AS status) s"
            )
        )
    raw_database = await database.engine.raw_connection()
    try:
        raw = raw_database.driver_connection
        assert raw is not None
        await raw.execute("VACUUM ANALYZE cronlock.jobs")
        compiled = AsyncpgStatement.of(sql.JOB_TOTALS_NOW, database.schema)
        args = compiled.args(through=datetime.now(UTC) - timedelta(minutes=1))
        for mode in PLAN_MODES:
            scans = _scans_of_jobs(await plan_of(raw, compiled, args, mode))
            assert ("Index Only Scan", "ix_jobs_retried") in scans, scans
            assert any(index == "ix_jobs_snoozed" for _, index in scans), scans
            assert len(scans) == 3, scans
        custom = _scans_of_jobs(await plan_of(raw, compiled, args, "force_custom_plan"))
        assert {index for _, index in custom} == {
            "ix_jobs_finished",
            "ix_jobs_retried",
            "ix_jobs_snoozed",
        }, custom
    finally:
        raw_database.close()
