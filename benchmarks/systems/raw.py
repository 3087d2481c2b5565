"""Raw asyncpg baselines: what PostgreSQL itself allows for each workload, without a library.

The statements are the minimum a correct queue needs and nothing more: a claim with
``FOR UPDATE SKIP LOCKED`` and a completion ``UPDATE``, either one job per transaction
(``mode=strict``, the reference's semantics: one fsync per job) or a batch per transaction
with one completion ``UPDATE`` for the whole batch (``mode=batch``); or the claim committed
on its own (``status = 'processing'``) and the batch's completion after the handlers, fenced
by that status (``mode=split``: two commits a batch, the lease commit mode's minimum). The
idle worker (for the latency floor) wakes on a statement-level ``NOTIFY`` trigger, as
cronlock's does.
This SQL lives here, not in cronlock: it is the yardstick, not the product.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from .base import QueueSystem, Window, noop

__all__ = ["SCHEMA_SQL", "RawQueue"]

SCHEMA_SQL = """
CREATE TABLE bench_jobs (
    id bigserial PRIMARY KEY,
    job_type text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'pending',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at timestamptz,
    completed_at timestamptz
);
CREATE INDEX bench_jobs_pending ON bench_jobs (id) WHERE status = 'pending';
CREATE FUNCTION bench_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bench_jobs', '');
    RETURN NULL;
END $$;
CREATE TRIGGER bench_jobs_inserted AFTER INSERT ON bench_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION bench_jobs_notify();
"""

# clock_timestamp(), not now(): now() is the transaction's start, the same for a whole batch.
CLAIM = """
SELECT id, payload, clock_timestamp() AS claimed_at
FROM bench_jobs
WHERE status = 'pending'
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
COMPLETE_ONE = """
UPDATE bench_jobs SET status = 'completed', started_at = $2, completed_at = clock_timestamp()
WHERE id = $1
"""
COMPLETE_MANY = """
UPDATE bench_jobs SET status = 'completed', started_at = $2, completed_at = clock_timestamp()
WHERE id = ANY($1::bigint[])
"""
CLAIM_SPLIT = """
UPDATE bench_jobs SET status = 'processing', started_at = clock_timestamp()
WHERE id IN (
    SELECT id FROM bench_jobs WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id, payload
"""
COMPLETE_SPLIT = """
UPDATE bench_jobs SET status = 'completed', completed_at = clock_timestamp()
WHERE id = ANY($1::bigint[]) AND status = 'processing'
"""
INSERT_MANY = """
INSERT INTO bench_jobs (job_type, payload) SELECT 'noop', p FROM unnest($1::jsonb[]) AS p
"""
INSERT_ONE = "INSERT INTO bench_jobs (job_type, payload) VALUES ('noop', '{}') RETURNING id"
WINDOW = """
SELECT extract(epoch FROM min(started_at))::float8,
       extract(epoch FROM max(completed_at))::float8,
       count(*),
       1000 * percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - started_at))
FROM bench_jobs WHERE status = 'completed'
"""
COMPLETED_AT = """
SELECT id, extract(epoch FROM completed_at)::float8 FROM bench_jobs
WHERE id = ANY($1::bigint[]) AND status = 'completed'
"""

DEFAULT_BATCH = 500


class RawQueue(QueueSystem):
    """asyncpg on one connection; options: ``mode`` (strict|batch|split), ``batch_size``."""

    name = "raw"

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.mode = options.get("mode", "strict")
        if self.mode not in ("strict", "batch", "split"):
            raise ValueError(f"unknown raw mode {self.mode!r}")
        self.batch_size = int(options.get("batch_size", DEFAULT_BATCH))
        self._conn: Any = None

    async def _connection(self) -> Any:
        if self._conn is None:
            self._conn = await asyncpg.connect(self.url)
        return self._conn

    async def install(self) -> None:
        conn = await self._connection()
        await conn.execute(SCHEMA_SQL)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def enqueue_bulk(self, n: int) -> None:
        conn = await self._connection()
        await conn.execute(INSERT_MANY, ["{}"] * n)

    async def enqueue_one(self) -> object:
        conn = await self._connection()
        return await conn.fetchval(INSERT_ONE)

    async def _claim_and_complete(self, conn: Any) -> int:
        """One transaction: claim, run the no-op handlers, complete. The jobs it took."""
        limit = 1 if self.mode == "strict" else self.batch_size
        if self.mode == "split":
            rows = await conn.fetch(CLAIM_SPLIT, limit)  # committed: the claim is the lease
            for row in rows:
                await noop(row["payload"])
            if rows:
                await conn.execute(COMPLETE_SPLIT, [row["id"] for row in rows])
            return len(rows)
        async with conn.transaction():
            rows = await conn.fetch(CLAIM, limit)
            if not rows:
                return 0
            for row in rows:
                await noop(row["payload"])
            claimed_at = rows[0]["claimed_at"]
            if self.mode == "strict":
                await conn.execute(COMPLETE_ONE, rows[0]["id"], claimed_at)
            else:
                await conn.execute(COMPLETE_MANY, [row["id"] for row in rows], claimed_at)
        return len(rows)

    async def drain(self) -> None:
        conn = await self._connection()
        while await self._claim_and_complete(conn):
            pass

    async def serve(self, stop: asyncio.Event, ready: Callable[[], None]) -> None:
        conn = await self._connection()
        wake = asyncio.Event()
        await conn.add_listener("bench_jobs", lambda *_: wake.set())
        ready()
        while not stop.is_set():
            while await self._claim_and_complete(conn):
                pass
            stopping = asyncio.ensure_future(stop.wait())
            waking = asyncio.ensure_future(wake.wait())
            await asyncio.wait({stopping, waking}, timeout=1.0, return_when="FIRST_COMPLETED")
            for pending in (stopping, waking):
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
            wake.clear()

    async def window(self) -> Window:
        conn = await self._connection()
        first, last, count, p95 = await conn.fetchrow(WINDOW)
        return Window(first, last, count, p95)

    async def completed_at(self, ids: Sequence[object]) -> dict[object, float]:
        conn = await self._connection()
        rows = await conn.fetch(COMPLETED_AT, list(ids))
        return {row[0]: row[1] for row in rows}
