"""The operator's reads at 1,000,000 jobs and 100,000 runs (issue 23, item 5: at most 50 ms
each): ``cronlock status``, ``cronlock queue list`` and ``GET /jobs``, its first page and a
page 100 deep.

    python -m benchmarks.bounded_reads [--server URL] [--jobs 1000000] [--runs 100000]
        [--rounds 30]

A scratch database gets cronlock's schema and the dashboard benchmark's seed
(``benchmarks/dashboard_overview.py``: jobs in three queues over 30 days, 97% completed, and
runs of a minutely and an hourly task), then VACUUM ANALYZE, as autovacuum would have done.
Then, in this process, after two warm-up rounds, ``--rounds`` rounds of each read, the reads
taking turns: ``App.status()`` (what ``cronlock status --json`` prints), ``App.queues()``
(``queue list``), and over the HTTP API (``create_api``, through httpx's ASGI transport, so
the route, its validation and its JSON are in the figure): ``GET /jobs`` (no filter, 50 a
page), ``GET /jobs`` 100 pages deep (the cursor of the 99th page, followed once before the
rounds), ``GET /jobs?status=failed`` and ``GET /jobs?queue=emails&status=pending``. The
statements are the code's, so ``PYTHONPATH=/other/tree`` measures another tree (the same
script, copied beside that tree: ``python -m`` puts the current directory first).
The JSON result goes under ``benchmarks/results/`` (``bounded-reads-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from cronlock.http import create_api

from .dashboard_overview import app, print_figures, seed_tables, summary
from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database, with_schema

__all__ = ["main", "measure"]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
DEEP = 100  # the page GET /jobs is timed at, besides the first
COUNT = "SELECT (SELECT count(*) FROM cronlock.jobs), (SELECT count(*) FROM cronlock.runs)"


async def _seed(url: str, jobs: int, runs: int) -> tuple[int, int]:
    await with_schema(url)
    conn = await asyncpg.connect(url)
    try:
        await seed_tables(conn, jobs, runs)
        counts = await conn.fetchrow(COUNT)
        assert counts is not None
        return int(counts[0]), int(counts[1])
    finally:
        await conn.close()


async def _deep_cursor(client: httpx.AsyncClient, pages: int) -> str:
    """The cursor of page ``pages`` of GET /jobs: the next request reads page ``pages + 1``."""
    cursor: str | None = None
    for _ in range(pages):
        answer = await client.get("/jobs", params={} if cursor is None else {"cursor": cursor})
        assert answer.status_code == 200, answer.text
        value = answer.json()["next_cursor"]
        assert isinstance(value, str), value
        cursor = value
    assert cursor is not None
    return cursor


async def measure(server: str, *, jobs: int, runs: int, rounds: int) -> dict[str, Any]:
    async with scratch_database(server, "bounded") as url:
        started = time.monotonic()
        job_count, run_count = await _seed(url, jobs, runs)
        seeded_s = round(time.monotonic() - started, 1)
        app.use_database(url)
        api = create_api(app, token=TOKEN)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=api),
                base_url="http://bench",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=60,
            ) as client:
                deep = await _deep_cursor(client, DEEP - 1)

                async def get(path: str, **params: str) -> None:
                    answer = await client.get(path, params=params)
                    assert answer.status_code == 200, (path, answer.status_code, answer.text)

                reads: dict[str, Callable[[], Awaitable[Any]]] = {
                    "cronlock status (App.status)": app.status,
                    "cronlock queue list (App.queues)": app.queues,
                    "GET /jobs (first page)": lambda: get("/jobs"),
                    f"GET /jobs (page {DEEP})": lambda: get("/jobs", cursor=deep),
                    "GET /jobs?status=failed": lambda: get("/jobs", status="failed"),
                    "GET /jobs?queue=emails&status=pending": lambda: get(
                        "/jobs", queue="emails", status="pending"
                    ),
                }
                times: dict[str, list[float]] = {name: [] for name in reads}
                for _ in range(2):  # warm-up: connections, plans, caches
                    for read in reads.values():
                        await read()
                for _ in range(rounds):
                    for name, read in reads.items():
                        start = time.perf_counter()
                        await read()
                        times[name].append((time.perf_counter() - start) * 1000)
        finally:
            await app.aclose()
    return {
        "jobs": job_count,
        "runs": run_count,
        "seed_seconds": seeded_s,
        "rounds": rounds,
        "reads": {name: summary(found) for name, found in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bounded_reads", description=__doc__)
    p.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args(argv)
    started = datetime.now(UTC)
    result = asyncio.run(measure(args.server, jobs=args.jobs, runs=args.runs, rounds=args.rounds))
    out = asyncio.run(write_check("bounded-reads", started, args.server, result))
    print_figures(result, result["reads"])
    print(f"written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
