"""A periodic task as declared (its schedule, its lock, how invocations map to slots), and the
``Run`` its body receives.

Every run but a manual one belongs to a *slot*, a fire time of the task's schedule. Which slot
an invocation belongs to: the next fire time if it is at most ``early`` ahead (a clock a little
fast), else the latest fire time if it is at most ``grace`` behind (a slow host, a late cron).
Outside both there is no slot: the run is ``skipped`` (``no_slot``) unless it was asked for as
manual, which runs under the lock with no slot at all. ``misfire`` says what the scheduler does
with slots that passed while nobody fired them. ``commit_every`` makes its runs chunked
(``chunks.py``); ``park_after`` parks an item after that many consecutive failed runs
(``poison.py``).

``Run`` lives here, not beside the code that runs one (``run.py``), because a task's body is
typed by it and it names its task: the two are one declaration.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ..cron import CronSchedule
from ..logs import RUNS_LOGGER
from ..observe.tracehooks import ITEM_EVENTS
from ..outcome import ItemFailure
from ..pg import await_in_greenlet
from .chunks import Chunks
from .items import ItemFrame, ItemSavepoints
from .poison import ItemMemory

__all__ = [
    "DEFAULT_PARK_AFTER",
    "ItemBlock",
    "Misfire",
    "PeriodicTask",
    "Run",
    "SlotPolicy",
    "TaskBody",
    "resolve_slot",
]

# A run's failed items (cronlock.logs: `cronlock run` prints them itself).
runs_logger = logging.getLogger(RUNS_LOGGER)

# A run's row keeps at most this many failures (items_failed still counts them all).
MAX_RECORDED_FAILURES = 1000

# A plain def body runs in a thread of its own, its session sync (queue/threads.py).
TaskBody = Callable[["Run"], Awaitable[None]] | Callable[["Run"], None]

K = TypeVar("K")

# A task's default park_after: consecutive failed runs of one item before it is parked.
DEFAULT_PARK_AFTER = 3


class Misfire(enum.StrEnum):
    """What the scheduler does with slots that passed while nobody fired them."""

    SKIP = "skip"  # record them missed; run only slots that are on time
    ONCE = "once"  # run the latest one once (unless an on-time slot runs anyway)
    EACH = "each"  # run each, oldest first, up to catch_up_limit (the most recent ones)


@dataclass(frozen=True)
class SlotPolicy:
    """How a task's invocations map to slots and how missed slots are handled."""

    grace: timedelta = timedelta(seconds=60)
    early: timedelta = timedelta(seconds=5)
    misfire: Misfire = Misfire.SKIP
    max_lateness: timedelta | None = None
    catch_up_limit: int = 10
    jitter: timedelta = timedelta(0)


@dataclass(frozen=True)
class PeriodicTask:
    """A registered periodic task: when it fires and which advisory lock guards it."""

    name: str
    schedule: CronSchedule
    namespace: str | int
    lock_namespace: int
    lock_key: int
    body: TaskBody = field(repr=False)
    description: str = ""
    policy: SlotPolicy = SlotPolicy()
    # Commit every this many top-level items (a chunked run, ``chunks.py``); None: the run is
    # one transaction.
    commit_every: int | None = None
    # Consecutive failed runs of one item before it is parked (``poison.py``); None: never.
    park_after: int | None = DEFAULT_PARK_AFTER
    threaded: bool = False  # a plain def body: run in a thread (run.py, queue/threads.py)


def resolve_slot(
    task: PeriodicTask, moment: datetime, *, grace: timedelta | None = None
) -> datetime | None:
    """The slot an invocation at ``moment`` belongs to, or None outside every slot's grace.

    The schedule decides (``CronSchedule.invocation_slot``): the upcoming fire time within
    ``early``, else the latest within ``grace``, and, around a DST jump, the slot cron's own
    catch-up invocation is for, so a time cron fires never lands outside a slot.
    """
    policy = task.policy
    return task.schedule.invocation_slot(
        moment, early=policy.early, grace=policy.grace if grace is None else grace
    )


