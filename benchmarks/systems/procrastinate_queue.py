"""procrastinate 3.x: the default worker (concurrency 1) and the tuned one (``concurrency``).

Timestamps come from ``procrastinate_events``, which procrastinate's own triggers fill with
``now()`` as jobs start (``started``) and finish (``succeeded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import procrastinate

from ._events import Reader
from .base import QueueSystem, Window

__all__ = ["ProcrastinateQueue"]

WINDOW = """
WITH job AS (
    SELECT min(at) FILTER (WHERE type = 'started') AS started,
           max(at) FILTER (WHERE type = 'succeeded') AS succeeded
    FROM procrastinate_events GROUP BY job_id
)
SELECT extract(epoch FROM min(started))::float8,
       extract(epoch FROM max(succeeded))::float8,
       count(succeeded),
       1000 * percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM succeeded - started))
FROM job
"""
COMPLETED_AT = """
SELECT job_id, extract(epoch FROM at)::float8 FROM procrastinate_events
WHERE job_id = ANY($1::bigint[]) AND type = 'succeeded'
"""


class ProcrastinateQueue(QueueSystem):
    """options: ``concurrency`` (default 1, procrastinate's default)."""

    name = "procrastinate"

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.concurrency = int(options.get("concurrency", 1))
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

        async def noop() -> None:
            return None

        self.task = self.app.task(name="noop", pass_context=False)(noop)
        self._opened = False
        self._reader = Reader(url)
        # One log line per job at INFO would be measured along with the queue.
        logging.getLogger("procrastinate").setLevel(logging.WARNING)

    async def _open(self) -> None:
        if not self._opened:
            await self.app.open_async()
            self._opened = True

    async def install(self) -> None:
        await self._open()
        await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        if self._opened:
            await self.app.close_async()
            self._opened = False
        await self._reader.close()

    async def enqueue_bulk(self, n: int) -> None:
        await self._open()
        # batch_defer_async: one INSERT for the whole batch (procrastinate >= 3.0).
        await self.task.batch_defer_async(*({} for _ in range(n)))

    async def enqueue_one(self) -> object:
        await self._open()
        return await self.task.defer_async()

    async def drain(self) -> None:
        await self._open()
        await self.app.run_worker_async(
            concurrency=self.concurrency, wait=False, install_signal_handlers=False
        )

    async def serve(self, stop: asyncio.Event, ready: Callable[[], None]) -> None:
        await self._open()
        worker = asyncio.create_task(
            self.app.run_worker_async(
                concurrency=self.concurrency, wait=True, install_signal_handlers=False
            )
        )
        await asyncio.sleep(0.5)  # procrastinate has no "listening" hook; warm-up jobs follow
        ready()
        await stop.wait()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    async def window(self) -> Window:
        return await self._reader.window(WINDOW)

    async def completed_at(self, ids: Sequence[object]) -> dict[object, float]:
        return await self._reader.completed_at(COMPLETED_AT, ids)
