"""Statements on ``cancel_requests``: an operator's request to cancel a running job, the
notification that tells the drainers, and what a drainer reads of it.

None of them touches the job's own row, which the lane running the job holds locked (in the
transactional commit modes) for as long as its handler runs.
"""

from __future__ import annotations

from sqlalchemy import Text, Uuid, any_, bindparam, cast, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .tables import cancel_requests

__all__ = ["CANCEL_FORGET", "CANCEL_NOTIFY", "CANCEL_PRUNE", "CANCEL_REQUEST", "CANCEL_REQUESTED"]

_ids = bindparam("ids", type_=ARRAY(Uuid))

_asked = func.unnest(_ids).table_valued("job_id").render_derived()

# Ask to cancel the running jobs :ids: idempotent (a second request keeps the first one's time).
CANCEL_REQUEST = (
    pg_insert(cancel_requests)
    .from_select(["job_id"], select(cast(_asked.c.job_id, Uuid)))
    .on_conflict_do_nothing(index_elements=[cancel_requests.c.job_id])
)

# Tells every drainer listening on the schema's cancel channel (sql.tables.cancel_channel) of
# :ids, one notification each (the payload is the job id), delivered at the request's commit.
CANCEL_NOTIFY = select(
    func.pg_notify(bindparam("channel", type_=Text), cast(_asked.c.job_id, Text))
).select_from(_asked)

# Which of a drainer's running jobs (:ids) an operator asked to cancel: its poll, for what the
# notification did not reach (no LISTEN behind PgBouncer, or in a one-off drain).
CANCEL_REQUESTED = select(cancel_requests.c.job_id).where(cancel_requests.c.job_id == any_(_ids))

# A settled request (the job ended, however), or an operator's retry of the job: forgotten.
CANCEL_FORGET = delete(cancel_requests).where(cancel_requests.c.job_id == any_(_ids))

# Retention: requests older than :before (their job ended long ago, or is gone).
CANCEL_PRUNE = delete(cancel_requests).where(
    cancel_requests.c.requested_at < bindparam("before", type_=cancel_requests.c.requested_at.type)
)
