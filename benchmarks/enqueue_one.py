"""Enqueueing one job at a time: cronlock's two paths beside pgqueuer, raw asyncpg and the floor.

    python -m benchmarks.enqueue_one [--server URL] [--n 1000] [--rounds 7]

One scratch database holds cronlock's schema, pgqueuer's and a one-column table. Every round
runs each way of writing one committed row ``--n`` times, back to back, in a fixed order, so
the ways are interleaved and share the machine's moods; each figure is the median over the
rounds with its min..max: jobs/s on the client's clock and the client process's CPU time per
job (``time.process_time``, less sensitive to other load than the wall clock).

- ``cronlock (caller's transaction)``: ``engine.begin()`` then ``App.enqueue_tx(conn, …)``:
  BEGIN, INSERT, COMMIT through SQLAlchemy (the harness's adapter before the fast path).
- ``cronlock (Database)``: ``App.enqueue(…)``, committed on its own: one INSERT
  on a pooled connection's asyncpg driver.
- ``raw asyncpg BEGIN/INSERT/COMMIT`` and ``raw asyncpg INSERT``: cronlock's own INSERT
  (compiled from ``sql.JOB_INSERT_MANY``) on one dedicated connection.
- ``raw asyncpg INSERT, no NOTIFY trigger``: the same on a copy of the schema whose
  ``jobs_notify`` trigger is dropped: what the trigger's NOTIFY costs at commit.
- ``pgqueuer``: ``Queries.enqueue`` on one dedicated connection (the harness's adapter).
- ``floor INSERT`` / ``floor BEGIN/INSERT/COMMIT``: a one-column row in an unindexed table:
  one fsync'd commit with nothing else, the bound every committed enqueue has here
  (``synchronous_commit=on``).

The JSON result is written under ``benchmarks/results/`` (``enqueue-one-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

import cronlock
from cronlock import schema, sql
from cronlock.database import Database
from cronlock.pg import AsyncpgStatement

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database
from .systems.pgqueuer_queue import PgQueuerQueue

__all__ = ["main", "measure"]

FLOOR_SQL = "CREATE TABLE bench_floor (x integer)"
FLOOR_INSERT = "INSERT INTO bench_floor VALUES (1)"
NO_TRIGGER_SCHEMA = "cronlock_no_notify"
DROP_TRIGGER = f"DROP TRIGGER jobs_notify ON {NO_TRIGGER_SCHEMA}.jobs"

Way = Callable[[], Awaitable[object]]


def _insert_args(statement: AsyncpgStatement) -> list[Any]:
    return statement.args(
        ids=[uuid.uuid4()],
        payloads=["{}"],
        dedup_keys=[None],
        concurrency_keys=[None],
        concurrency_limits=[None],
        timeout=None,
        job_type="noop",
        queue="default",
        priority=0,
        run_at=None,
        delay=timedelta(0),
        max_retries=3,
    )


async def measure(server: str, n: int, rounds: int, warmup: int = 50) -> dict[str, Any]:
    async with scratch_database(server, "enqueue_one") as url:
        app = cronlock.App()

        @app.job("noop")
        async def noop(_session: object, _payload: object) -> None:
            return None

        database = app.use_database(url)
        await schema.upgrade(database)
        quiet = Database(url, schema=NO_TRIGGER_SCHEMA)
        await schema.upgrade(quiet)
        await quiet.dispose()
        pgqueuer = PgQueuerQueue(url, {})
        await pgqueuer.install()
        own = await asyncpg.connect(url)
        await own.execute(FLOOR_SQL)
        await own.execute(DROP_TRIGGER)
        insert = AsyncpgStatement.of(sql.JOB_INSERT_MANY, database.schema)
        insert_quiet = AsyncpgStatement.of(sql.JOB_INSERT_MANY, NO_TRIGGER_SCHEMA)

        async def in_callers_transaction() -> object:
            async with database.engine.begin() as conn:
                return await app.enqueue_tx(conn, "noop", {})

        async def on_database() -> object:
            return await app.enqueue("noop", {})

        async def raw_transaction() -> object:
            async with own.transaction():
                return await own.fetch(insert.sql, *_insert_args(insert))

        async def raw_autocommit() -> object:
            return await own.fetch(insert.sql, *_insert_args(insert))

        async def raw_no_trigger() -> object:
            return await own.fetch(insert_quiet.sql, *_insert_args(insert_quiet))

        async def floor_transaction() -> object:
            async with own.transaction():
                return await own.execute(FLOOR_INSERT)

        async def floor_autocommit() -> object:
            return await own.execute(FLOOR_INSERT)

        ways: dict[str, Way] = {
            "cronlock (caller's transaction)": in_callers_transaction,
            "cronlock (Database)": on_database,
            "raw asyncpg BEGIN/INSERT/COMMIT": raw_transaction,
            "raw asyncpg INSERT": raw_autocommit,
            "raw asyncpg INSERT, no NOTIFY trigger": raw_no_trigger,
            "pgqueuer": pgqueuer.enqueue_one,
            "floor BEGIN/INSERT/COMMIT": floor_transaction,
            "floor INSERT": floor_autocommit,
        }
        try:
            for way in ways.values():
                for _ in range(warmup):
                    await way()
            rates: dict[str, list[float]] = {name: [] for name in ways}
            cpu_us: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(rounds):
                for name, way in ways.items():
                    started, cpu = time.perf_counter(), time.process_time()
                    for _ in range(n):
                        await way()
                    rates[name].append(n / (time.perf_counter() - started))
                    cpu_us[name].append((time.process_time() - cpu) / n * 1e6)
        finally:
            await own.close()
            await pgqueuer.close()
            await app.aclose()
    return {
        name: {"per_s": _spread(rates[name]), "client_cpu_us": _spread(cpu_us[name])}
        for name in ways
    }


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def _table(results: dict[str, Any]) -> str:
    lines = ["| way | jobs/s | client CPU µs/job |", "|---|---|---|"]
    for name, figures in results.items():
        rate, cpu = figures["per_s"], figures["client_cpu_us"]
        lines.append(
            f"| {name} | {rate['median']:,.0f} ({rate['min']:,.0f}..{rate['max']:,.0f}) "
            f"| {cpu['median']:,.0f} ({cpu['min']:,.0f}..{cpu['max']:,.0f}) |"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    results = await measure(args.server, args.n, args.rounds)
    print(_table(results))
    out = await write_check(
        "enqueue-one", started, args.server, {"n": args.n, "rounds": args.rounds, "ways": results}
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--n", type=int, default=1000, help="enqueues per way per round")
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
