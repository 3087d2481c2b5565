"""Retention under load: does pruning 1,000,000 completed jobs stall a drain that runs meanwhile?

    python -m benchmarks.prune_drain [--server URL] [--rows 1000000] [--mode strict|batch]
        [--jobs 120000] [--baseline 8] [--after 4]

A scratch database gets cronlock's schema, ``--rows`` completed jobs finished eight days ago
(older than the default 7-day retention, so all of them go) and ``--jobs`` due no-op jobs. A
drainer (``worker``, in this process) drains them; after ``--baseline`` seconds ``cronlock
prune`` runs in a process of its own (its default batches of 1,000 rows, one transaction each),
and the drain goes on ``--after`` seconds past the prune's end. The drain's throughput and the
gaps between consecutive completions (``completed_at``, the database's clock) are compared
before and during the prune: a stall would show as a gap far above the baseline's, a slowdown
as a lower rate. The JSON result goes under ``benchmarks/results/`` (``prune-drain-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

import cronlock

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database, with_schema

__all__ = ["main", "measure"]

ROOT = Path(__file__).resolve().parent.parent

# Benchmark data, not cronlock's SQL: completed jobs finished eight days ago, and due jobs.
SEED_COMPLETED = """
INSERT INTO cronlock.jobs
    (job_type, payload, status, run_at, created_at, started_at, completed_at, result)
SELECT 'noop', '{}', 'completed', t, t, t, t + interval '1 millisecond', 'null'
FROM (SELECT now() - interval '8 days' - i * interval '1 millisecond' AS t
      FROM generate_series(1, $1::integer) AS i) AS s
"""
SEED_DUE = """
INSERT INTO cronlock.jobs (job_type, payload) SELECT 'noop', '{}' FROM generate_series(1, $1)
"""
VACUUM = "VACUUM ANALYZE cronlock.jobs"
# The drained jobs' completion times, in order (epoch seconds, the server's clock).
COMPLETIONS = """
SELECT extract(epoch FROM completed_at) FROM cronlock.jobs
WHERE status = 'completed' AND completed_at > now() - interval '1 day' ORDER BY completed_at
"""
LEFT = "SELECT count(*) FROM cronlock.jobs WHERE completed_at < now() - interval '7 days'"


def _app() -> cronlock.App:
    app = cronlock.App()

    @app.job("noop")
    async def noop(session: Any, payload: Any) -> None:
        return None

    return app


def _window(times: list[float], start: float, end: float) -> dict[str, Any]:
    inside = [t for t in times if start <= t < end]
    gaps = [b - a for a, b in itertools.pairwise(inside)]
    seconds = end - start
    return {
        "seconds": round(seconds, 3),
        "completed": len(inside),
        "jobs_per_s": round(len(inside) / seconds, 1) if seconds > 0 else None,
        "max_gap_ms": round(max(gaps) * 1000, 2) if gaps else None,
        "p99_gap_ms": round(statistics.quantiles(gaps, n=100)[98] * 1000, 3)
        if len(gaps) >= 100
        else None,
        "median_gap_ms": round(statistics.median(gaps) * 1000, 3) if gaps else None,
    }


async def measure(
    server: str, rows: int, jobs: int, mode: str, baseline: float, after: float
) -> dict[str, Any]:
    async with scratch_database(server, "prune_drain") as url:
        await with_schema(url)
        conn = await asyncpg.connect(url)
        try:
            started = time.perf_counter()
            await conn.execute(SEED_COMPLETED, rows)
            await conn.execute(SEED_DUE, jobs)
            await conn.execute(VACUUM)
            seeded_s = time.perf_counter() - started
        finally:
            await conn.close()

        app = _app()
        app.use_database(url)
        drainer = app.drainer(commit_mode=mode, batch_size=50)
        working = asyncio.create_task(drainer.work())
        try:
            await asyncio.sleep(baseline)
            prune_start = time.time()
            # `cronlock prune` in a process of its own, as crontab or the scheduler runs it.
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "cronlock", "--app", "tasks", "prune", "--json"],
                env={**os.environ, "CRONLOCK_DATABASE_URL": url, "PYTHONPATH": str(ROOT)},
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            prune_end = time.time()
            if done.returncode != 0:
                raise RuntimeError(f"cronlock prune failed: {done.stderr}")
            await asyncio.sleep(after)
        finally:
            drainer.stop()
            result = await working
        conn = await asyncpg.connect(url)
        try:
            times = [float(row[0]) for row in await conn.fetch(COMPLETIONS)]
            left = await conn.fetchval(LEFT)
        finally:
            await conn.close()
        await app.aclose()
    if not times or times[-1] < prune_end:
        raise RuntimeError("the drain ran out of jobs before the prune ended: raise --jobs")
    first = times[0]
    prune = json.loads(done.stdout)
    # The prune's own time, without its process's start (imports, connecting).
    pruning = prune_end - float(prune["duration_s"])
    return {
        "mode": mode,
        "seed_s": round(seeded_s, 1),
        "prune": prune,
        "prune_process_s": round(prune_end - prune_start, 3),
        "old_rows_left": left,
        "before": _window(times, first, pruning),
        "during": _window(times, pruning, prune_end),
        "after": _window(times, prune_end, times[-1]),
        "drain": result.to_dict(),
    }


def _report(results: dict[str, Any]) -> str:
    prune = results["prune"]
    lines = [
        f"prune: {prune['completed_jobs']:,} completed jobs removed in {prune['batches']} "
        f"batches in {prune['duration_s']} s ({results['prune_process_s']} s with its process' "
        f"start; {results['old_rows_left']} old rows left)",
        f"{'window':8} {'s':>7} {'jobs':>8} {'jobs/s':>9} {'median gap':>11} {'p99 gap':>9} "
        f"{'max gap':>9}",
    ]
    for name in ("before", "during", "after"):
        w = results[name]
        lines.append(
            f"{name:8} {w['seconds']:7.1f} {w['completed']:8,} {w['jobs_per_s']:9,.0f} "
            f"{w['median_gap_ms']:9.3f}ms {w['p99_gap_ms']:7.3f}ms {w['max_gap_ms']:7.2f}ms"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    results = await measure(args.server, args.rows, args.jobs, args.mode, args.baseline, args.after)
    print(_report(results))
    fields = {"rows": args.rows, "jobs": args.jobs, **results}
    out = await write_check(f"prune-drain-{args.mode}", started, args.server, fields)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--rows", type=int, default=1_000_000, help="completed rows to prune")
    parser.add_argument("--jobs", type=int, default=120_000, help="due jobs for the drain")
    parser.add_argument("--mode", choices=["strict", "batch"], default="strict")
    parser.add_argument("--baseline", type=float, default=8.0, help="seconds before the prune")
    parser.add_argument("--after", type=float, default=4.0, help="seconds after it")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
