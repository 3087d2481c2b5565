"""The dashboard's page loads with 1,000,000 jobs and 100,000 runs (issue 15's target: the
overview under 200 ms).

    python -m benchmarks.dashboard_overview [--server URL] [--jobs 1000000] [--runs 100000]
        [--requests 30]

A scratch database gets cronlock's schema, ``--jobs`` jobs in three queues created over the
last 30 days (97% completed, 1% failed, 0.5% each cancelled, retrying later, pending and due;
about a thousand finished in the last quarter of an hour) and ``--runs`` runs of two tasks (a
minutely one, ``every-minute``, with some partial, failed, skipped and missed slots, and an
hourly one), then VACUUM ANALYZE, as autovacuum would have done on a table of that age.
``cronlock serve`` runs on it (with this module's ``app``), and each page is fetched
``--requests`` times over HTTP after two warm-up loads, the pages taking turns: the overview,
the jobs list (no filter; failed only; one queue's pending), a job's page, and a task's page
(its slot picture of two days and its latest runs). Beside them, in the same rounds, what
``cronlock status --json`` reads (``App.status``), the whole-table way the overview does not
read. The JSON result goes under ``benchmarks/results/`` (``dashboard-overview-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

import cronlock

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database, with_schema

__all__ = ["app", "main", "measure", "print_figures", "summary"]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"

# Benchmark data, not cronlock's SQL. Jobs: g = 1..N, created over the last 30 days, oldest
# first; the last ~1,000 finished within the last 15 minutes.
SEED_JOBS = """
INSERT INTO cronlock.jobs (job_type, payload, status, queue, created_at, run_at, started_at,
                           completed_at, retry_count, error_message, error_history, result)
SELECT (ARRAY['send_email', 'generate_report', 'process_payment'])[1 + g % 3],
       jsonb_build_object('n', g),
       s.status,
       (ARRAY['default', 'emails', 'reports'])[1 + g % 3],
       t, CASE s.status WHEN 'retrying' THEN now() + interval '1 hour' ELSE t END,
       CASE WHEN s.status IN ('completed', 'failed') THEN t END,
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled')
            THEN t + interval '40 milliseconds' END,
       CASE WHEN s.status IN ('failed', 'retrying') THEN 1 ELSE 0 END,
       CASE WHEN s.status IN ('failed', 'retrying') THEN 'ConnectionError: refused' END,
       CASE WHEN s.status IN ('failed', 'retrying')
            THEN '[{"attempt": 1, "error": "ConnectionError: refused"}]'::jsonb
            ELSE '[]'::jsonb END,
       CASE WHEN s.status = 'completed' THEN '{"ok": true}'::jsonb END
FROM generate_series(1, $1::integer) AS g,
     LATERAL (SELECT now() - ($1::integer - g) * (interval '30 days' / $1::integer) AS t) AS c,
     LATERAL (SELECT CASE WHEN g % 200 = 1 THEN 'failed' WHEN g % 200 = 2 THEN 'failed'
                          WHEN g % 200 = 3 THEN 'cancelled' WHEN g % 200 = 4 THEN 'retrying'
                          WHEN g % 200 = 5 THEN 'pending' ELSE 'completed' END AS status) AS s
"""
# Runs: every-minute's last N minutes (one row a slot, a skip beside every 50th), and one
# hourly-report run an hour.
SEED_RUNS = """
INSERT INTO cronlock.runs (task, slot, status, started_at, finished_at, items_ok, items_failed,
                           failures, error, skip_reason, trigger, lateness_ms)
SELECT 'every-minute', slot, status, slot + interval '800 milliseconds',
       CASE WHEN status <> 'missed' THEN slot + interval '1200 milliseconds' END,
       CASE status WHEN 'completed' THEN 10 WHEN 'partial' THEN 9 ELSE 0 END,
       CASE status WHEN 'partial' THEN 1 ELSE 0 END,
       CASE status WHEN 'partial'
            THEN '[{"item": 17, "error_type": "ValueError", "message": "bad row"}]'::jsonb
            ELSE '[]'::jsonb END,
       CASE status WHEN 'failed' THEN 'RuntimeError: upstream down' END,
       NULL, 'scheduler', 800
FROM (SELECT date_trunc('minute', now()) - g * interval '1 minute' AS slot,
             CASE WHEN g % 97 = 0 THEN 'failed' WHEN g % 89 = 0 THEN 'missed'
                  WHEN g % 13 = 0 THEN 'partial' ELSE 'completed' END AS status
      FROM generate_series(1, $1::integer) AS g) AS s
UNION ALL
SELECT 'every-minute', date_trunc('minute', now()) - g * interval '1 minute', 'skipped',
       date_trunc('minute', now()) - g * interval '1 minute' + interval '900 milliseconds',
       NULL, 0, 0, '[]'::jsonb, NULL, 'lock_busy', 'cron', 900
FROM generate_series(50, $1::integer, 50) AS g
UNION ALL
SELECT 'hourly-report', date_trunc('hour', now()) - g * interval '1 hour', 'completed',
       date_trunc('hour', now()) - g * interval '1 hour' + interval '2 seconds',
       date_trunc('hour', now()) - g * interval '1 hour' + interval '9 seconds',
       1, 0, '[]'::jsonb, NULL, NULL, 'scheduler', 2000
