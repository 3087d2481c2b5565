"""Items that keep failing across runs: remembered per (task, item key), parked after a few.

A run reads its task's failing items under its lock, with the gate (``sql.RUN_GATE``): each
key's consecutive failures and whether it is parked. During the body it notes which keys
failed (with their error) and which succeeded; with its outcome, in the same transaction, it
writes that back (``save``): a failed key counts one more failure and is parked once it
reaches the task's ``park_after``; a key that succeeded is forgotten. A failed run rolls its
items back, so only its failures are written then.

What the memory changes for a run: ``run.skip_parked(keys)`` leaves parked keys out of a batch
(and counts them, ``items_parked``), and a failure of a key that was failing already is
*known*: a run whose only failures are known ones is not ``failed`` (``run.py``), while a run
in which every new item failed still is. An item with no key (``run.item()``) cannot be
remembered: its failures are always new. A task declared with ``park_after=None`` keeps no
memory at all: every run whose items all failed is ``failed``, however often they failed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from .. import sql
from ..logs import RUNS_LOGGER

__all__ = ["ItemMemory"]

runs_logger = logging.getLogger(RUNS_LOGGER)

K = TypeVar("K")


class ItemMemory:
    """A task's failing items as one run found them, and what the run did to them."""

    __slots__ = ("_failed", "_known", "_succeeded", "new_failures", "park_after", "skipped")

    def __init__(self, found: Iterable[Any] | None, park_after: int | None) -> None:
        # key -> parked, for every key that was failing when the run began. A task with
        # park_after=None keeps no memory: every failure is new, as before there was one.
        self._known: dict[str, bool] = (
            {} if park_after is None else {str(row[0]): bool(row[2]) for row in found or ()}
        )
        self.park_after = park_after
        self._failed: dict[str, str] = {}  # key -> its error, in this run
        self._succeeded: set[str] = set()
        self.new_failures = 0  # failures of items that were not failing before this run
        self.skipped = 0  # parked items the run left out (skip_parked)

    def skip_parked(self, keys: Iterable[K]) -> list[K]:
        """``keys`` without the parked ones (counted in ``skipped``)."""
        given = list(keys)
        if not any(self._known.values()):
            return given
        kept = [key for key in given if not self._known.get(str(key), False)]
        self.skipped += len(given) - len(kept)
        return kept

    def succeeded(self, key: object) -> None:
        if key is None or not self._known:
            return
        name = str(key)
        if name in self._known:
            self._succeeded.add(name)
            self._failed.pop(name, None)

    def failed(self, key: object, error: str) -> None:
        if key is None:
            self.new_failures += 1
            return
        name = str(key)
        if name not in self._known and name not in self._failed:
            self.new_failures += 1
        self._failed[name] = error
        self._succeeded.discard(name)

    async def save(
        self, session: AsyncSession, task: str, now: datetime, *, committed: bool
    ) -> None:
        """Write what the run did to the memory, in the session's transaction (not committed):
        the failures always, the successes only when the run's work is ``committed``."""
        if self.park_after is None:
            return  # the task keeps no memory (park_after=None)
        if self._failed:
            rows = await session.execute(
                sql.ITEMS_FAILED,
                {
                    "task": task,
                    "items": list(self._failed),
                    "errors": list(self._failed.values()),
                    "park_after": self.park_after,
                    "now": now,
                },
            )
            for row in rows:
                if row.parked_at is not None and not self._known.get(row.item, False):
                    runs_logger.warning(
                        "%s: item %s parked after %d consecutive failures: %s "
                        "(cronlock task parked %s)",
                        task,
                        row.item,
                        row.failures,
                        self._failed[row.item],
                        task,
                        extra={"action": "item_parked", "task": task, "item": row.item},
                    )
        if committed and self._succeeded:
            await session.execute(
                sql.ITEMS_SUCCEEDED, {"task": task, "items": sorted(self._succeeded)}
            )
