"""oban-py (Python >= 3.12): a queue limit of 10 (the documented example) and tuned limits.

Oban stamps ``attempted_at`` when it claims a job and ``completed_at`` when it acknowledges
it, both ``timezone('UTC', now())`` in columns without a time zone, so their epoch is UTC's.
This module runs in its own interpreter (the harness's 3.12 virtualenv).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from oban import Oban, schema, worker
from psycopg_pool import AsyncConnectionPool

from ._events import Reader
from .base import QueueSystem, Window

__all__ = ["ObanQueue"]

WINDOW = """
SELECT extract(epoch FROM min(attempted_at))::float8,
       extract(epoch FROM max(completed_at))::float8,
       count(*) FILTER (WHERE state = 'completed'),
       1000 * percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - attempted_at))
FROM oban_jobs
"""
COMPLETED_AT = """
SELECT id, extract(epoch FROM completed_at)::float8 FROM oban_jobs
WHERE id = ANY($1::bigint[]) AND state = 'completed'
"""
COMPLETED = "SELECT count(*) FROM oban_jobs WHERE state = 'completed'"
TOTAL = "SELECT count(*) FROM oban_jobs"


@worker(queue="default")
class _Noop:
    async def process(self, job: Any) -> None:
        return None


# @worker adds ``new``/``enqueue`` at run time, which a type checker cannot see.
Noop: Any = _Noop


class ObanQueue(QueueSystem):
    """options: ``limit`` (the ``default`` queue's limit; 10 unless given)."""

    name = "oban"

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.limit = int(options.get("limit", 10))
        self._pool: AsyncConnectionPool | None = None
        self._client: Oban | None = None
        self._reader = Reader(url)
        logging.getLogger("oban").setLevel(logging.WARNING)

    async def _open_pool(self) -> AsyncConnectionPool:
        if self._pool is None:
            # Oban.create_pool's defaults (1..10 connections), from our URL.
            self._pool = await Oban.create_pool(self.url)
        return self._pool

    async def _oban(self) -> Oban:
        """A client-mode instance (no queues): it only enqueues."""
        if self._client is None:
            self._client = Oban(pool=await self._open_pool())
        return self._client

    async def install(self) -> None:
        await schema.install(await self._open_pool())

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        await self._reader.close()

    async def enqueue_bulk(self, n: int) -> None:
        oban = await self._oban()
        await oban.enqueue_many([Noop.new({}) for _ in range(n)])

    async def enqueue_one(self) -> object:
        oban = await self._oban()
        job = await oban.enqueue(Noop.new({}))
        return job.id

    def _server(self, pool: AsyncConnectionPool) -> Oban:
        # The server registers itself under the default name, replacing the client.
        return Oban(pool=pool, queues={"default": self.limit})

    async def drain(self) -> None:
        pool = await self._open_pool()
        async with self._server(pool):
            # Oban has no "run until empty" mode: watch the table until every job completed.
            total = await self._reader.scalar(TOTAL)
            deadline = time.monotonic() + 3600
            while await self._reader.scalar(COMPLETED) < total:
                if time.monotonic() > deadline:
                    raise RuntimeError("oban did not drain within an hour")
                await asyncio.sleep(0.02)

    async def serve(self, stop: asyncio.Event, ready: Callable[[], None]) -> None:
        pool = await self._open_pool()
        async with self._server(pool):
            ready()
            await stop.wait()

    async def window(self) -> Window:
        return await self._reader.window(WINDOW)

    async def completed_at(self, ids: Sequence[object]) -> dict[object, float]:
        return await self._reader.completed_at(COMPLETED_AT, ids)
