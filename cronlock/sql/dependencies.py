"""Statements of an enqueue with ``depends_on``: the parents' locks and their statuses.

The edges and the jobs are written by ``JOB_INSERT_DEPENDENT`` (``jobs``); they are settled by
the ``jobs_released`` trigger (``tables``). Its comment says why the enqueue locks first.
"""

from __future__ import annotations

from sqlalchemy import Text, Uuid, any_, bindparam, cast, column, func, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY

from .tables import DEPENDENCY_BUCKETS, DEPENDENCY_NAMESPACE, jobs

__all__ = ["DEPENDENCY_LOCK", "DEPENDENCY_PARENTS"]

_parents = bindparam("parents", type_=ARRAY(Uuid))
_given = func.unnest(_parents).table_valued(column("id", Uuid)).render_derived(name="given")
# The parent's bucket as the trigger computes it (hashtext of the id's text, masked).
_bucket = func.hashtext(cast(_given.c.id, Text)).op("&")(literal_column(str(DEPENDENCY_BUCKETS)))
_buckets = (
    select(_bucket.label("bucket"))
    .distinct()
    .order_by(literal_column("bucket"))
    .subquery("buckets")
)

# Lock the buckets of :parents exclusively, in order (so two enqueues never wait on each other
# in a cycle), until the enqueue's transaction ends: a parent's end waits in its trigger until
# this enqueue's edges are committed, and this waits for a parent's end whose trigger ran but
# whose transaction has not committed. One row: how many buckets.
DEPENDENCY_LOCK = select(
    func.count(
        func.pg_advisory_xact_lock(literal_column(str(DEPENDENCY_NAMESPACE)), _buckets.c.bucket)
    )
).select_from(_buckets)

# The status of each of :parents that exists, read after DEPENDENCY_LOCK (a new statement, so
# in READ COMMITTED it sees every end committed before the lock was granted).
DEPENDENCY_PARENTS = select(jobs.c.id, jobs.c.status).where(jobs.c.id == any_(_parents))
