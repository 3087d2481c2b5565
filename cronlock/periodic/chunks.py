"""A chunked run's commits: every ``commit_every`` top-level items, the chunk and its progress.

A task declared with ``commit_every=N`` does not run in one transaction: after every N
top-level items (``run.item``, counted when the item ends, whether it succeeded or failed) its
session commits, with the run's row updated in the same transaction (items so far, failures,
chunks, the commit's time). Items nested in an item count with it, and a chunk only ends
between top-level items, outside any SAVEPOINT the body opened itself: so a chunk's
transaction holds at most N item savepoints (plus what items nest), and no transaction lasts
the whole run.

Before each commit the run asks its guard whether it still holds the task's lock
(``guard.py``); the row's update only matches a row still ``running``, so a run that lost its
lock and was marked ``interrupted`` by the next one cannot commit a chunk after that: the
update matches nothing, and the chunk is rolled back (``LockLost``). A commit that fails
otherwise (its connection cut, a deferred constraint) ends the run: the error propagates from
the item, and stays the run's error even if the body catches it (``broken``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from .. import sql
from ..outcome import ItemFailure
from .guard import Guard

__all__ = ["Chunks", "LockLost"]


class LockLost(Exception):
    """The chunked run lost its lock before its end: the chunk in progress was not committed.
    (An outcome the run records as ``interrupted``, never raised to its caller.)"""


class Chunks:
    """The chunk bookkeeping of one chunked run (its row is ``run_id``)."""

    def __init__(self, session: AsyncSession, guard: Guard, run_id: int, every: int) -> None:
        self.session = session
        self.guard = guard
        self.run_id = run_id
        self.every = every
        self.pending = 0  # top-level items since the last commit
        self.committed = 0  # chunks committed
        self.committed_ok = 0  # items that committed, as of the last commit
        self.committed_at: datetime | None = None
        self.broken: BaseException | None = None  # a commit failed: the run cannot go on

    def due(self) -> bool:
        """Whether a top-level item just ended the chunk (and the body holds no SAVEPOINT of
        its own, which a commit would end under it)."""
        self.pending += 1
        return (
            self.pending >= self.every
            and self.broken is None
            and self.session.sync_session.get_nested_transaction() is None
        )

    async def commit(
        self, items_ok: int, items_failed: int, failures: Sequence[ItemFailure]
    ) -> None:
        """Commit the chunk with the run's progress; raises LockLost (or the commit's error)
        when it cannot, the chunk then being rolled back by the run."""
        try:
            # The guard's ping and the row's update go to two connections: at once.
            alive, row = await asyncio.gather(
                self.guard.alive(),
                self.session.scalar(
                    sql.RUN_CHUNK_COMMIT,
                    {
                        "run_id": self.run_id,
                        "new_items_ok": items_ok,
                        "new_items_failed": items_failed,
                        "new_failures": [f.to_dict() for f in failures],
                        "new_chunks": self.committed + 1,
                    },
                ),
            )
            if not alive:
                raise LockLost(_GUARD_GONE)
            if row is None:
                raise LockLost("another run marked this run interrupted: it had lost its lock")
            await self.session.commit()
            await self.begin()
        except BaseException as exc:
            self.broken = exc
            raise
        self.committed += 1
        self.pending = 0
        self.committed_ok = items_ok

    async def begin(self) -> None:
        """Begin the next chunk's transaction. SQLAlchemy's asyncpg adapter sends BEGIN only
        with its next statement, and the items' SAVEPOINTs go to the driver directly: a
        statement through the session comes first."""
        await self.session.execute(sql.PING)

    async def check_lock(self) -> None:
        if not await self.guard.alive():
            raise LockLost(_GUARD_GONE)


_GUARD_GONE = "lost the task's lock: its guard connection is gone"
