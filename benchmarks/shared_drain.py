"""Shared queues: do two active workers drain CPU-bound jobs faster than one?

    python -m benchmarks.shared_drain [--server URL] [--jobs 3000] [--burn-ms 2] [--rounds 5]
        [--modes strict,batch]

Each job's handler burns ``--burn-ms`` of CPU (a busy loop on the thread's CPU clock, so a
handler that waits for a core still burns its full share). Per round and commit mode, three
cases run in turn (interleaved, so a noisy neighbour hits every case alike), each on a scratch
database of its own: one exclusive ``cronlock worker`` (the default), one ``cronlock worker
--shared``, and two ``cronlock worker --shared`` processes. The workers are started and seen
active (the workers table) on an empty queue; then ``--jobs`` jobs are enqueued in one
statement, and the rate is ``jobs / (last completed_at - first started_at)``, both read from the
jobs table once every job is completed. The medians over the rounds are printed, with the
speed-up of two shared workers over one, and the JSON result goes under
``benchmarks/results/`` (``shared-drain-<time>``).

The module is also the workers' app (``--app benchmarks.shared_drain``): one job type, ``burn``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

import cronlock
from cronlock import schema
from cronlock.database import Database

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database

__all__ = ["app", "main", "measure"]

ROOT = Path(__file__).resolve().parent.parent
BURN_SECONDS = float(os.environ.get("SHARED_BENCH_BURN_MS", "2")) / 1000

app = cronlock.App()


@app.job("burn", max_retries=0)
async def burn(session: AsyncSession, payload: Any) -> None:
    """Burn BURN_SECONDS of this thread's CPU time; touches no table."""
    end = time.thread_time() + BURN_SECONDS
    while time.thread_time() < end:
        pass


CASES = (("exclusive", 1), ("shared", 1), ("shared", 2))


async def _poll(conn: asyncpg.Connection, query: str, want: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (got := await conn.fetchval(query)) != want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {query!r}: {got} (want {want})")
        await asyncio.sleep(0.05)


async def _case(
    server: str, kind: str, workers: int, mode: str, jobs: int, burn_ms: float
) -> dict[str, Any]:
    async with scratch_database(server, "shared_bench") as url:
        database = Database(url)
        await schema.upgrade(database)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")},
            "CRONLOCK_DATABASE_URL": url,
            "SHARED_BENCH_BURN_MS": str(burn_ms),
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
            ),
        }
        args = [sys.executable, "-m", "cronlock", "--app", "benchmarks.shared_drain", "worker"]
        args += ["--commit-mode", mode, "--poll-interval", "0.5"]
        if kind == "shared":
            args.append("--shared")
        children = [
            await asyncio.create_subprocess_exec(
                *args,
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            for _ in range(workers)
        ]
        conn = await asyncpg.connect(url)
        try:
            await _poll(
                conn,
                "SELECT count(*) FROM cronlock.workers WHERE state = 'active'",
                workers,
                60,
            )
            app.use_database(url)
            async with app.database.session() as session:
                await app.enqueue_many_tx(session, "burn", [{"n": i} for i in range(jobs)])
                await session.commit()
            await _poll(
                conn,
                "SELECT count(*) FROM cronlock.jobs WHERE status = 'completed'",
                jobs,
                600,
            )
            first, last = await conn.fetchrow(
                "SELECT min(started_at), max(completed_at) FROM cronlock.jobs"
            )
        finally:
            await conn.close()
            await app.aclose()
            await database.dispose()
            for child in children:
                if child.returncode is None:
                    child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    await asyncio.wait_for(child.wait(), 30)
                except TimeoutError:
                    child.kill()
                    await child.wait()
    seconds = (last - first).total_seconds()
    return {"seconds": round(seconds, 3), "jobs_per_s": round(jobs / seconds, 1)}


async def measure(
    server: str, jobs: int, burn_ms: float, rounds: int, modes: list[str]
) -> dict[str, Any]:
    runs: dict[str, list[float]] = {}
    for round_ in range(1, rounds + 1):
        for mode in modes:
            for kind, workers in CASES:
                name = f"{mode} {kind} x{workers}"
                result = await _case(server, kind, workers, mode, jobs, burn_ms)
                runs.setdefault(name, []).append(result["jobs_per_s"])
                print(f"round {round_} {name:22} {result['jobs_per_s']:8,.1f} jobs/s", flush=True)
    medians = {name: statistics.median(rates) for name, rates in runs.items()}
    speedups = {
        mode: round(medians[f"{mode} shared x2"] / medians[f"{mode} shared x1"], 3)
        for mode in modes
    }
    return {"runs": runs, "medians": medians, "speedup_two_over_one": speedups}


def _report(results: dict[str, Any]) -> str:
    lines = [f"{'case':22} {'median jobs/s':>14}  runs"]
    for name, rates in results["runs"].items():
        shown = ", ".join(f"{r:,.0f}" for r in rates)
        lines.append(f"{name:22} {results['medians'][name]:14,.1f}  {shown}")
    for mode, ratio in results["speedup_two_over_one"].items():
        lines.append(f"{mode}: two shared workers / one = {ratio:.2f}x")
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    modes = args.modes.split(",")
    results = await measure(args.server, args.jobs, args.burn_ms, args.rounds, modes)
    print(_report(results))
    fields = {
        "jobs": args.jobs,
        "burn_ms": args.burn_ms,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        **results,
    }
    out = await write_check("shared-drain", started, args.server, fields)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--burn-ms", type=float, default=2.0, help="CPU each job burns")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="strict,batch")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
