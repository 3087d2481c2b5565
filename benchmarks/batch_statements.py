"""Where a batch drain's server time goes: the claim, the completion and the commit, timed one
by one for cronlock's statements and for the raw loop's (issue 26, item 1).

    python -m benchmarks.batch_statements [--server URL] [--n 10000] [--batch 50] [--rounds 2]
        [--analyze]

In a fresh scratch database each, ``--n`` jobs are enqueued in bulk (cronlock's schema, and the
raw baseline's one-table schema), then one asyncpg connection claims ``--batch`` of them
(``sql.JOB_CLAIM``, FOR UPDATE SKIP LOCKED), completes them (``sql.JOB_COMPLETE_MANY``) and
commits, until none is left: the batch mode's statements without its Python (no handler, no
outcome values). Prints per job the client-clock time of each of the three and the server
process's CPU time (from /proc: same host only). ``--analyze`` runs ANALYZE after the enqueue,
which the harness's drains never have (a burst of new jobs before autovacuum's ANALYZE): what
planning from lagging statistics costs a statement.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.scratch import scratch_database
from benchmarks.systems.cronlock_queue import CronlockQueue
from benchmarks.systems.raw import CLAIM as RAW_CLAIM
from benchmarks.systems.raw import COMPLETE_MANY as RAW_COMPLETE_MANY
from benchmarks.systems.raw import RawQueue

DEFAULT_SERVER = "postgresql://root@127.0.0.1:5432/postgres"
Step = Callable[[asyncpg.Connection], Awaitable[list[Any]]]


def _server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drain(
    conn: asyncpg.Connection, claim: Step, complete: Callable[..., Any]
) -> dict[str, float]:
    """Claim, complete and commit batches until none is left; per job figures (µs)."""
    pid = conn.get_server_pid()
    spent = {"claim": 0.0, "complete": 0.0, "commit": 0.0}
    cpu, done = _server_cpu(pid), 0
    while True:
        transaction = conn.transaction()
        await transaction.start()
        began = time.perf_counter()
        rows = await claim(conn)
        claimed = time.perf_counter()
        spent["claim"] += claimed - began
        if not rows:
            await transaction.rollback()
            break
        await complete(conn, rows)
        completed = time.perf_counter()
        spent["complete"] += completed - claimed
        await transaction.commit()
        spent["commit"] += time.perf_counter() - completed
        done += len(rows)
    server = _server_cpu(pid) - cpu
    return {**{k: v / done * 1e6 for k, v in spent.items()}, "server": server / done * 1e6}


async def cronlock_statements(url: str, n: int, batch: int, analyze: bool) -> dict[str, float]:
    from cronlock import sql
    from cronlock.pg import AsyncpgStatement

    system = CronlockQueue(url, {"commit_mode": "batch", "batch_size": batch})
    await system.install()
    await system.enqueue_bulk(n)
    await system.close()
    claim = AsyncpgStatement.of(sql.JOB_CLAIM, "cronlock")
    many = AsyncpgStatement.of(sql.JOB_COMPLETE_MANY, "cronlock")
    conn = await asyncpg.connect(url)
    try:
        if analyze:
            await conn.execute("ANALYZE cronlock.jobs")

        async def claimed(c: asyncpg.Connection) -> Any:
            return await c.fetch(claim.sql, *claim.args(queue="default", limit=batch, now=None))

        async def complete(c: asyncpg.Connection, rows: list[Any]) -> None:
            args = many.args(ids=[r[0] for r in rows], results=None, now=None)
            await c.execute(many.sql, *args)

        return await _drain(conn, claimed, complete)
    finally:
        await conn.close()


async def raw_statements(url: str, n: int, batch: int, analyze: bool) -> dict[str, float]:
    system = RawQueue(url, {"mode": "batch", "batch_size": batch})
    await system.install()
    await system.enqueue_bulk(n)
    await system.close()
    conn = await asyncpg.connect(url)
    try:
        if analyze:
            await conn.execute("ANALYZE bench_jobs")

        async def claimed(c: asyncpg.Connection) -> Any:
            return await c.fetch(RAW_CLAIM, batch)

        async def complete(c: asyncpg.Connection, rows: list[Any]) -> None:
            await c.execute(RAW_COMPLETE_MANY, [r[0] for r in rows], rows[0][2])

        return await _drain(conn, claimed, complete)
    finally:
        await conn.close()


async def main(server: str, n: int, batch: int, rounds: int, analyze: bool) -> None:
    for _ in range(rounds):
        for name, measure in (("raw", raw_statements), ("cronlock", cronlock_statements)):
            async with scratch_database(server, "batch_statements") as url:
                figures = await measure(url, n, batch, analyze)
            print(
                f"{name:9} per job: claim {figures['claim']:6.1f} us, complete "
                f"{figures['complete']:6.1f} us, commit {figures['commit']:6.1f} us; "
                f"server CPU {figures['server']:6.1f} us",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_statements")
    parser.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--analyze", action="store_true")
    options = parser.parse_args()
    asyncio.run(main(options.server, options.n, options.batch, options.rounds, options.analyze))
