"""A /metrics scrape with 1,000,000 finished jobs and 100,000 runs (issue 11, item 11: at most
50 ms at a million finished jobs), before and after the rollups of jobs and runs, in the same
run.

    python -m benchmarks.metrics_scrape [--server URL] [--jobs 1030000] [--runs 100000]
        [--scrapes 50] [--before 5]

A scratch database gets cronlock's schema and the dashboard benchmark's seed
(benchmarks/dashboard_overview.py: jobs in three queues created over the last 30 days, 97.5%
completed, 1% failed, 0.5% each cancelled, retrying later and pending, about a thousand
finished in the last quarter of an hour; ``--jobs`` 1,030,000 gives just over 1,000,000
finished jobs and about 10,000 open ones; ``--runs`` runs of a minutely and an hourly task),
then VACUUM ANALYZE, as autovacuum would have done. Then, in this order:

- **before**: ``--before`` scrapes the old way, the statements the scrape ran before the
  rollups (whole-table JOB_COUNTS, JOB_TOTALS and RUN_TOTALS, kept in cronlock/sql for tests
  and this comparison, beside the ones both ways share), timed in this process;
- **first scrapes after the upgrade**: the first four through the real endpoint (the
  worker's ``--metrics-port`` server, ``serve_metrics``, over HTTP), on the real clock: the
  first two choose the jobs' rollup's point and fold the jobs' history in, and note the newest
  run id; then a wait of the fold's lag (31 s); the third makes that id the runs' point, the
  fourth folds the runs' history in;
- **after**: ``--scrapes`` scrapes through the same endpoint, and each statement of the new
  scrape timed alone (``--before`` times each), to say where the time goes;
- a check that the scrape's job and run counters equal a count from scratch (sql.JOB_TOTALS,
  sql.RUN_TOTALS).

The JSON result goes under ``benchmarks/results/`` (``metrics-scrape-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from cronlock import sql
from cronlock.database import Database
from cronlock.observe.prometheus import FOLD_LAG, fold, fold_runs, serve_metrics
from cronlock.periodic import backlog
from cronlock.sql.tables import RUN_STATUSES

from .dashboard_overview import app, seed_tables
from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database, with_schema

__all__ = ["main", "measure"]

COUNT = """
SELECT count(*) FILTER (WHERE completed_at IS NOT NULL),
       count(*) FILTER (WHERE completed_at IS NULL),
       (SELECT count(*) FROM cronlock.runs)
