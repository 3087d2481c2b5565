"""Operating the queue: find jobs, and retry, cancel or delete them, one by id or all that match.

What an operator asks after "is it running?": which jobs failed and why (``get_job``,
``list_jobs``: newest first, filtered by status, queue, type and creation time, a page at a
time with a keyset cursor), run one again (``retry``: a failed job gets one more attempt, a
retrying one is due now, the error history stays), stop one before it runs (``cancel``: a
waiting job becomes ``cancelled`` and never runs) and clear the finished ones (``delete``).

Each verb returns what it changed, as a value: a ``JobChange`` for one job, a ``JobsChanged``
for a filter, with the jobs it left alone counted by why (``ChangeOutcome``). None waits on a
drainer: the statements lock with ``FOR UPDATE SKIP LOCKED`` (``sql/jobs.py`` says why), so a
job a lane is running right now — in the transactional commit modes, a waiting row its lane's
transaction holds — is reported ``running`` and not changed by these statements; cancelling
a running job cooperatively is ``cancel.py``'s, on top of them. A change by filter walks the
matching jobs in id order in bounded batches, each its own short transaction, so it never
holds many locks for long.
"""

from __future__ import annotations

import base64
import binascii
import enum
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from .. import sql
from ..database import Database
from ..errors import InvalidJobOption
from ..outcome import (
    JOB_CANCELLABLE_STATUSES,
    JOB_FINISHED_STATUSES,
    JOB_RETRYABLE_STATUSES,
    JOB_WAITING_STATUSES,
    JobStatus,
)
from ..sql.tables import cancel_channel
from .jobs import check_job_type, check_queue

__all__ = [
    "BULK_BATCH_SIZE",
    "MAX_PAGE_SIZE",
    "ChangeOutcome",
    "JobChange",
    "JobFilter",
    "JobInfo",
    "JobPage",
    "JobsChanged",
    "Verb",
    "change_job",
    "change_jobs",
    "count_jobs",
    "decode_cursor",
    "encode_cursor",
    "get_job",
    "job_id_of",
    "list_jobs",
]

# Jobs per transaction of a change by filter: a few milliseconds of row locks at a time.
BULK_BATCH_SIZE = 500
MAX_PAGE_SIZE = 1000
_NIL = uuid.UUID(int=0)


class ChangeOutcome(enum.StrEnum):
    """What an operator's verb did to one job, or why it left it alone."""

    RETRIED = "retried"
    CANCELLED = "cancelled"
    DELETED = "deleted"
    RUNNING = "running"  # a drainer holds it right now: not changed
    CANCEL_REQUESTED = "cancel_requested"  # running: its drainer was asked to stop it
    COMPLETED = "completed"  # cancel: it completed before the cancel reached it
    BUSY = "busy"  # another operator's change holds it right now: not changed
    WRONG_STATUS = "wrong_status"  # its status does not allow this verb (the detail says)
    DEDUP_KEY_HELD = "dedup_key_held"  # retry: another waiting job holds its dedup key
    NOT_FOUND = "not_found"


class Verb(enum.StrEnum):
    RETRY = "retry"
    CANCEL = "cancel"
    DELETE = "delete"


@dataclass(frozen=True)
class _VerbRule:
    statuses: tuple[JobStatus, ...]  # the statuses it acts on
    done: ChangeOutcome
    status_after: JobStatus | None
    # The statement, looked up when a verb runs: importing this module (every App does)
    # must not build the jobs' statements (cronlock.sql, issue 26).
    statement: Callable[[], Executable]
    wrong: str  # why another status is left alone


_RULES = {
    Verb.RETRY: _VerbRule(
        JOB_RETRYABLE_STATUSES,
        ChangeOutcome.RETRIED,
        JobStatus.RETRYING,
        lambda: sql.JOB_RETRY,
        "only a failed job, or a retrying one not yet due, is retried",
    ),
    Verb.CANCEL: _VerbRule(
        JOB_CANCELLABLE_STATUSES,
        ChangeOutcome.CANCELLED,
        JobStatus.CANCELLED,
        lambda: sql.JOB_CANCEL,
        "only a waiting job (pending, retrying or blocked) is cancelled",
    ),
    Verb.DELETE: _VerbRule(
        JOB_FINISHED_STATUSES,
        ChangeOutcome.DELETED,
        None,
        lambda: sql.JOB_DELETE,
        "only a finished job (completed, failed or cancelled) is deleted: cancel it first",
    ),
}


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


