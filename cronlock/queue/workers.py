"""The workers table: a drainer's heartbeat row, written every interval, removed when it stops.

The row only makes the drainer visible (``cronlock status``, the metrics, ``cronlock bench``):
the advisory lock decides who is active (``lease.py``). A drainer killed without a chance to
remove its row leaves it behind; how long such a row still counts as a live drainer is the one
liveness rule, ``sql.WORKER_ALIVE_WITHIN``, which ``sql.WORKER_LIST`` applies for every
reader; rows that stopped beating an hour ago are pruned when a drainer starts beating.

With ``$CRONLOCK_HEARTBEAT_FILE`` set (``cronlock worker --heartbeat-file``), each beat also
touches that file, whether or not the database answered: its age says the drainer's event loop
runs (a liveness probe), without failing while the drainer rides out a database outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError

from .. import sql
from ..database import Database

__all__ = ["HEARTBEAT_FILE_ENV", "Heartbeat"]

HEARTBEAT_FILE_ENV = "CRONLOCK_HEARTBEAT_FILE"

logger = logging.getLogger("cronlock.drainer")

_HOST = socket.gethostname()
# Rows of workers that stopped beating this long ago are deleted (killed, or their host died).
_STALE_WORKERS = timedelta(hours=1)


class Heartbeat:
    """One drainer's row: ``beat`` until cancelled, then ``forget``."""

    def __init__(
        self,
        database: Database,
        worker_id: uuid.UUID,
        *,
        queue: str,
        interval: float,
        row: Callable[[], dict[str, Any]],
    ) -> None:
        self.database = database
        self.worker_id = worker_id
        self.queue = queue
        self.interval = interval
        self._row = row  # the drainer's state, stats and jobs in flight, read at each beat

    async def beat(self) -> None:
        """Write the row now and every interval (a failed beat is logged and retried)."""
        engine = self.database.engine
        first = True
        touched = os.environ.get(HEARTBEAT_FILE_ENV)
        while True:
            try:
                async with engine.begin() as conn:
                    if first:
                        await conn.execute(sql.WORKER_PRUNE, {"older_than": _STALE_WORKERS})
                        first = False
                    await conn.execute(
                        sql.WORKER_UPSERT,
                        {
                            "id": self.worker_id,
                            "queue": self.queue,
                            "host": _HOST,
                            "pid": os.getpid(),
                            **self._row(),
                        },
                    )
            except (OSError, DBAPIError) as exc:
                logger.warning("heartbeat failed: %s", exc, extra={"action": "heartbeat_failed"})
            if touched:
                _touch(touched)
            await asyncio.sleep(self.interval)

    async def forget(self) -> None:
        with contextlib.suppress(OSError, DBAPIError):
            async with self.database.engine.begin() as conn:
                await conn.execute(sql.WORKER_DELETE, {"id": self.worker_id})


def _touch(path: str) -> None:
    try:
        with open(path, "a"):
            os.utime(path)
    except OSError as exc:  # a probe's file is not worth stopping the drainer for
        logger.warning("heartbeat file %s: %s", path, exc, extra={"action": "heartbeat_failed"})
