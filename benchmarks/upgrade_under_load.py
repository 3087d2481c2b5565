"""Upgrading from the first schema to head under load (issue 27, measured): the longest wait of
any enqueue or completion while ``cronlock migrate`` runs, and the upgrade's own time, for this
code's migrations and for the previous code's (the tree at ``--previous``, from git), with and
without a long strict-mode transaction on ``jobs`` when the upgrade starts.

    python -m benchmarks.upgrade_under_load [--server URL] [--jobs 1000000] [--runs 100000]
        [--producers 4] [--rate 50] [--hold 300] [--previous 290b0b0] [--variant current:0 ...]

Per variant, a scratch database is migrated to 0001 (the same for both), seeded with
``--jobs`` jobs (99% completed, the rest pending) and ``--runs`` runs, and VACUUM ANALYZEd.
``--producers`` connections then enqueue ``--rate`` jobs a second each, and one connection
completes them as a worker would (``UPDATE … WHERE id = (… FOR UPDATE SKIP LOCKED)``), every
statement timed; the statements work against every revision, so the load runs through the whole
upgrade. ``cronlock migrate`` runs as a command (this tree's, or the previous tree's on its
PYTHONPATH). With ``--hold S`` a connection holds a job row FOR UPDATE in an open transaction
from before the upgrade starts until S seconds later, as a strict-mode job does; this code's
migrate then retries (``--retry-for`` is raised above S) and says so.

The JSON result goes under ``benchmarks/results/`` (``upgrade-under-load-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.scratch import scratch_database
from cronlock import schema
from cronlock.database import Database

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# Benchmark-only statements, valid against every revision from 0001 on.
_SEED = """
INSERT INTO cronlock.jobs (job_type, payload, status, created_at, completed_at)
SELECT 'seed', jsonb_build_object('n', g),
       CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'completed' END,
       now() - g * interval '1 second',
       CASE WHEN g % 100 = 0 THEN NULL ELSE now() - g * interval '1 second' END
FROM generate_series(1, $1) g"""
_SEED_RUNS = """
INSERT INTO cronlock.runs (task, status, started_at, finished_at)
SELECT 'seed', 'completed', now() - g * interval '1 minute', now() - g * interval '1 minute'
FROM generate_series(1, $1) g"""
_ENQUEUE = "INSERT INTO cronlock.jobs (job_type, payload) VALUES ('load', '{}') RETURNING id"
_COMPLETE = """
UPDATE cronlock.jobs SET status = 'completed', completed_at = now()
WHERE id = (SELECT id FROM cronlock.jobs WHERE id = $1 FOR UPDATE SKIP LOCKED)"""
_HOLD = "SELECT id FROM cronlock.jobs WHERE status = 'pending' LIMIT 1 FOR UPDATE"


class Load:
    """Producers at a steady rate and one completer, each statement's latency kept with the
    moment it started."""

    def __init__(self, url: str, producers: int, rate: float) -> None:
        self.url, self.producers, self.rate = url, producers, rate
        self.samples: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.ids: asyncio.Queue[Any] = asyncio.Queue()
        self.stop = asyncio.Event()

    async def _timed(self, conn: asyncpg.Connection, statement: str, *args: Any) -> Any:
        started = time.monotonic()
        try:
            return await conn.fetchval(statement, *args)
        except asyncpg.PostgresError as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return None
        finally:
            self.samples.append((started, time.monotonic() - started))

    async def _produce(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self.stop.is_set():
                job = await self._timed(conn, _ENQUEUE)
                if job is not None:
                    self.ids.put_nowait(job)
                await asyncio.sleep(1 / self.rate)  # the steady rate
        finally:
            await conn.close()

    async def _complete(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self.stop.is_set():
                try:
                    job = await asyncio.wait_for(self.ids.get(), 0.2)
                except TimeoutError:
                    continue
                await self._timed(conn, _COMPLETE, job)
        finally:
            await conn.close()

    def start(self) -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(self._produce()) for _ in range(self.producers)]
        return [*tasks, asyncio.create_task(self._complete())]

    def during(self, start: float, end: float) -> list[float]:
        return sorted(
            latency for at, latency in self.samples if start <= at + latency and at <= end
        )


def _previous_tree(commit: str, into: Path) -> Path:
    tree = into / "previous"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


async def _variant(args: argparse.Namespace, code: Path, name: str, hold: float) -> dict[str, Any]:
    async with scratch_database(args.server, "upgrade") as url:
        database = Database(url)
        try:
            await schema.upgrade(database, "0001")
        finally:
            await database.dispose()
        admin = await asyncpg.connect(url)
        try:
            await admin.execute(_SEED, args.jobs)
            await admin.execute(_SEED_RUNS, args.runs)
            await admin.execute("VACUUM ANALYZE")
        finally:
            await admin.close()
        load = Load(url, args.producers, args.rate)
        tasks = load.start()
        holder = await asyncpg.connect(url) if hold else None
        try:
            await asyncio.sleep(2)  # the load at its rate before the upgrade
            if holder is not None:
                await holder.execute("BEGIN")
                await holder.fetchval(_HOLD)
            env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
            env["PYTHONPATH"] = str(code)
            command = [sys.executable, "-m", "cronlock", "--database-url", url, "migrate"]
            if name == "current":
                command += ["--retry-for", str(max(600.0, hold * 2))]
            started = time.monotonic()
            migrate = await asyncio.create_subprocess_exec(
                *command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            if holder is not None:
                await asyncio.sleep(hold)
                await holder.execute("ROLLBACK")
            out, err = await migrate.communicate()
            ended = time.monotonic()
            await asyncio.sleep(1)
        finally:
            load.stop.set()
            await asyncio.gather(*tasks)
            if holder is not None:
                await holder.close()
    waits = load.during(started, ended)
    lines = err.decode().splitlines()
    return {
        "code": name,
        "hold_s": hold,
        "migrate_exit": migrate.returncode,
        "upgrade_s": round(ended - started, 3),
        "statements_during": len(waits),
        "longest_wait_s": round(waits[-1], 3) if waits else None,
        "p99_s": round(waits[int(len(waits) * 0.99) - 1], 4) if len(waits) > 100 else None,
        "retries_logged": sum("retry" in line for line in lines),
        "last_lines": lines[-2:] + out.decode().splitlines()[-1:],
        "load_errors": load.errors[:3],
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        previous = _previous_tree(args.previous, Path(scratch))
        trees = {"current": ROOT, "previous": previous}
        variants = args.variant or [
            f"{name}:{hold:g}" for hold in sorted({0.0, args.hold}) for name in trees
        ]
        for variant in variants:
            name, _, hold = variant.partition(":")
            result = await _variant(args, trees[name], name, float(hold or 0))
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server",
        default=os.environ.get(
            "CRONLOCK_BENCH_SERVER", "postgresql://root@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs a second per producer")
    parser.add_argument("--hold", type=float, default=300.0, help="seconds of the long transaction")
    parser.add_argument("--previous", default="290b0b0")
    parser.add_argument(
        "--variant",
        action="append",
        help="CODE:HOLD (current or previous, seconds held), repeatable; one run a configuration"
        " lets a shared machine's other work go between them (default: all four)",
    )
    args = parser.parse_args()
    results = asyncio.run(main(args))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"upgrade-under-load-{stamp}.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    run()
