"""Sync enqueue (issue 24, item 2) beside ``App.enqueue``, ``enqueue_many`` and PgQueuer's sync API.

    python -m benchmarks.sync_enqueue [--server URL] [--n 1000] [--bulk 1000] [--rounds 7]

One scratch database holds cronlock's schema and PgQueuer's. Every round calls each
one-at-a-time way ``--n`` times and each bulk way ``--bulk-calls`` times (``--bulk`` jobs a
call), the ways taking turns call by call, so that they share the machine's moods; a way's
figure in a round is its jobs over the time spent in its own calls, and each figure shown is
the median over the rounds with its min..max: jobs/s on the client's clock and the client
process's CPU time per job (``time.process_time``). Python's cyclic garbage collector is off
while a round is timed (as ``timeit`` has it) and runs between rounds: on, a collection of
the whole heap (about 8 ms here) lands on whichever way's allocation trips it, and the bulk
ways' CPU per job came out 14 or 22 µs by that alone, turn by turn. Every job is committed
before its call returns, and both queues' rows are counted at the end (a way that wrote
fewer fails the run).

One at a time, each enqueue its own transaction, like for like:

- ``cronlock App.enqueue (asyncpg)``: ``await app.enqueue(…)``, committed on its own: one
  INSERT on the Database's kept asyncpg connection, no BEGIN/COMMIT (``enqueue.py``).
- ``cronlock app.sync, psycopg autocommit``: ``app.sync.enqueue_tx(conn, …)`` on a psycopg 3
  connection in autocommit: one INSERT that commits by itself (the same round trips as the
  two above and PgQueuer's).
- ``PgQueuer SyncQueries, psycopg autocommit``: ``SyncQueries(SyncPsycopgDriver(conn))
  .enqueue("noop", None)``, PgQueuer's own sync enqueue, which requires autocommit.
- ``cronlock app.sync, psycopg commit per job``: the same enqueue in a transaction of the
  caller's, then ``conn.commit()``: BEGIN, INSERT, COMMIT, what a request that enqueues pays
  for its transaction (here with nothing else in it).
- ``cronlock app.sync, SQLAlchemy Session commit per job``: ``with Session.begin()`` on a
  psycopg engine around ``app.sync.enqueue_tx(session, …)``: the Flask example's path.

Bulk, ``--bulk`` jobs in one statement a call, committed with it:

- ``cronlock App.enqueue_many (asyncpg)``: ``await app.enqueue_many(…)`` on the Database.
- ``cronlock app.sync.enqueue_many_tx, psycopg autocommit``: the one statement commits itself.
- ``PgQueuer SyncQueries bulk``: ``enqueue([...], [...], [...])``, one statement.

The JSON result is written under ``benchmarks/results/`` (``sync-enqueue-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import psycopg
from pgqueuer.db import SyncPsycopgDriver
from pgqueuer.queries import SyncQueries
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import cronlock
from cronlock import schema

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database
from .systems.pgqueuer_queue import PgQueuerQueue

__all__ = ["main", "measure"]

# One call of a way: how many jobs it committed.
Way = Callable[[], Awaitable[int]]
PACKAGES = ("psycopg", "asyncpg", "sqlalchemy", "pgqueuer")


async def measure(
    server: str,
    n: int,
    bulk: int,
    bulk_calls: int,
    rounds: int,
    warmup: int = 50,
    prefix: str = "sync_enqueue",
) -> dict[str, Any]:
    async with scratch_database(server, prefix) as url:
        app = cronlock.App()

        @app.job("noop")
        async def noop(_session: object, _payload: object) -> None:
            return None

        database = app.use_database(url)
        await schema.upgrade(database)
        installer = PgQueuerQueue(url, {})
        await installer.install()
        await installer.close()
        auto = psycopg.connect(url, autocommit=True)
        manual = psycopg.connect(url)
        peer = psycopg.connect(url, autocommit=True)
        engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
        pgqueuer = SyncQueries(SyncPsycopgDriver(peer))
        payloads: list[dict[str, Any]] = [{}] * bulk

        async def on_database() -> int:
            await app.enqueue("noop", {})
            return 1

        async def sync_autocommit() -> int:
            app.sync.enqueue_tx(auto, "noop", {})
            return 1

        async def pgqueuer_one() -> int:
            pgqueuer.enqueue("noop", None)
            return 1

        async def sync_commit() -> int:
            app.sync.enqueue_tx(manual, "noop", {})
            manual.commit()
            return 1

        async def sync_session() -> int:
            with Session(engine) as session, session.begin():
                app.sync.enqueue_tx(session, "noop", {})
            return 1

        async def many_on_database() -> int:
            return len(await app.enqueue_many("noop", payloads))

        async def many_sync() -> int:
            return len(app.sync.enqueue_many_tx(auto, "noop", payloads))

        async def many_pgqueuer() -> int:
            return len(pgqueuer.enqueue(["noop"] * bulk, [None] * bulk, [0] * bulk))

        one: dict[str, Way] = {
            "cronlock App.enqueue (asyncpg)": on_database,
            "cronlock app.sync, psycopg autocommit": sync_autocommit,
            "PgQueuer SyncQueries, psycopg autocommit": pgqueuer_one,
            "cronlock app.sync, psycopg commit per job": sync_commit,
            "cronlock app.sync, SQLAlchemy Session commit per job": sync_session,
        }
        many: dict[str, Way] = {
            "cronlock App.enqueue_many (asyncpg)": many_on_database,
            "cronlock app.sync.enqueue_many_tx, psycopg autocommit": many_sync,
            "PgQueuer SyncQueries bulk": many_pgqueuer,
        }
        ways = {**one, **many}
        try:
            written = 0
            for name, way in ways.items():
                for _ in range(warmup if name in one else 2):
                    written += await way()
            rates: dict[str, list[float]] = {name: [] for name in ways}
            cpu_us: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(rounds):
                gc.collect()
                gc.disable()  # see the module's docstring
                for group, calls in ((one, n), (many, bulk_calls)):
                    # Call by call, each way in turn: a drift of the machine's speed (this
                    # one's steal time moves by tens of percent within seconds) falls on every
                    # way of the round alike.
                    wall = dict.fromkeys(group, 0.0)
                    cpu = dict.fromkeys(group, 0.0)
                    jobs = dict.fromkeys(group, 0)
                    for _ in range(calls):
                        for name, way in group.items():
                            started, used = time.perf_counter(), time.process_time()
                            jobs[name] += await way()
                            cpu[name] += time.process_time() - used
                            wall[name] += time.perf_counter() - started
                    for name in group:
                        rates[name].append(jobs[name] / wall[name])
                        cpu_us[name].append(cpu[name] / jobs[name] * 1e6)
                        written += jobs[name]
                gc.enable()
            cronlock_jobs = auto.execute("SELECT count(*) FROM cronlock.jobs").fetchone()
            peer_jobs = auto.execute("SELECT count(*) FROM pgqueuer").fetchone()
            expected = (warmup * 4 + 2 * bulk * 2) + rounds * (4 * n + 2 * bulk * bulk_calls)
            expected_peer = warmup + 2 * bulk + rounds * (n + bulk * bulk_calls)
            counted = (cronlock_jobs and cronlock_jobs[0], peer_jobs and peer_jobs[0])
            if counted != (expected, expected_peer) or written != expected + expected_peer:
                raise AssertionError(f"jobs written {counted}, expected {expected, expected_peer}")
        finally:
            for conn in (auto, manual, peer):
                conn.close()
            engine.dispose()
            await app.aclose()
    return {
        "one_at_a_time": {name: _figures(rates[name], cpu_us[name]) for name in one},
        "bulk": {name: _figures(rates[name], cpu_us[name]) for name in many},
    }


def _figures(rates: list[float], cpu_us: list[float]) -> dict[str, Any]:
    return {"per_s": _spread(rates), "client_cpu_us": _spread(cpu_us)}


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def _table(results: dict[str, Any]) -> str:
    lines = ["| way | jobs/s | client CPU µs/job |", "|---|---:|---:|"]
    for kind in ("one_at_a_time", "bulk"):
        for name, figures in results[kind].items():
            rate, cpu = figures["per_s"], figures["client_cpu_us"]
            lines.append(
                f"| {name} | {rate['median']:,.0f} ({rate['min']:,.0f}..{rate['max']:,.0f}) "
                f"| {cpu['median']:,.1f} ({cpu['min']:,.1f}..{cpu['max']:,.1f}) |"
            )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    results = await measure(args.server, args.n, args.bulk, args.bulk_calls, args.rounds)
    print(_table(results))
    out = await write_check(
        "sync-enqueue",
        started,
        args.server,
        {
            "n": args.n,
            "bulk": args.bulk,
            "bulk_calls": args.bulk_calls,
            "rounds": args.rounds,
            "packages": {name: metadata.version(name) for name in PACKAGES},
            **results,
        },
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--n", type=int, default=1000, help="one-at-a-time enqueues per way")
    parser.add_argument("--bulk", type=int, default=1000, help="jobs per bulk call")
    parser.add_argument("--bulk-calls", type=int, default=20, help="bulk calls per way")
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
