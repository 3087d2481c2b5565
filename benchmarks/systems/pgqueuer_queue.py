"""pgqueuer 1.x: ``QueueManager.run`` with its default ``batch_size`` (10) and tuned ones.

pgqueuer deletes finished jobs from its queue table and logs each transition in
``pgqueuer_log`` (``created`` = ``now()``); completions are buffered and written in batches,
so a job's completion timestamp is when pgqueuer wrote it, which is what a reader sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

from ._events import Reader
from .base import QueueSystem, Window

__all__ = ["PgQueuerQueue"]

WINDOW = """
WITH job AS (
    SELECT min(created) FILTER (WHERE status = 'picked') AS picked,
           max(created) FILTER (WHERE status = 'successful') AS done
    FROM pgqueuer_log GROUP BY job_id
)
SELECT extract(epoch FROM min(picked))::float8,
       extract(epoch FROM max(done))::float8,
       count(done),
       1000 * percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM done - picked))
FROM job
"""
COMPLETED_AT = """
SELECT job_id, extract(epoch FROM created)::float8 FROM pgqueuer_log
WHERE job_id = ANY($1::bigint[]) AND status = 'successful'
"""
ENTRYPOINT = "noop"


class PgQueuerQueue(QueueSystem):
    """options: ``batch_size`` (default 10, ``QueueManager.run``'s default)."""

    name = "pgqueuer"

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.batch_size = int(options.get("batch_size", 10))
        self._conn: Any = None
        self._reader = Reader(url)
        logging.getLogger("pgqueuer").setLevel(logging.WARNING)

    async def _queries(self) -> Queries:
        if self._conn is None:
            self._conn = await asyncpg.connect(self.url)
        return Queries(AsyncpgDriver(self._conn))

    async def install(self) -> None:
        await (await self._queries()).install()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        await self._reader.close()

    async def enqueue_bulk(self, n: int) -> None:
        queries = await self._queries()
        await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)

    async def enqueue_one(self) -> object:
        queries = await self._queries()
        [job_id] = await queries.enqueue(ENTRYPOINT, None)
        return int(job_id)

    async def _manager(self) -> tuple[QueueManager, Any]:
        conn = await asyncpg.connect(self.url)
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint(ENTRYPOINT)
        async def noop(_job: object) -> None:
            return None

        return manager, conn

    async def drain(self) -> None:
        manager, conn = await self._manager()
        try:
            await manager.run(batch_size=self.batch_size, mode=QueueExecutionMode.drain)
        finally:
            await conn.close()

    async def serve(self, stop: asyncio.Event, ready: Callable[[], None]) -> None:
        manager, conn = await self._manager()
        worker = asyncio.create_task(
            manager.run(batch_size=self.batch_size, dequeue_timeout=timedelta(seconds=30))
        )
        await asyncio.sleep(0.5)  # no "listening" hook; the warm-up jobs prove it
        ready()
        await stop.wait()
        manager.shutdown.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(worker, 10)
        await conn.close()

    async def window(self) -> Window:
        return await self._reader.window(WINDOW)

    async def completed_at(self, ids: Sequence[object]) -> dict[object, float]:
        return await self._reader.completed_at(COMPLETED_AT, ids)
