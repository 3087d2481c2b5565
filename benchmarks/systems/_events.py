"""Reading a peer's timestamps back with asyncpg, whatever driver the peer itself uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from .base import Window

__all__ = ["Reader"]


class Reader:
    """One asyncpg connection for the harness's own read-back queries."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Any = None

    async def _connection(self) -> Any:
        if self._conn is None:
            self._conn = await asyncpg.connect(self.url)
        return self._conn

    async def window(self, sql: str) -> Window:
        """``sql`` returns (first claim epoch, last completion epoch, completed count, p95 ms)."""
        conn = await self._connection()
        first, last, count, p95 = await conn.fetchrow(sql)
        return Window(first, last, count, p95)

    async def completed_at(self, sql: str, ids: Sequence[object]) -> dict[object, float]:
        """``sql`` takes an array of ids and returns (id, completion epoch) rows."""
        conn = await self._connection()
        return {row[0]: row[1] for row in await conn.fetch(sql, list(ids))}

    async def scalar(self, sql: str) -> Any:
        conn = await self._connection()
        return await conn.fetchval(sql)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
