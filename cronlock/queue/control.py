"""Queue control: pause and resume a queue for every drainer on every host, and list queues.

A pause is a row of ``queues`` with ``paused_at`` set, committed with a notification on the
schema's jobs channel. The claim reads that row (``sql.JOB_CLAIM``), so from the commit on no
drainer of the queue claims anything, on any host, whatever it was doing: a lane in the middle
of a batch finishes the jobs it holds and its next claim finds none. The idle drainers' look
at the next due job reads it too, so they wait instead of spinning; a resume's notification
wakes them at once (without LISTEN, behind PgBouncer, at their next poll).

A name is checked where it is typed: pausing a queue that nothing knows of (no job or drainer
names it, it has no row, and no handler or declaration of the app routes to it) is refused unless
``create`` (a typo would otherwise be a paused queue for ever). ``delete_queue`` removes the
row of a queue no job names, so a queue made by mistake can go.

``list_queues`` is every queue anything knows of: the jobs table, the queues table, the
drainers' rows and the app's own handlers and declarations. Per queue it gives the counts by
status (each up to ``observe.serving.COUNT_CAP``, completed up to ``COMPLETED_CAP``, so the read
is the same at any size; a queue with only completed jobs and nothing else is not listed), how
many jobs are due and the oldest one's age, the live drainers, whether it is paused, and whether
it is *unserved*: jobs have been due for longer than ``UNSERVED_AFTER`` and no live drainer is
active for it (``observe.serving``, the rule status and the metrics share).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import sql
from ..database import Database
from ..errors import InvalidJobOption
from ..observe.serving import COMPLETED_CAP, capped_counts, is_unserved, live_active
from ..outcome import iso
from ..sql.tables import jobs_channel
from .jobs import check_queue

__all__ = [
    "QueueDeletion",
    "QueueInfo",
    "QueueState",
    "Running",
    "delete_queue",
    "list_queues",
    "pause_queue",
    "queue_paused",
    "resume_queue",
    "wait_idle",
]


@dataclass(frozen=True)
class QueueState:
    """A queue after ``pause`` or ``resume``: whether it is paused now (since when), and
    whether this call changed that."""

    name: str
    paused: bool
    paused_at: datetime | None
    changed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.name,
            "paused": self.paused,
            "paused_at": iso(self.paused_at),
            "changed": self.changed,
        }


@dataclass(frozen=True)
class QueueDeletion:
    """A queue after ``delete``: whether its row went, and why not when it did not."""

    name: str
    deleted: bool
    was_paused: bool = False
    has_jobs: bool = False  # not deleted: jobs name the queue
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.name,
            "deleted": self.deleted,
            "was_paused": self.was_paused,
            "has_jobs": self.has_jobs,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class QueueInfo:
    """A queue as ``cronlock queue list`` shows it."""

    name: str
    paused: bool
    paused_at: datetime | None
    counts: dict[str, int] = field(default_factory=dict)
    counts_capped: tuple[str, ...] = ()  # statuses counted up to COUNT_CAP: at least that
    due: int = 0
    oldest_due_age_seconds: float | None = None
    active_drainers: int = 0
    standby_drainers: int = 0
    unserved: bool = False
    handled_here: bool = False  # this app has a handler or a declaration for the queue

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.name,
            "paused": self.paused,
            "paused_at": iso(self.paused_at),
            "counts": dict(self.counts),
            "counts_capped": list(self.counts_capped),
            "due": self.due,
            "oldest_due_age_seconds": self.oldest_due_age_seconds,
            "active_drainers": self.active_drainers,
            "standby_drainers": self.standby_drainers,
            "unserved": self.unserved,
            "handled_here": self.handled_here,
        }


async def _set(
    database: Database, name: str, *, pause: bool, known: Iterable[str] = (), create: bool = True
) -> QueueState:
    check_queue(name)
    async with database.engine.begin() as conn:
        if not create and name not in set(known):
            given = {"queue_name": name}
            has_row = (await conn.execute(sql.QUEUE_GET, given)).first() is not None
            if not has_row and not (await conn.execute(sql.QUEUE_IN_USE, given)).scalar_one():
                raise InvalidJobOption(
                    f"no queue {name!r}: no job or drainer names it, it was never paused and no "
                    "handler routes to it (a typo?); --create (create=True) pauses it anyway"
                )
        statement = sql.QUEUE_PAUSE if pause else sql.QUEUE_RESUME
        changed = (await conn.execute(statement, {"queue_name": name})).first() is not None
        if changed:
            channel = jobs_channel(database.schema)
            await conn.execute(sql.QUEUE_NOTIFY, {"channel": channel, "queue": name})
        row = (await conn.execute(sql.QUEUE_GET, {"queue_name": name})).mappings().first()
    paused_at = None if row is None else row["paused_at"]
    return QueueState(name, paused_at is not None, paused_at, changed)


async def pause_queue(
    database: Database, name: str, *, known: Iterable[str] = (), create: bool = True
) -> QueueState:
    """Pause ``name``: from the commit on, its drainers claim nothing (they finish what they
    hold). Pausing a paused queue changes nothing (``changed`` is False). Unless ``create``, a
    queue that is not in ``known`` (the app's queues), has no row and no jobs is refused
    (``InvalidJobOption``)."""
    return await _set(database, name, pause=True, known=known, create=create)


async def resume_queue(database: Database, name: str) -> QueueState:
    """Resume ``name``: its drainers claim again, woken at once by a notification."""
    return await _set(database, name, pause=False)


@dataclass(frozen=True)
class Running:
    """What still ran in a queue when ``wait_idle`` returned: lease-mode jobs processing and
    live drainers holding a job (or not heard from since the wait began). Falsy when idle."""

    processing: int
    drainers: int

    def __bool__(self) -> bool:
        return bool(self.processing or self.drainers)


async def wait_idle(
    database: Database, name: str, *, within: float, interval: float = 0.2
) -> Running:
    """Wait until nothing of queue ``name`` runs (pause it first, or it may never be), or
    ``within`` seconds: what still ran then (falsy when idle). A drainer counts as idle once
    it has beaten since the wait began with nothing in flight (within a heartbeat, 2 s)."""
    deadline = asyncio.get_running_loop().time() + within
    since = None
    while True:
        async with database.connect() as conn:
            row = (await conn.execute(sql.QUEUE_BUSY, {"queue": name, "since": since})).one()
        running = Running(row.processing, row.drainers)
        if since is not None and not running:
            return running
        since = since or row.now
        if asyncio.get_running_loop().time() >= deadline:
            return running
        await asyncio.sleep(interval)


async def delete_queue(database: Database, name: str) -> QueueDeletion:
    """Remove ``name``'s row (its pause with it) if no job names the queue."""
    check_queue(name)
    async with database.engine.begin() as conn:
        row = (await conn.execute(sql.QUEUE_DELETE, {"queue_name": name})).first()
        if row is not None:
            if row.paused_at is not None:  # its drainers claim again: wake them
                channel = jobs_channel(database.schema)
                await conn.execute(sql.QUEUE_NOTIFY, {"channel": channel, "queue": name})
            return QueueDeletion(name, True, was_paused=row.paused_at is not None)
        if (await conn.execute(sql.QUEUE_HAS_JOBS, {"queue_name": name})).scalar_one():
            detail = "jobs name it: delete them first (cronlock jobs delete --queue)"
            return QueueDeletion(name, False, has_jobs=True, detail=detail)
    return QueueDeletion(name, False, detail="no such queue row: nothing to delete")


async def queue_paused(database: Database, name: str) -> bool:
    """Whether ``name`` is paused now (one probe of the queues' primary key)."""
    async with database.connect() as conn:
        return bool((await conn.execute(sql.QUEUE_IS_PAUSED, {"queue": name})).scalar())


async def list_queues(database: Database, handled: Iterable[str] = ()) -> list[QueueInfo]:
    """Every queue known to the tables or in ``handled`` (the app's own queues), by name."""
    here = set(handled)
    async with database.connect() as conn:
        due = {row.queue: row for row in await conn.execute(sql.JOB_OLDEST_DUE)}
        paused = {row.name: row.paused_at for row in await conn.execute(sql.QUEUE_LIST)}
        drainers = (await conn.execute(sql.WORKER_LIST)).mappings().all()
        known = set(due) | set(paused) | {row["queue"] for row in drainers} | here
        counts, capped = await capped_counts(conn, known, completed_cap=COMPLETED_CAP)
    active = live_active(drainers)
    standby: dict[str, int] = {}
    for row in drainers:
        if row["alive"] and row["state"] == "standby":
            standby[row["queue"]] = standby.get(row["queue"], 0) + 1
    names = sorted(set(counts) | known)
    found = []
    for name in names:
        waiting = due.get(name)
        age = (
            None
            if waiting is None
            else round((waiting.now - waiting.oldest_due_at).total_seconds(), 3)
        )
        number = 0 if waiting is None else int(waiting.due)
        since = paused.get(name)
        found.append(
            QueueInfo(
                name=name,
                paused=since is not None,
                paused_at=since,
                counts=counts.get(name, {}),
                counts_capped=tuple(sorted(capped.get(name, ()))),
                due=number,
                oldest_due_age_seconds=age,
                active_drainers=active.get(name, 0),
                standby_drainers=standby.get(name, 0),
                unserved=is_unserved(
                    due=number,
                    oldest_due_age_seconds=age,
                    active_drainers=active.get(name, 0),
                    paused=since is not None,
                ),
                handled_here=name in here,
            )
        )
    return found
