"""Statements on ``queues``: pausing and resuming a queue, the notification that wakes its
drainers, and the predicate the claim reads.

A queue has a row here once an operator paused or resumed it; ``paused_at`` is NULL while it is
not paused; ``QUEUE_DELETE`` removes the row of a queue no job names. The claim
(``sql.JOB_CLAIM``) and the idle drainer's look at the next due job (``sql.JOB_NEXT_DUE``) read
``QUEUE_PAUSED_NOW``, so a pause holds for every drainer on every host from the commit on; the
notification only wakes idle drainers at once on a resume.
"""

from __future__ import annotations

from sqlalchemy import Text, bindparam, delete, exists, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .tables import jobs, queues, workers

__all__ = [
    "QUEUE_DELETE",
    "QUEUE_GET",
    "QUEUE_HAS_JOBS",
    "QUEUE_IN_USE",
    "QUEUE_IS_PAUSED",
    "QUEUE_LIST",
    "QUEUE_NOTIFY",
    "QUEUE_PAUSE",
    "QUEUE_PAUSED_NOW",
    "QUEUE_RESUME",
]

_name = bindparam("queue_name", type_=Text)

# Whether the claim's queue (the drainer's :queue) is paused: one probe of the primary key.
QUEUE_PAUSED_NOW = exists().where(
    queues.c.name == bindparam("queue", type_=Text), queues.c.paused_at.is_not(None)
)

QUEUE_IS_PAUSED = select(QUEUE_PAUSED_NOW)

_pause = pg_insert(queues).values(name=_name, paused_at=func.now())
# Pause: a row is returned only when this call paused the queue (not when it already was).
QUEUE_PAUSE = _pause.on_conflict_do_update(
    index_elements=[queues.c.name],
    set_={"paused_at": func.now(), "updated_at": func.now()},
    where=queues.c.paused_at.is_(None),
).returning(queues.c.name, queues.c.paused_at)

# Resume: a row is returned only when the queue was paused.
QUEUE_RESUME = (
    update(queues)
    .where(queues.c.name == _name, queues.c.paused_at.is_not(None))
    .values(paused_at=None, updated_at=func.now())
    .returning(queues.c.name)
)

QUEUE_GET = select(queues).where(queues.c.name == _name)

# Whether any job (in any status) names the queue: the first row found ends the scan; a
# queue no job names scans the table once (an operator's command, not a hot path).
QUEUE_HAS_JOBS = select(exists().where(jobs.c.queue == _name))

# Whether anything names the queue: a job, or a drainer's row (a worker of another app).
QUEUE_IN_USE = select(
    or_(exists().where(jobs.c.queue == _name), exists().where(workers.c.queue == _name))
)

# Delete a queue's row only while no job names it, in one statement (an enqueue needs no row:
# nothing waits on it).
QUEUE_DELETE = (
    delete(queues)
    .where(queues.c.name == _name, ~exists().where(jobs.c.queue == _name))
    .returning(queues.c.name, queues.c.paused_at)
)

QUEUE_LIST = select(queues).order_by(queues.c.name)

# Wakes the queue's idle drainers (the payload is the queue name, as the jobs trigger sends),
# delivered at commit. :channel is sql.tables.jobs_channel(schema).
QUEUE_NOTIFY = select(
    func.pg_notify(bindparam("channel", type_=Text), bindparam("queue", type_=Text))
)