FROM cronlock.jobs
"""


async def _seed(url: str, jobs: int, runs: int) -> dict[str, int]:
    await with_schema(url)
    conn = await asyncpg.connect(url)
    try:
        await seed_tables(conn, jobs, runs)
        row = await conn.fetchrow(COUNT)
        assert row is not None
        return {"finished_jobs": row[0], "open_jobs": row[1], "runs": row[2]}
    finally:
        await conn.close()


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95 + 0.5) - 1)], 1),
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
        "n": len(ordered),
    }


async def _timed(step: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await step()
    return (time.perf_counter() - start) * 1000


async def _old_scrape(database: Database) -> dict[str, float]:
    """The statements the scrape ran before the rollup, in its order; ms per statement."""
    tasks = list(app.tasks.values())
    spent: dict[str, float] = {}
    async with database.connect() as conn:
        for name in ("JOB_COUNTS", "JOB_OLDEST_DUE", "JOB_TOTALS", "WORKER_LIST", "RUN_TOTALS"):
            statement: Any = getattr(sql, name)
            start = time.perf_counter()
            await conn.execute(statement)
            spent[name] = (time.perf_counter() - start) * 1000
        spent["overdue"] = await _timed(
            lambda: backlog.overdue_by_task(conn, tasks, datetime.now(UTC))
        )
        spent["QUEUE_LIST"] = await _timed(lambda: conn.execute(sql.QUEUE_LIST))
    return spent


async def _new_statements(database: Database) -> dict[str, float]:
    """Each statement of the scrape as it is now, timed alone; ms per statement."""
    tasks = list(app.tasks.values())
    spent: dict[str, float] = {"fold": await _timed(lambda: fold(database))}
    spent["fold_runs"] = await _timed(lambda: fold_runs(database))
    async with database.connect() as conn:
        await conn.execute(sql.METRICS_NO_JIT_LOCAL)
        through = (await conn.execute(sql.METRIC_MARK_GET, {"mark": sql.JOBS_MARK})).scalar_one()
        marked = (await conn.execute(sql.RUN_MARK_GET, {"mark": sql.RUNS_MARK})).one()
        run_mark = {"through": marked.through_id, "open_ids": list(marked.open_ids)}
        spent["JOB_COUNTS_OPEN"] = await _timed(lambda: conn.execute(sql.JOB_COUNTS_OPEN))
        spent["JOB_OLDEST_DUE"] = await _timed(lambda: conn.execute(sql.JOB_OLDEST_DUE))
        spent["JOB_TOTALS_NOW"] = await _timed(
            lambda: conn.execute(sql.JOB_TOTALS_NOW, {"through": through})
        )
        spent["WORKER_LIST"] = await _timed(lambda: conn.execute(sql.WORKER_LIST))
        spent["RUN_TOTALS_NOW"] = await _timed(lambda: conn.execute(sql.RUN_TOTALS_NOW, run_mark))
        spent["overdue"] = await _timed(
            lambda: backlog.overdue_by_task(conn, tasks, datetime.now(UTC))
        )
        spent["QUEUE_LIST"] = await _timed(lambda: conn.execute(sql.QUEUE_LIST))
    return spent


def _per_statement(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(r[name] for r in rounds), 1) for name in rounds[0]}


async def _agrees(database: Database, text: str) -> bool:
    """Whether the scraped job and run counters equal a count of the whole table."""
    async with database.connect() as conn:
        rows = (await conn.execute(sql.JOB_TOTALS)).mappings().all()
        run_rows = (await conn.execute(sql.RUN_TOTALS)).mappings().all()
    expected = {
        (row["queue"], name): int(row[column])
        for row in rows
        for name, column in (
            ("cronlock_jobs_processed_total", "completed"),
            ("cronlock_jobs_failed_total", "failed"),
            ("cronlock_jobs_cancelled_total", "cancelled"),
            ("cronlock_jobs_retried_total", "retries"),
        )
    }
    found = {
        (sample.labels["queue"], sample.name): int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in {name for _, name in expected}
    }
    runs_expected = {
        (row["task"], status, name): int(row[column])
        for row in run_rows
        for status, name, column in (
            *((s, "cronlock_task_runs_total", s) for s in RUN_STATUSES),
            ("", "cronlock_task_consecutive_failures", "consecutive_failures"),
            ("", "cronlock_task_duration_seconds_count", "duration_count"),
            ("", "cronlock_task_lateness_seconds_count", "lateness_count"),
        )
    }
    runs_found = {
        (sample.labels["task"], sample.labels.get("status", ""), sample.name): int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in {name for _, _, name in runs_expected}
    }
    return found == expected and runs_found == runs_expected


async def measure(
    server: str, *, jobs: int, runs: int, scrapes: int, before: int
) -> dict[str, Any]:
    async with scratch_database(server, "metrics") as url:
        started = time.monotonic()
        seeded = await _seed(url, jobs, runs)
        seed_seconds = round(time.monotonic() - started, 1)
        database = Database(url)
        try:
            old_rounds = [await _old_scrape(database) for _ in range(before)]
            endpoint = await serve_metrics(database, "127.0.0.1", 0, app.tasks.values())
            port = endpoint.sockets[0].getsockname()[1]
            target = f"http://127.0.0.1:{port}/metrics"
            try:
                async with httpx.AsyncClient(timeout=120) as client:
                    first = []
                    for index in range(4):
                        if index == 2:  # the runs' noted id becomes their point after the lag
                            await asyncio.sleep(FOLD_LAG.total_seconds() + 1)
                        start = time.perf_counter()
                        answer = await client.get(target)
                        first.append(round((time.perf_counter() - start) * 1000, 1))
                        assert answer.status_code == 200
                    times = []
                    for _ in range(scrapes):
                        start = time.perf_counter()
                        answer = await client.get(target)
                        times.append((time.perf_counter() - start) * 1000)
                        assert answer.status_code == 200
                    agrees = await _agrees(database, answer.text)
            finally:
                endpoint.close()
                await endpoint.wait_closed()
            new_rounds = [await _new_statements(database) for _ in range(max(before, 5))]
        finally:
            await database.dispose()
    old_totals = [sum(r.values()) for r in old_rounds]
    return {
        **seeded,
        "seed_seconds": seed_seconds,
        "before (old statements, in process)": _summary(old_totals),
        "before, per statement (median ms)": _per_statement(old_rounds),
        "first four scrapes after the upgrade (ms)": first,
        "after (GET /metrics over HTTP)": _summary(times),
        "after, per statement (median ms)": _per_statement(new_rounds),
        "counters equal a count from scratch": agrees,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.metrics_scrape", description=__doc__)
    p.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    p.add_argument("--jobs", type=int, default=1_030_000)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--scrapes", type=int, default=50)
    p.add_argument("--before", type=int, default=5)
    args = p.parse_args(argv)
    started = datetime.now(UTC)
    result = asyncio.run(
        measure(
            args.server,
            jobs=args.jobs,
            runs=args.runs,
            scrapes=args.scrapes,
            before=args.before,
        )
    )
    out = asyncio.run(write_check("metrics-scrape", started, args.server, result))
    print(
        f"{result['finished_jobs']:,} finished jobs, {result['open_jobs']:,} open, "
        f"{result['runs']:,} runs (seeded in {result['seed_seconds']} s)"
    )
    for name in ("before (old statements, in process)", "after (GET /metrics over HTTP)"):
        figures = result[name]
        print(
            f"{name:<40} median {figures['median_ms']:>8.1f} ms  p95 {figures['p95_ms']:>8.1f} ms"
            f"  ({figures['min_ms']}..{figures['max_ms']}, n={figures['n']})"
        )
    print(
        "first four scrapes after the upgrade:", result["first four scrapes after the upgrade (ms)"]
    )
    print("before, per statement:", result["before, per statement (median ms)"])
    print("after, per statement: ", result["after, per statement (median ms)"])
    print("counters equal a count from scratch:", result["counters equal a count from scratch"])
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