FROM generate_series(1, $2::integer) AS g
"""
COUNT = "SELECT (SELECT count(*) FROM cronlock.jobs), (SELECT count(*) FROM cronlock.runs)"
A_FAILED_JOB = "SELECT id FROM cronlock.jobs WHERE status = 'failed' LIMIT 1"

app = cronlock.App()


@app.periodic("every-minute", cron="* * * * *")
async def every_minute(run: cronlock.Run) -> None:
    """Seeded history only."""


@app.periodic("hourly-report", cron="0 * * * *", timezone="Europe/Madrid")
async def hourly_report(run: cronlock.Run) -> None:
    """Seeded history only."""


for _job_type, _queue in (
    ("send_email", "emails"),
    ("generate_report", "reports"),
    ("process_payment", "default"),
):
    app.declare_job(_job_type, queue=_queue)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def seed_tables(conn: asyncpg.Connection, jobs: int, runs: int) -> None:
    """cronlock's schema (migrated already) filled with ``jobs`` jobs and ``runs`` runs as the
    module docstring says, then VACUUM ANALYZE, as autovacuum would have done."""
    hourly = max(1, runs // 1000)
    minutely = runs - hourly
    while minutely + len(range(50, minutely + 1, 50)) > runs - hourly:
        minutely -= 1  # a skip beside every 50th minutely slot: N rows in all
    await conn.execute(SEED_JOBS, jobs)
    await conn.execute(SEED_RUNS, minutely, hourly)
    await conn.execute("VACUUM ANALYZE cronlock.jobs")
    await conn.execute("VACUUM ANALYZE cronlock.runs")


async def _seed(url: str, jobs: int, runs: int) -> tuple[int, int, str]:
    await with_schema(url)
    conn = await asyncpg.connect(url)
    try:
        await seed_tables(conn, jobs, runs)
        counts = await conn.fetchrow(COUNT)
        failed = await conn.fetchval(A_FAILED_JOB)
        assert counts is not None
        return int(counts[0]), int(counts[1]), str(failed)
    finally:
        await conn.close()


async def _status_ms(url: str, rounds: int) -> list[float]:
    """What `cronlock status --json` reads, timed in this process (App.status)."""
    app.use_database(url)
    try:
        await app.status()  # warm-up: connections
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            await app.status()
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        await app.aclose()


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)], 1),
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
        "n": len(ordered),
    }


async def measure(server: str, *, jobs: int, runs: int, requests: int) -> dict[str, Any]:
    async with scratch_database(server, "dashboard") as url:
        started = time.monotonic()
        job_count, run_count, failed = await _seed(url, jobs, runs)
        seeded_s = round(time.monotonic() - started, 1)
        port = _free_port()
        env = {
            **os.environ,
            "CRONLOCK_DATABASE_URL": url,
            "CRONLOCK_API_TOKEN": TOKEN,
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
            ),
        }
        command = [sys.executable, "-m", "cronlock", "--app", "benchmarks.dashboard_overview:app"]
        server_process = await asyncio.create_subprocess_exec(
            *command,
            "serve",
            "--port",
            str(port),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}/dashboard"
        pages = {
            "overview": "/",
            "jobs (no filter)": "/jobs",
            "jobs (failed)": "/jobs?status=failed",
            "jobs (one queue, pending)": "/jobs?queue=emails&status=pending",
            "a job": f"/jobs/{failed}",
            "a task (2 days of slots, latest runs)": "/tasks/every-minute",
        }
        times: dict[str, list[float]] = {name: [] for name in pages}
        try:
            async with httpx.AsyncClient(
                headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            ) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if (await client.get(f"{base}/login")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline or server_process.returncode is not None:
                        raise RuntimeError("cronlock serve did not start")
                    await asyncio.sleep(0.2)
                for path in pages.values():  # two warm-up loads of each page
                    for _ in range(2):
                        answer = await client.get(base + path)
                        assert answer.status_code == 200, (path, answer.status_code)
                for _ in range(requests):
                    for name, path in pages.items():
                        start = time.perf_counter()
                        answer = await client.get(base + path)
                        times[name].append((time.perf_counter() - start) * 1000)
                        assert answer.status_code == 200
        finally:
            server_process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(server_process.wait(), 20)
            except TimeoutError:
                server_process.kill()
                await server_process.wait()
        status_times = await _status_ms(url, min(requests, 10))
    return {
        "jobs": job_count,
        "runs": run_count,
        "seed_seconds": seeded_s,
        "requests_per_page": requests,
        "pages": {name: summary(found) for name, found in times.items()},
        "cronlock status (App.status, in process)": summary(status_times),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dashboard_overview", description=__doc__)
    p.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--requests", type=int, default=30)
    args = p.parse_args(argv)
    started = datetime.now(UTC)
    result = asyncio.run(
        measure(args.server, jobs=args.jobs, runs=args.runs, requests=args.requests)
    )
    out = asyncio.run(write_check("dashboard-overview", started, args.server, result))
    print_figures(
        result,
        {
            **result["pages"],
            "cronlock status (App.status)": result["cronlock status (App.status, in process)"],
        },
    )
    print(f"written to {out.relative_to(ROOT)}")
    return 0


def print_figures(result: dict[str, Any], figures: dict[str, dict[str, float]]) -> None:
    """The seed's size, then a line per read: median, p95, range and count."""
    print(
        f"{result['jobs']:,} jobs, {result['runs']:,} runs (seeded in {result['seed_seconds']} s)"
    )
    width = max(len(name) for name in figures)
    for name, each in figures.items():
        median, p95 = each["median_ms"], each["p95_ms"]
        print(
            f"{name:<{width}}  median {median:>7.1f} ms  p95 {p95:>7.1f} ms"
            f"  ({each['min_ms']}..{each['max_ms']}, n={each['n']})"
        )


if __name__ == "__main__":
    sys.exit(main())