class Run:
    """What a task body receives: the run's session and a savepoint per item."""

    def __init__(
        self,
        task: PeriodicTask,
        session: AsyncSession,
        slot: datetime | None,
        chunks: Chunks | None = None,
        memory: ItemMemory | None = None,
    ) -> None:
        self.task = task
        self.session = session
        self.slot = slot
        self.items_ok = 0
        self.items_failed = 0
        self.memory = memory if memory is not None else ItemMemory((), task.park_after)
        self.failures: list[ItemFailure] = []
        self._savepoints = ItemSavepoints(session)
        self._chunks = chunks  # a chunked run's commits (None: the run is one transaction)
        self._on_item = ITEM_EVENTS.get()  # a traced run's span hears of each item

    @property
    def sync_session(self) -> Session:
        """The run's session for a plain ``def`` body (its thread: ``queue/threads.py``)."""
        return self.session.sync_session

    def item(self, key: object = None) -> ItemBlock:
        """Process one item inside its own SAVEPOINT: ``async with run.item(key) as session``
        (in a plain ``def`` body: ``with run.item(key) as session``, a sync ``Session``).

        An exception inside the block rolls back to the savepoint, is recorded against ``key``
        and does not propagate: the run goes on with the next item. If the savepoint itself
        cannot be rolled back (the connection is gone), that error propagates and fails the run.
        Pending ORM changes are flushed before the release; a failed item's ORM changes are
        undone in the session too (see ``items.py``). Items may nest.
        """
        return ItemBlock(self, key)

    def skip_parked(self, keys: Iterable[K]) -> list[K]:
        """``keys`` without the items that are parked (they failed in ``park_after``
        consecutive runs): ``for post_id in run.skip_parked(ids): async with run.item(post_id)``.

        The run counts them (``items_parked``); ``cronlock task parked TASK`` lists them with
        their last error, and ``--retry KEY`` or ``--clear KEY`` gives one another try. A
        parked key given to ``run.item`` without this filter is tried like any other.
        """
        return self.memory.skip_parked(keys)

    @property
    def items_parked(self) -> int:
        return self.memory.skipped

    def _record_failure(self, key: object, exc: BaseException) -> None:
        self.items_failed += 1
        if self._on_item is not None:
            self._on_item(key, exc)
        failure = ItemFailure.from_exception(key, exc)
        self.memory.failed(key, f"{failure.error_type}: {failure.message}")
        if len(self.failures) < MAX_RECORDED_FAILURES:
            self.failures.append(failure)
        runs_logger.warning(
            "%s: item %s failed: %s: %s",
            self.task.name,
            failure.item,
            failure.error_type,
            failure.message,
            extra={"action": "item_failed", "task": self.task.name, "item": failure.item},
        )


class ItemBlock:
    """The context manager ``Run.item`` returns. A plain class: the periodic path enters one
    per item, and ``@asynccontextmanager``'s generator costs several microseconds more."""

    __slots__ = ("_frame", "_key", "_run")

    def __init__(self, run: Run, key: object) -> None:
        self._run = run
        self._key = key
        self._frame: ItemFrame | None = None

    async def __aenter__(self) -> AsyncSession:
        self._frame = await self._run._savepoints.begin()
        return self._run.session

    # A plain def body's item, in its thread: the same steps, run on the loop (threads.py).
    def __enter__(self) -> Session:
        await_in_greenlet(self.__aenter__())
        return self._run.session.sync_session

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        return await_in_greenlet(self.__aexit__(exc_type, exc, traceback))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        run = self._run
        savepoints = run._savepoints
        frame = self._frame
        assert frame is not None, "the item was not entered"
        try:
            if exc is None:
                try:
                    await savepoints.release(frame)
                except Exception as failure:
                    await savepoints.rollback(frame)
                    run._record_failure(self._key, failure)
                else:
                    run.items_ok += 1
                    run.memory.succeeded(self._key)
                    if run._on_item is not None:
                        run._on_item(self._key, None)
                recorded = False
            elif isinstance(exc, Exception):
                await savepoints.rollback(frame)
                run._record_failure(self._key, exc)
                recorded = True  # the run goes on with the next item
            else:
                return False  # cancellation, KeyboardInterrupt: not an item's failure
        finally:
            savepoints.end(frame)
        chunks = run._chunks
        if chunks is not None and frame.depth == 1 and chunks.due():
            await chunks.commit(run.items_ok, run.items_failed, run.failures)
        return recorded
