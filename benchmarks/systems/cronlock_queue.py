"""cronlock's job queue (issue 3), in both commit modes: the adapter the harness plugs in.

Written against the queue's API (``App.job``, ``App.enqueue``/``enqueue_many`` in the
caller's transaction, ``App.drainer(commit_mode=, batch_size=, concurrency=)`` with
``drain()``/``work()``/``stop()``). One job at a time is enqueued the way the peers do it,
committed on its own: ``App.enqueue(…)`` (one INSERT on a pooled connection);
``benchmarks.enqueue_one`` measures it beside the caller's-transaction path. Until the queue
is on the installed cronlock, every method raises ``Unsupported`` and the harness records the
queue's figures as missing.

Timestamps: ``started_at`` and ``completed_at`` are the database's clock, written in the
transaction that completes the job: ``started_at`` is its claim's (the claiming transaction's
``now()``; in batch mode the same for the batch), ``completed_at`` the outcome statement's
``clock_timestamp()``, just before the commit. The strict and batch modes commit no claim, so
the database's per-job figure is claim -> outcome (in batch mode the whole batch's), and the
reference's p95 (started -> committed) is taken from the drainer's own report instead
(``reported_p95_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import cronlock
from cronlock import schema
from cronlock.database import Database

from ._events import Reader
from .base import QueueSystem, Unsupported, Window

__all__ = ["CronlockQueue", "queue_available"]

WINDOW = """
SELECT extract(epoch FROM min(started_at))::float8,
       extract(epoch FROM max(completed_at))::float8,
       count(*),
       1000 * percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - started_at))
FROM cronlock.jobs WHERE status = 'completed'
"""
COMPLETED_AT = """
SELECT id, extract(epoch FROM completed_at)::float8 FROM cronlock.jobs
WHERE id = ANY($1::uuid[]) AND status = 'completed'
"""
JOB_TYPE = "noop"


def queue_available() -> bool:
    """Whether the installed cronlock has the job queue (issue 3)."""
    return hasattr(cronlock.App, "job") and hasattr(cronlock.App, "drainer")


class CronlockQueue(QueueSystem):
    """options: ``commit_mode`` (strict|batch), ``batch_size``, ``concurrency``, ``plain``
    (the no-op handler a plain ``def``, run in the drainer's thread pool)."""

    name = "cronlock"

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        if not queue_available():
            raise Unsupported("cronlock's job queue (issue 3) is not in this cronlock yet")
        # Typed Any: the queue's API is not on every cronlock this module is checked against.
        app: Any = cronlock.App()

        async def noop(_session: object, _payload: object) -> None:
            return None

        def plain_noop(_session: object, _payload: object) -> None:
            return None

        app.job(JOB_TYPE)(plain_noop if options.get("plain") else noop)
        self.app = app

        self.database: Database = self.app.use_database(url)
        self._reader = Reader(url)

    def _drainer(self) -> Any:
        return self.app.drainer(
            commit_mode=self.options.get("commit_mode", "strict"),
            batch_size=self.options.get("batch_size"),
            concurrency=int(self.options.get("concurrency", 1)),
        )

    async def install(self) -> None:
        await schema.upgrade(self.database)

    async def close(self) -> None:
        await self.app.aclose()
        await self._reader.close()

    async def enqueue_bulk(self, n: int) -> None:
        async with self.database.engine.begin() as conn:
            await self.app.enqueue_many_tx(conn, JOB_TYPE, [{}] * n)

    async def enqueue_one(self) -> object:
        enqueued = await self.app.enqueue(JOB_TYPE, {})
        return enqueued.id

    async def drain(self) -> None:
        result = await self._drainer().drain()
        if result.status.value not in ("completed",):
            raise RuntimeError(f"cronlock drain ended {result.status.value}: {result.error}")
        # started -> committed per job, the reference's latency (DrainStats.report).
        self.reported_p95_ms = result.stats.get("p95_latency_ms")

    async def serve(self, stop: asyncio.Event, ready: Callable[[], None]) -> None:
        drainer = self._drainer()
        work = asyncio.create_task(drainer.work())
        # A drainer is a standby from the start and active once it holds the lock; the
        # harness's warm-up jobs (latency, recovery) prove which one is active.
        await asyncio.sleep(0.2)
        ready()
        await stop.wait()
        drainer.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await work

    async def window(self) -> Window:
        return await self._reader.window(WINDOW)

    async def completed_at(self, ids: Sequence[object]) -> dict[object, float]:
        return await self._reader.completed_at(COMPLETED_AT, ids)
