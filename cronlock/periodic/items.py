"""The savepoints around a run's items: one per item, sent on the driver's simple protocol.

A run does many small items in one transaction, so an item's savepoint is most of its cost.
SQLAlchemy's ``begin_nested()`` names every savepoint anew and its asyncpg dialect prepares
every statement, so each SAVEPOINT and RELEASE paid a prepare round trip, plus the ORM's
bookkeeping. Here an item's SAVEPOINT, RELEASE and ROLLBACK TO go straight to the run's
asyncpg connection as text (``pg.py``'s savepoint verbs: simple query protocol, one round
trip, also behind PgBouncer), all with one name: savepoints of the same name stack, so items
nest. The RELEASE of a top-level item that succeeded is held back and sent with the next
item's SAVEPOINT, in one message; an unsent RELEASE is harmless, since releasing or rolling
back the run's body savepoint takes the item's with it.

The ORM keeps its guarantees without paying for them on items that do not use it:

- a flush inside an item (explicit, autoflush, or the one at the item's end) runs inside a
  SQLAlchemy SAVEPOINT taken at that moment (``before_flush``), so a failed flush rolls back to
  it and not to the run's body savepoint, and SQLAlchemy undoes its own state: objects the item
  inserted are expunged, objects it updated are expired;
- changes made in a failed item and never flushed are discarded (new objects expunged,
  modified ones expired, deletions undone), so no later flush writes them;
- SAVEPOINTs the task itself opened in the item are committed with it or rolled back with it.

Pending changes from before an item are flushed when it begins, outside its savepoint, as
``begin_nested()`` did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from .. import pg

__all__ = ["ItemFrame", "ItemSavepoints"]


@dataclass(slots=True)
class ItemFrame:
    """One item in progress."""

    outer: SessionTransaction | None  # the session's innermost SAVEPOINT when the item began
    depth: int


class ItemSavepoints:
    """The item savepoints of one run's session (see the module docstring)."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self._sync = session.sync_session
        self._frames: list[ItemFrame] = []
        self._driver: pg.DriverConnection | None = None  # under the session's transaction
        self._root: SessionTransaction | None = None  # ... that transaction
        self._outer: SessionTransaction | None = None  # the last SAVEPOINT known to be sent
        # A top-level item succeeded and its RELEASE is not sent yet; the session's innermost
        # SAVEPOINT then, so the next item sends it only if nothing was opened since.
        self._unreleased = False
        self._unreleased_outer: SessionTransaction | None = None
        event.listen(self._sync, "before_flush", self._before_flush)

    async def begin(self) -> ItemFrame:
        """Flush what is pending (outside the item), then take the item's SAVEPOINT."""
        sync = self._sync
        if pg.session_has_pending(sync):
            await self.session.flush()
        outer = sync.get_nested_transaction()
        driver = self._driver
        if outer is not self._outer or sync.get_transaction() is not self._root or driver is None:
            driver = await self._connection(outer)
        depth = len(self._frames) + 1
        release_previous = self._unreleased and depth == 1 and outer is self._unreleased_outer
        self._unreleased = False
        self._unreleased_outer = None
        await pg.savepoint(driver, release_previous=release_previous)
        frame = ItemFrame(outer, depth)
        self._frames.append(frame)
        return frame

    async def release(self, frame: ItemFrame) -> None:
        """The item succeeded: flush it, close SAVEPOINTs it opened, release its own."""
        if pg.session_has_pending(self._sync):
            await self.session.flush()  # inside a SAVEPOINT of its own (_before_flush)
        opened = self._opened_since(frame)
        if opened is not None:
            await self.session.run_sync(lambda _: opened.commit())
        if frame.depth == 1:
            self._unreleased = True
            self._unreleased_outer = frame.outer
        else:
            assert self._driver is not None  # set by begin()
            await pg.release_savepoint(self._driver)

    async def rollback(self, frame: ItemFrame) -> None:
        """The item failed: undo its writes and its ORM changes. Raises if it cannot (the
        connection is gone): then the run's transaction cannot go on."""
        opened = self._opened_since(frame)
        if opened is not None:
            # SQLAlchemy rolls back its SAVEPOINT and its own state (expunge, expire).
            await self.session.run_sync(lambda _: opened.rollback())
        _discard_pending(self._sync)
        assert self._driver is not None  # set by begin()
        await pg.rollback_to_savepoint(self._driver)

    def end(self, frame: ItemFrame) -> None:
        if self._frames and self._frames[-1] is frame:
            self._frames.pop()

    async def _connection(self, outer: SessionTransaction | None) -> pg.DriverConnection:
        """The driver's connection, once the session's own SAVEPOINTs are on it (called when
        the session's transaction or innermost SAVEPOINT is not the one last seen)."""
        # SQLAlchemy sends a SAVEPOINT when the session first uses it: asking the session for
        # its connection sends it now, before the item's (once per new SAVEPOINT).
        driver = await pg.driver_of(await self.session.connection())
        self._driver = driver
        root = self._sync.get_transaction()
        if root is not self._root:
            # First item of the run, or the task ended the transaction: nothing held back
            # belongs to this one.
            self._unreleased = False
        self._root = root
        self._outer = outer
        return driver

    def _opened_since(self, frame: ItemFrame) -> SessionTransaction | None:
        """The outermost SAVEPOINT the session opened inside the item and has not closed."""
        opened = None
        current = self._sync.get_nested_transaction()
        while current is not None and current is not frame.outer:
            opened = current
            current = current.parent
        return opened if current is frame.outer else None

    def _before_flush(self, session: Session, flush_context: Any, instances: Any) -> None:
        # A flush that fails rolls back to the innermost SAVEPOINT SQLAlchemy knows of: give it
        # one inside the item, unless the task opened its own there.
        if not self._frames:
            return
        frame = self._frames[-1]
        if session.get_nested_transaction() is frame.outer:
            session.begin_nested()


def _discard_pending(session: Session) -> None:
    """Forget changes never flushed, so no later flush writes them (as a SAVEPOINT's rollback
    does in SQLAlchemy: new objects are expunged, changed ones expired, deletions undone)."""
    for obj in list(session.new):
        session.expunge(obj)
    for obj in list(session.deleted):
        session.expunge(obj)
        session.add(obj)
        session.expire(obj)
    for obj in list(session.dirty):
        session.expire(obj)
