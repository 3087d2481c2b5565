"""Statements on ``job_waits``: a wait for a job's end, registered before the waiter reads the
job (so the completion's trigger notifies it) and removed when the wait ends; and the jobs of
some waits, read again when notified (or at the safety poll).
"""

from __future__ import annotations

from sqlalchemy import DateTime, Uuid, any_, bindparam, delete, insert, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY

from .jobs import JOB_GET_COLUMNS
from .tables import job_waits, jobs

__all__ = [
    "WAIT_ADD",
    "WAIT_JOBS",
    "WAIT_JOBS_HELD",
    "WAIT_JOB_SETTLED",
    "WAIT_PRUNE",
    "WAIT_REMOVE",
]

WAIT_ADD = insert(job_waits).values(
    id=bindparam("id", type_=Uuid), job_id=bindparam("job_id", type_=Uuid)
)
WAIT_REMOVE = delete(job_waits).where(job_waits.c.id == bindparam("id", type_=Uuid))
# The rows of the jobs :ids (those that still exist), as JOB_GET gives one.
WAIT_JOBS = select(*JOB_GET_COLUMNS).where(jobs.c.id == any_(bindparam("ids", type_=ARRAY(Uuid))))
# The same rows, each with ``held``: a transaction has updated or locked the version read (its
# xmax is set), so it may be a completion in flight whose trigger ran before the wait's row
# committed. xmax is the tuple's own field, not the snapshot's: 0 means no one has touched
# this version, and any completion to come finds the wait's row and notifies it.
WAIT_JOBS_HELD = WAIT_JOBS.add_columns(literal_column("xmax::text <> '0'").label("held"))
# The same rows once no transaction holds them: FOR SHARE waits (under the caller's
# lock_timeout) for a completion that has updated a row but not yet committed, and reads what
# its commit left. Only for a held row: a lock on a waiting job's row would make a claim's SKIP
# LOCKED pass it by (a one-shot drain would end without it).
WAIT_JOB_SETTLED = WAIT_JOBS.with_for_update(read=True, of=jobs)
# Waits older than :before: their waiter died without removing them (retention).
WAIT_PRUNE = delete(job_waits).where(
    job_waits.c.created_at < bindparam("before", type_=DateTime(timezone=True))
)
