"""The periodic path: a manual run of a periodic task over N items, one UPDATE each inside
``run.item()`` (its own SAVEPOINT), all in the run's one transaction; timed on the client's
clock from the call to its return (lock, items, run row, commit), after a warm-up run."""

from __future__ import annotations

import time
from typing import Any

from cronlock.app import App
from cronlock.periodic import Run

from . import sql as bench_sql
from .progress import Progress
from .scratch import Scratch

__all__ = ["measure_periodic"]

WARMUP_ITEMS = 100
MEASURED, WARMUP = "cronlock-bench-periodic", "cronlock-bench-warmup"


def _body(items: int) -> Any:
    async def body(run: Run) -> None:
        for item in range(1, items + 1):
            async with run.item(item) as session:
                await session.execute(bench_sql.BENCH_ITEM_UPDATE, {"item": item})

    return body


async def measure_periodic(scratch: Scratch, progress: Progress, *, items: int) -> dict[str, Any]:
    app: App = scratch.fresh_app()
    # The lock namespace is the scratch schema's: no user task shares its advisory lock.
    app.periodic(WARMUP, cron="* * * * *", namespace=scratch.schema)(_body(WARMUP_ITEMS))
    app.periodic(MEASURED, cron="* * * * *", namespace=scratch.schema)(_body(items))
    try:
        await _fill(app, items)
        progress.note("warming up")
        await app.run(WARMUP, manual=True)  # the pool's connections and statement caches
        await _reset(app)
        progress.note(f"{items:,} items")
        started = time.perf_counter()
        result = await app.run(MEASURED, manual=True)
        seconds = time.perf_counter() - started
        if result.status.value != "completed" or result.items_ok != items:
            raise RuntimeError(f"the periodic run ended {result.status} ({result.error})")
        async with app.database.connect() as conn:
            once, total = (await conn.execute(bench_sql.BENCH_ITEMS_CHECK)).one()
        if (once, total) != (items, items):
            raise RuntimeError(f"{once} of {total} items updated once, expected {items}")
    finally:
        await app.aclose()
    return {
        "items": items,
        "seconds": seconds,
        "items_per_s": items / seconds,
        "run_duration_ms": result.duration_ms,
    }


async def _fill(app: App, items: int) -> None:
    async with app.database.engine.begin() as conn:
        _, total = (await conn.execute(bench_sql.BENCH_ITEMS_CHECK)).one()
        if total != items:
            await conn.execute(bench_sql.BENCH_ITEMS_DELETE)
            await conn.execute(bench_sql.BENCH_ITEMS_FILL, {"items": items})


async def _reset(app: App) -> None:
    async with app.database.engine.begin() as conn:
        await conn.execute(bench_sql.BENCH_ITEMS_RESET)
    async with app.database.engine.connect() as conn:
        vacuum = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await vacuum.execute(bench_sql.BENCH_ITEMS_VACUUM)
