"""How soon ``app.wait`` returns after the job's completion commits (issue 25, "Measured").

    python -m benchmarks.wait_latency SERVER_URL [--rate 50] [--seconds 20]

In a fresh scratch database, a real ``cronlock worker`` (strict mode, one lane) runs no-op
jobs while this process enqueues ``--rate`` jobs a second for ``--seconds`` and waits for each
(``app.wait``, one task per job, all on one LISTEN connection), once a first job has gone
through (the worker is up, the pool and the LISTEN connection open). A wait's latency is the moment
it returned (this host's clock) minus the job's ``completed_at`` (the database's
``clock_timestamp()`` in the completing transaction, just before its commit; the same host's
clock). Prints the median, p95 and max in milliseconds as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import asyncpg

from benchmarks.scratch import scratch_database, with_schema
from cronlock import App

ROOT = Path(__file__).resolve().parent.parent


def _app() -> App:
    app = App()

    @app.job("noop")
    async def noop(_session: object, _payload: object) -> None:
        return None

    return app


async def measure(url: str, rate: float, seconds: float) -> dict[str, float]:
    worker = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cronlock", "--app", "testapps.jobs", "worker"),
        cwd=ROOT,
        env={
            **os.environ,
            "CRONLOCK_DATABASE_URL": url,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'support'}",
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    app = _app()
    app.use_database(url)
    returned: dict[uuid.UUID, float] = {}

    async def one() -> None:
        job = await app.enqueue("noop", {})
        await app.wait(job.id, timeout=60)
        returned[job.id] = time.time()

    try:
        # The worker ready, and this process's pool and LISTEN connection open, before the
        # measured waits: jobs enqueued while the worker starts would end in one burst when it
        # is up, a start-up's figure, not a steady 50 jobs/s one.
        warm_up = await app.enqueue("noop", {})
        await app.wait(warm_up.id, timeout=60)
        waits = []
        started = time.monotonic()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            waits.append(asyncio.create_task(one()))
        await asyncio.gather(*waits)
    finally:
        worker.terminate()
        await asyncio.wait_for(worker.wait(), 30)
        await app.aclose()
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT id, extract(epoch FROM completed_at)::float8 AS at FROM cronlock.jobs"
        )
    finally:
        await conn.close()
    late = sorted(
        (returned[job_id] - r["at"]) * 1000
        for r in rows
        if (job_id := uuid.UUID(str(r["id"]))) in returned
    )
    return {
        "jobs": float(len(late)),
        "median_ms": statistics.median(late),
        "p95_ms": late[int(0.95 * (len(late) - 1))],
        "max_ms": late[-1],
    }


async def main(server: str, rate: float, seconds: float) -> None:
    async with scratch_database(server) as url:
        await with_schema(url)
        print(json.dumps(await measure(url, rate, seconds)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    options = parser.parse_args()
    asyncio.run(main(options.server, options.rate, options.seconds))
