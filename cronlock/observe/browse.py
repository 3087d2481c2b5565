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
from datetime import datetime

from .. import sql
from ..database import Database
from ..errors import InvalidJobOption
from ..outcome import JobStatus
from ..queue.operate import JobFilter, JobInfo, JobPage, decode_cursor, encode_cursor

__all__ = ["OPEN", "browse_jobs"]

# The dashboard's "status" for every job but a completed one.
OPEN = ""


async def browse_jobs(
    database: Database,
    *,
    status: str = OPEN,
    queue: str | None = None,
    job_type: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> JobPage:
    """A page of jobs of ``status`` (``OPEN``: any but completed), of one queue and type,
    created in [created_after, created_before), in the order described above."""
    if status != OPEN:
        try:
            status = JobStatus(status).value
        except ValueError:
            known = ", ".join(s.value for s in JobStatus)
            raise InvalidJobOption(f"unknown job status {status!r} (one of {known})") from None
    # The queue is checked here and bound by the page's own statement (its index leads with
    # it), not by the filter's conditions.
    checked = JobFilter(
        queue=queue,
        job_type=job_type,
        created_after=created_after,
        created_before=created_before,
    )
    conditions, params = replace(checked, queue=None).where()
    after = cursor is not None
    completed = status == JobStatus.COMPLETED.value
    if completed:
        statement = sql.job_completed_page(conditions, queue=queue is not None, after=after)
        key = "after_completed_at"
    else:
        statement = sql.job_open_page(
            conditions, queue=queue is not None, status=status != OPEN, after=after
        )
        key = "after_created_at"
        if status != OPEN:
            params["status"] = status
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
