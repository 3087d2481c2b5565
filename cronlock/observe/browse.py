"""Browsing jobs a page at a time, on an index whatever the table's size: the dashboard's list.

``App.list_jobs`` (``GET /jobs``, ``cronlock jobs list``) orders any filter by creation time,
which on a large table sorts it. The dashboard instead shows one status at a time, each in the
order its index keeps: the jobs that did not complete (any such status, or one) newest first,
merged from each (queue, status) range of ``ix_jobs_open``; completed jobs most recently
completed first, a backward range of ``ix_jobs_finished``. A page's cursor is the keyset
position of its last job in that order.
"""

from __future__ import annotations

from dataclasses import replace

from .. import sql
from ..database import Database
from ..errors import InvalidJobOption
from ..outcome import JobStatus
from ..queue.operate import JobFilter, JobInfo, JobPage, decode_cursor, encode_cursor

__all__ = ["browse_jobs"]


async def browse_jobs(
    database: Database, where: JobFilter, *, limit: int = 50, cursor: str | None = None
) -> JobPage:
    """A page of the jobs ``where`` matches, of one status or none (any but completed), in
    the order described above."""
    if len(where.statuses) > 1:
        raise InvalidJobOption("the dashboard's list shows one status at a time")
    status = where.statuses[0] if where.statuses else None
    queue = where.queue
    # The status and the queue are bound by the page's own statement (its index leads with
    # them), not by the filter's conditions.
    conditions, params = replace(where, status=None, queue=None).where()
    after = cursor is not None
    completed = status is JobStatus.COMPLETED
    if completed:
        statement = sql.job_completed_page(conditions, queue=queue is not None, after=after)
        key = "after_completed_at"
    else:
        statement = sql.job_open_page(
            conditions, queue=queue is not None, status=status is not None, after=after
        )
        key = "after_created_at"
        if status is not None:
            params["status"] = status.value
    if queue is not None:
        params["queue"] = queue
    if cursor is not None:
        params[key], params["after_id"] = decode_cursor(cursor)
    async with database.connect() as conn:
        rows = (await conn.execute(statement, {**params, "limit": limit + 1})).mappings().all()
    found = tuple(JobInfo.from_row(row) for row in rows[:limit])
    if len(rows) <= limit or not found:
        return JobPage(found, None)
    last = found[-1]
    moment = last.completed_at if completed else last.created_at
    assert moment is not None
    return JobPage(found, encode_cursor(moment, last.id))
