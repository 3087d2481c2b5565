"""The periodic path: 10,000 items, one UPDATE each in its own SAVEPOINT, in one transaction.

Two ways to do the same statements: ``raw`` is asyncpg with a nested transaction
(SAVEPOINT / UPDATE / RELEASE) per item, the floor PostgreSQL allows from Python; ``cronlock``
is a real periodic task run by ``App.run``: the advisory lock, ``run.item(key)`` per item on
SQLAlchemy's AsyncSession, and the run's row, committed together. Both are timed on the
client's clock from the first statement to the commit, and both leave every item updated once.
The cronlock variant can be profiled (cProfile) to show where its time goes.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Any

import asyncpg

__all__ = ["ITEMS_SQL", "run_cronlock", "run_raw"]

ITEMS_SQL = """
CREATE TABLE bench_items (id integer PRIMARY KEY, n integer NOT NULL DEFAULT 0);
INSERT INTO bench_items (id) SELECT generate_series(1, $1::integer);
"""
UPDATE_ITEM = "UPDATE bench_items SET n = n + 1 WHERE id = $1"
CHECK = "SELECT count(*) FILTER (WHERE n = 1), count(*) FROM bench_items"


async def _prepare(url: str, items: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(ITEMS_SQL.split(";")[0])
            await conn.execute(ITEMS_SQL.split(";")[1], items)
        await conn.execute("VACUUM ANALYZE bench_items")
    finally:
        await conn.close()


async def _check(url: str, items: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        once, total = await conn.fetchrow(CHECK)
    finally:
        await conn.close()
    if once != items or total != items:
        raise RuntimeError(f"{once} of {total} items updated once, expected {items}")


async def run_raw(url: str, items: int) -> dict[str, Any]:
    """asyncpg: one transaction, a savepoint per item."""
    await _prepare(url, items)
    conn = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        async with conn.transaction():
            for item in range(1, items + 1):
                async with conn.transaction():  # nested: SAVEPOINT ... RELEASE SAVEPOINT
                    await conn.execute(UPDATE_ITEM, item)
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
    await _check(url, items)
    return {"items": items, "seconds": seconds, "items_per_s": items / seconds}


async def run_cronlock(url: str, items: int, profile: str | None = None) -> dict[str, Any]:
    """A cronlock periodic task doing the same UPDATEs inside ``run.item()``."""
    # Imported here: the raw baseline must not need cronlock (nor its import time).
    from sqlalchemy import Column, Integer, MetaData, Table, bindparam, update

    import cronlock
    from cronlock import schema

    await _prepare(url, items)
    bench_items = Table(
        "bench_items", MetaData(), Column("id", Integer, primary_key=True), Column("n", Integer)
    )
    # What a task author writes: a Core UPDATE with a bound parameter, compiled once and cached.
    statement = (
        update(bench_items)
        .where(bench_items.c.id == bindparam("item"))
        .values(n=bench_items.c.n + 1)
    )
    app = cronlock.App()

    async def body(run: cronlock.Run) -> None:
        for item in range(1, items + 1):
            async with run.item(item) as session:
                await session.execute(statement, {"item": item})

    # Two tasks with one body: the warm-up must not share the measured run's slot.
    app.periodic("bench-warmup", cron="* * * * *")(body)
    app.periodic("bench-savepoints", cron="* * * * *")(body)

    database = app.use_database(url)
    try:
        await schema.upgrade(database)
        await app.run("bench-warmup")  # warms the engine's pool and statement caches
        await _reset(url)
        profiler = cProfile.Profile() if profile else None
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = await app.run("bench-savepoints")
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - started
    finally:
        await app.aclose()
    if result.status.value != "completed" or result.items_ok != items:
        raise RuntimeError(f"the run ended {result.status.value} with {result.items_ok} items")
    await _check(url, items)
    outcome: dict[str, Any] = {
        "items": items,
        "seconds": seconds,
        "items_per_s": items / seconds,
        "run_duration_ms": result.duration_ms,
    }
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
        outcome["profile"] = profile_summary(profiler)
    return outcome


async def _reset(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("UPDATE bench_items SET n = 0")
        await conn.execute("VACUUM ANALYZE bench_items")
    finally:
        await conn.close()


def profile_summary(profiler: cProfile.Profile, limit: int = 25) -> str:
    """The top functions by own time and by cumulative time, as pstats prints them."""
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs()
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()
