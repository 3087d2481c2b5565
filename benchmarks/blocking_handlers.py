"""Plain ``def`` handlers that block (issue 24, "Measured"): the thread pool's parallelism, and
whether the event loop (heartbeats, lock and cancel checks, the other lanes) stays on time.

    python -m benchmarks.blocking_handlers SERVER_URL [--runs 3]

Each run is in a fresh scratch database (created, migrated, dropped afterwards), in process:

- ``sleep50``: jobs whose ``def`` handler ``time.sleep(0.05)``s, drained by one lane (40 jobs)
  and by eight lanes with their pool of eight threads (320 jobs); the rate is read from the
  database's timestamps (first ``started_at`` to last ``completed_at``), rounds interleaved.
- ``lateness``: eight lanes whose ``def`` handlers each block for 1 s (64 jobs, about 8 s),
  the heartbeat every 1 s. A probe task on the drainer's loop sleeps 100 ms at a time and
  records how late it wakes (anything the loop does waits as long); another connection polls
  the drainer's ``workers.heartbeat_at`` every 50 ms and records the longest gap between two
  beats beyond the interval.

The medians of the runs are printed as one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from typing import Any

import asyncpg

from benchmarks.scratch import scratch_database, with_schema
from cronlock import App

WINDOW = (
    "SELECT extract(epoch FROM max(completed_at) - min(started_at))::float8, count(*) "
    "FROM cronlock.jobs WHERE status = 'completed'"
)


def _app(seconds: float) -> App:
    app = App()

    @app.job("block")
    def block(_session: object, _payload: object) -> None:
        time.sleep(seconds)

    return app


async def _drained(url: str, seconds: float, jobs: int, lanes: int) -> float:
    """Jobs per second of ``jobs`` blocking ``def`` jobs on ``lanes`` lanes and threads."""
    app = _app(seconds)
    app.use_database(url)
    try:
        await app.enqueue_many("block", [{}] * jobs)
        result = await app.drain(concurrency=lanes, threads=lanes, max_seconds=120)
        assert result.stats["processed"] == jobs, result.to_dict()
    finally:
        await app.aclose()
    conn = await asyncpg.connect(url)
    try:
        span, count = await conn.fetchrow(WINDOW)
    finally:
        await conn.close()
    assert count == jobs
    return float(count / span)


async def _lateness(url: str) -> dict[str, float]:
    """The loop's longest late wake and the longest heartbeat gap beyond its interval (s)."""
    app = _app(1.0)
    app.use_database(url)
    late: list[float] = []
    beats: list[float] = []
    try:
        await app.enqueue_many("block", [{}] * 64)
        drain = asyncio.create_task(
            app.drain(concurrency=8, threads=8, heartbeat_interval=1.0, max_seconds=60)
        )

        async def probe() -> None:
            while not drain.done():
                asked = time.perf_counter()
                await asyncio.sleep(0.1)
                late.append(time.perf_counter() - asked - 0.1)

        async def heartbeats() -> None:
            conn = await asyncpg.connect(url)
            seen = None
            try:
                while not drain.done():
                    at = await conn.fetchval("SELECT max(heartbeat_at) FROM cronlock.workers")
                    if at is not None and at != seen:
                        beats.append(at.timestamp())
                        seen = at
                    await asyncio.sleep(0.05)
            finally:
                await conn.close()

        await asyncio.gather(probe(), heartbeats())
        result = await drain
        assert result.stats["processed"] == 64, result.to_dict()
    finally:
        await app.aclose()
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    return {
        "loop_late_max_s": max(late),
        # beyond the 1 s interval: how late the latest-written beat was
        "heartbeat_late_max_s": max(gaps) - 1.0 if gaps else float("nan"),
        "heartbeats": float(len(beats)),
    }


async def main(server: str, runs: int) -> None:
    figures: dict[str, list[float]] = {}
    for round_ in range(runs):
        for case, (jobs, lanes) in {
            "sleep50_1_lane": (40, 1),
            "sleep50_8_threads": (320, 8),
        }.items():
            async with scratch_database(server) as url:
                await with_schema(url)
                rate = await _drained(url, 0.05, jobs, lanes)
            figures.setdefault(case, []).append(rate)
            print(f"# round {round_} {case}: {rate:.1f} jobs/s", flush=True)
        async with scratch_database(server) as url:
            await with_schema(url)
            found = await _lateness(url)
        for name, value in found.items():
            figures.setdefault(name, []).append(value)
        print(f"# round {round_} lateness: {found}", flush=True)
    medians: dict[str, Any] = {name: statistics.median(v) for name, v in figures.items()}
    medians["speedup_8_threads"] = medians["sleep50_8_threads"] / medians["sleep50_1_lane"]
    print(json.dumps(medians))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.server, options.runs))