@dataclass(frozen=True)
class JobInfo:
    """A job as its row has it (``SELECT * FROM cronlock.jobs`` is the whole truth)."""

    id: uuid.UUID
    job_type: str
    queue: str
    status: JobStatus
    priority: int
    payload: Any
    result: Any
    retry_count: int
    max_retries: int
    error_message: str | None
    error_history: list[dict[str, Any]]
    dedup_key: str | None
    created_at: datetime
    run_at: datetime
    next_retry_at: datetime | None
    started_at: datetime | None
    completed_at: datetime | None
    # An operator's cancel of the running job, not settled yet (cancel.py).
    cancel_requested_at: datetime | None = None
    # The jobs it was enqueued to follow (depends_on), and how many have not completed yet.
    depends_on: tuple[uuid.UUID, ...] = ()
    parents_left: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobInfo:
        return cls(
            id=uuid.UUID(str(row["id"])),
            job_type=row["job_type"],
            queue=row["queue"],
            status=JobStatus(row["status"]),
            priority=row["priority"],
            payload=row["payload"],
            result=row["result"],
            retry_count=row["retry_count"],
            max_retries=row["max_retries"],
            error_message=row["error_message"],
            error_history=list(row["error_history"] or []),
            dedup_key=row["dedup_key"],
            created_at=row["created_at"],
            run_at=row["run_at"],
            next_retry_at=row["next_retry_at"],
            started_at=row["started_at"],
            completed_at=row["completed_at"],
            cancel_requested_at=row.get("cancel_requested_at"),
            depends_on=tuple(uuid.UUID(str(p)) for p in row.get("depends_on") or ()),
            parents_left=row.get("parents_left"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "job_type": self.job_type,
            "queue": self.queue,
            "status": self.status.value,
            "priority": self.priority,
            "payload": self.payload,
            "result": self.result,
            "retry_count": self.retry_count,
            "max_retries": self.max_retries,
            "error_message": self.error_message,
            "error_history": self.error_history,
            "dedup_key": self.dedup_key,
            "created_at": _iso(self.created_at),
            "run_at": _iso(self.run_at),
            "next_retry_at": _iso(self.next_retry_at),
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
            "cancel_requested_at": _iso(self.cancel_requested_at),
            "depends_on": [str(parent) for parent in self.depends_on],
            "parents_left": self.parents_left,
        }


@dataclass(frozen=True)
class JobPage:
    """One page of ``list_jobs``: the jobs, newest first, and the cursor of the next page
    (None on the last)."""

    jobs: tuple[JobInfo, ...]
    next_cursor: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": [job.to_dict() for job in self.jobs], "next_cursor": self.next_cursor}


@dataclass(frozen=True)
class JobChange:
    """What a verb did to one job: ``outcome``, the job's ``status`` now (None: it does not
    exist, or no longer), and a line saying so."""

    job_id: uuid.UUID
    outcome: ChangeOutcome
    status: JobStatus | None
    detail: str

    @property
    def changed(self) -> bool:
        return self.outcome in (
            ChangeOutcome.RETRIED,
            ChangeOutcome.CANCELLED,
            ChangeOutcome.DELETED,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.job_id),
            "outcome": self.outcome.value,
            "changed": self.changed,
            "status": None if self.status is None else self.status.value,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class JobsChanged:
    """What a verb did to the jobs of a filter: how many matched, how many it changed, and
    the ones it left alone by why (``running``, ``dedup_key_held``, …)."""

    verb: Verb
    matched: int
    changed: int
    unchanged: Mapping[ChangeOutcome, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verb": self.verb.value,
            "matched": self.matched,
            "changed": self.changed,
            "unchanged": {outcome.value: n for outcome, n in sorted(self.unchanged.items())},
        }


@dataclass(frozen=True)
class JobFilter:
    """Which jobs the operator verbs act on (``App.list_jobs``, ``count_jobs``, ``retry_jobs``,
    ``cancel_jobs``, ``delete_jobs``): of any of ``status`` (one, several, or None: any), of
    one ``queue``, of one ``job_type``, created in [``created_after``, ``created_before``).
    Checked when made: an unknown status, a naive datetime or a bad name is an
    ``InvalidJobOption``. ``statuses`` is ``status`` read as ``JobStatus`` values."""

    status: JobStatus | str | Iterable[JobStatus | str] | None = None
    queue: str | None = None
    job_type: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    statuses: tuple[JobStatus, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        status = self.status
        given = [] if status is None else [status] if isinstance(status, str) else list(status)
        statuses = []
        for value in given:
            try:
                statuses.append(JobStatus(value))
            except ValueError:
                known = ", ".join(s.value for s in JobStatus)
                raise InvalidJobOption(f"unknown job status {value!r} (one of {known})") from None
        for name, moment in (
            ("created_after", self.created_after),
            ("created_before", self.created_before),
        ):
            if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
                raise InvalidJobOption(f"{name} must be a timezone-aware datetime")
        if self.job_type is not None:
            check_job_type(self.job_type)
        if self.queue is not None:
            check_queue(self.queue)
        # Frozen: the checked values are set once, here (a status as given stays a tuple).
        object.__setattr__(self, "statuses", tuple(dict.fromkeys(statuses)))
        object.__setattr__(self, "status", self.statuses or None)

    def for_verb(self, verb: Verb) -> JobFilter:
        """This filter narrowed to the statuses ``verb`` acts on; a status it never acts on
        is an error, not an empty match."""
        allowed = _RULES[verb].statuses
        wrong = [s.value for s in self.statuses if s not in allowed]
        if wrong:
            raise InvalidJobOption(
                f"{verb.value} acts on {', '.join(s.value for s in allowed)} jobs, "
                f"not {', '.join(wrong)}"
            )
        return replace(self, status=self.statuses or allowed)

    def where(self) -> tuple[list[Any], dict[str, Any]]:
        """The statement's conditions (by the filter's shape) and their bound values."""
        finished = bool(self.statuses) and all(s in JOB_FINISHED_STATUSES for s in self.statuses)
        conditions = sql.job_where(
            statuses=bool(self.statuses),
            finished=finished,
            queue=self.queue is not None,
            job_type=self.job_type is not None,
            created_after=self.created_after is not None,
            created_before=self.created_before is not None,
        )
        params: dict[str, Any] = {
            "statuses": [s.value for s in self.statuses],
            "queue": self.queue,
            "job_type": self.job_type,
            "created_after": self.created_after,
            "created_before": self.created_before,
        }
        return conditions, {k: v for k, v in params.items() if v is not None and v != []}


# -- reading --------------------------------------------------------------------------------


async def get_job(database: Database, job_id: uuid.UUID | str) -> JobInfo | None:
    """The job, or None when there is none with that id."""
    async with database.connect() as conn:
        row = (await conn.execute(sql.JOB_GET, {"id": job_id_of(job_id)})).mappings().first()
    return None if row is None else JobInfo.from_row(row)


def encode_cursor(moment: datetime, job_id: uuid.UUID) -> str:
    """A keyset position (a time and a job id) as an opaque cursor (``list_jobs`` and the
    dashboard's lists)."""
    raw = f"{moment.isoformat()}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position an ``encode_cursor`` cursor holds; InvalidJobOption for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, _, job_id = raw.partition("|")
        position = datetime.fromisoformat(moment), uuid.UUID(job_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidJobOption(f"not a cursor of a jobs list: {cursor[:80]!r}") from None
    if position[0].tzinfo is None:
        raise InvalidJobOption(f"not a cursor of a jobs list: {cursor[:80]!r}")
    return position


async def list_jobs(
    database: Database, where: JobFilter, *, limit: int = 50, cursor: str | None = None
) -> JobPage:
    """A page of the jobs ``where`` matches, newest first; ``cursor`` (a page's
    ``next_cursor``) continues after that page, also while jobs are added or removed."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidJobOption(f"limit must be between 1 and {MAX_PAGE_SIZE}, not {limit!r}")
    conditions, params = where.where()
    if cursor is not None:
        params["after_created_at"], params["after_id"] = decode_cursor(cursor)
    statement = sql.job_list(conditions, after=cursor is not None)
    async with database.connect() as conn:
        rows = (await conn.execute(statement, {**params, "limit": limit + 1})).mappings().all()
    found = tuple(JobInfo.from_row(row) for row in rows[:limit])
    more = len(rows) > limit
    return JobPage(
        found, encode_cursor(found[-1].created_at, found[-1].id) if more and found else None
    )


async def count_jobs(database: Database, where: JobFilter, verb: Verb | None = None) -> int:
    """How many jobs ``where`` matches (narrowed to what ``verb`` acts on, if given)."""
    if verb is not None:
        where = where.for_verb(verb)
    conditions, params = where.where()
    async with database.connect() as conn:
        return int((await conn.execute(sql.job_count(conditions), params)).scalar_one())


# -- changing -------------------------------------------------------------------------------


def job_id_of(job_id: uuid.UUID | str) -> uuid.UUID:
    if isinstance(job_id, uuid.UUID):
        return job_id
    try:
        return uuid.UUID(str(job_id))
    except ValueError:
        raise InvalidJobOption(f"not a job id: {str(job_id)[:80]!r}") from None


def _why(verb: Verb, job_id: uuid.UUID, row: Mapping[Any, Any] | None) -> JobChange:
    """Why ``verb`` left a job alone, from its row as the same transaction now sees it."""
    rule = _RULES[verb]
    if row is None:
        return JobChange(job_id, ChangeOutcome.NOT_FOUND, None, f"no job {job_id}")
    status = JobStatus(row["status"])
    if status is JobStatus.PROCESSING:
        return JobChange(job_id, ChangeOutcome.RUNNING, status, "running now: not changed")
    if status not in rule.statuses:
        detail = f"{status.value}: {rule.wrong}"
        return JobChange(job_id, ChangeOutcome.WRONG_STATUS, status, detail)
    if verb is Verb.RETRY and status is JobStatus.RETRYING and row["due"]:
        # Due already: a drainer runs it next (and may hold it right now).
        detail = "retrying and already due: a drainer runs it next"
        return JobChange(job_id, ChangeOutcome.WRONG_STATUS, status, detail)
    if verb is Verb.RETRY and row["dedup_held"]:
        detail = "another waiting job holds its dedup key: not retried"
        return JobChange(job_id, ChangeOutcome.DEDUP_KEY_HELD, status, detail)
    if status in JOB_WAITING_STATUSES:
        # The statement skipped its lock: in the transactional commit modes a waiting job is
        # locked by the lane running it, for as long as its handler runs.
        detail = f"running now: a drainer holds it, not {rule.done.value}"
        return JobChange(job_id, ChangeOutcome.RUNNING, status, detail)
    return JobChange(job_id, ChangeOutcome.BUSY, status, "another change holds it: try again")


async def _apply(
    conn: AsyncConnection, verb: Verb, ids: Sequence[uuid.UUID]
) -> tuple[set[uuid.UUID], list[JobChange]]:
    """``verb`` on ``ids`` in the caller's transaction: the ids changed, and why the others
    were not."""
    rule = _RULES[verb]
    changed = {uuid.UUID(str(row[0])) for row in await conn.execute(rule.statement(), {"ids": ids})}
    if verb is Verb.RETRY and changed:
        # A cancel request left from an earlier attempt must not stop the one retried now.
        await conn.execute(sql.CANCEL_FORGET, {"ids": list(changed)})
    left = [job_id for job_id in ids if job_id not in changed]
    if not left:
        return changed, []
    rows = (await conn.execute(sql.JOB_STATES, {"ids": left})).mappings().all()
    states = {uuid.UUID(str(row["id"])): row for row in rows}
    return changed, [_why(verb, job_id, states.get(job_id)) for job_id in left]


def _is_dedup_conflict(exc: IntegrityError) -> bool:
    return "uq_jobs_dedup_key" in str(exc.orig)


async def change_job(database: Database, verb: Verb, job_id: uuid.UUID | str) -> JobChange:
    """``verb`` on one job, in one short transaction: what it did, or why not."""
    target = job_id_of(job_id)
    rule = _RULES[verb]
    try:
        async with database.engine.begin() as conn:
            changed, others = await _apply(conn, verb, [target])
    except IntegrityError as exc:
        # A job with its dedup key was enqueued between the retry's check and its write.
        if not _is_dedup_conflict(exc):
            raise
        detail = "another waiting job holds its dedup key: not retried"
        return JobChange(target, ChangeOutcome.DEDUP_KEY_HELD, None, detail)
    if changed:
        detail = f"{rule.done.value}" + (
            ": due now, its history kept" if verb is Verb.RETRY else ""
        )
        return JobChange(target, rule.done, rule.status_after, detail)
    return others[0]


async def _ask_to_cancel(
    conn: AsyncConnection, schema: str, others: list[JobChange]
) -> list[JobChange]:
    """A cancel by filter asks the drainers to stop the matching jobs they run now (cancel.py
    says how), without waiting for them: each is reported ``cancel_requested``."""
    running = [change.job_id for change in others if change.outcome is ChangeOutcome.RUNNING]
    if not running:
        return others
    channel = cancel_channel(schema)
    await conn.execute(sql.CANCEL_REQUEST, {"ids": running})
    await conn.execute(sql.CANCEL_NOTIFY, {"ids": running, "channel": channel})
    detail = "running: its drainer was asked to stop it"
    return [
        JobChange(c.job_id, ChangeOutcome.CANCEL_REQUESTED, c.status, detail)
        if c.outcome is ChangeOutcome.RUNNING
        else c
        for c in others
    ]


async def change_jobs(
    database: Database, verb: Verb, where: JobFilter, *, batch_size: int = BULK_BATCH_SIZE
) -> JobsChanged:
    """``verb`` on every job ``where`` matches (narrowed to the statuses it acts on), in id
    order, ``batch_size`` jobs per transaction."""
    where = where.for_verb(verb)
    conditions, params = where.where()
    candidates = sql.job_candidates(conditions)
    after, matched, changed = _NIL, 0, 0
    unchanged: dict[ChangeOutcome, int] = {}
    while True:
        async with database.engine.begin() as conn:
            batch = {**params, "after_id": after, "limit": batch_size}
            found = await conn.execute(candidates, batch)
            ids = [uuid.UUID(str(row[0])) for row in found]
            if not ids:
                break
            try:
                async with conn.begin_nested():
                    done, others = await _apply(conn, verb, ids)
            except IntegrityError as exc:
                if not _is_dedup_conflict(exc):
                    raise
                # Two jobs of the batch share a dedup key, or one was enqueued meanwhile:
                # one at a time, each conflict reported on its own.
                done, others = set(), []
                for job_id in ids:
                    try:
                        async with conn.begin_nested():
                            one, why = await _apply(conn, verb, [job_id])
                    except IntegrityError as again:
                        if not _is_dedup_conflict(again):
                            raise
                        why = [_why(verb, job_id, {"status": "failed", "dedup_held": True})]
                        one = set()
                    done |= one
                    others += why
            if verb is Verb.CANCEL:
                others = await _ask_to_cancel(conn, database.schema, others)
        matched += len(ids)
        changed += len(done)
        for change in others:
            unchanged[change.outcome] = unchanged.get(change.outcome, 0) + 1
        after = ids[-1]
        if len(ids) < batch_size:
            break
    return JobsChanged(verb, matched, changed, unchanged)
