"""Statements on ``workers``: a drainer's heartbeat row, its removal, and the list status reads.

The table only makes the drainers visible (the advisory locks decide who is active), and how
long a row counts as a live drainer is decided here, once: ``WORKER_LIST`` says ``alive`` for
``cronlock status`` and the Prometheus metrics alike.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Interval,
    Text,
    Uuid,
    bindparam,
    delete,
    func,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .tables import jobs, workers

__all__ = [
    "QUEUE_BUSY",
    "WORKER_ALIVE_WITHIN",
    "WORKER_DELETE",
    "WORKER_HEARTBEAT_SECONDS",
    "WORKER_LIST",
    "WORKER_PRUNE",
    "WORKER_PRUNE_COUNT",
    "WORKER_UPSERT",
]

# How often a drainer writes its row, unless told otherwise (Drainer(heartbeat_interval=)).
WORKER_HEARTBEAT_SECONDS = 2.0
# The liveness rule: a row whose last heartbeat is older than five beats belongs to a drainer
# that is gone (SIGKILLed, or its host died) and left its row behind, until WORKER_PRUNE.
WORKER_ALIVE_WITHIN = timedelta(seconds=5 * WORKER_HEARTBEAT_SECONDS)

_worker_values = {
    "queue": bindparam("queue", type_=Text),
    "state": bindparam("state", type_=Text),
    "host": bindparam("host", type_=Text),
    "pid": bindparam("pid", type_=Integer),
    "processed": bindparam("processed", type_=BigInteger),
    "failed": bindparam("failed", type_=BigInteger),
    "retried": bindparam("retried", type_=BigInteger),
    "in_flight": bindparam("in_flight", type_=Integer),
}
_worker_insert = pg_insert(workers).values(id=bindparam("id", type_=Uuid), **_worker_values)

# A worker's heartbeat: its row, created on first beat.
WORKER_UPSERT = _worker_insert.on_conflict_do_update(
    index_elements=[workers.c.id],
    set_={
        **{name: _worker_insert.excluded[name] for name in _worker_values},
        "heartbeat_at": func.now(),
    },
)

WORKER_DELETE = delete(workers).where(workers.c.id == bindparam("id", type_=Uuid))

# Rows of workers that stopped beating long ago (killed, or their host died).
WORKER_PRUNE = delete(workers).where(
    workers.c.heartbeat_at < func.now() - bindparam("older_than", type_=Interval)
)

# Retention's dry run: how many rows WORKER_PRUNE would delete.
WORKER_PRUNE_COUNT = select(func.count()).where(
    workers.c.heartbeat_at < func.now() - bindparam("older_than", type_=Interval)
)

# Every row, with the database's clock and whether the row is a live drainer (the rule above,
# read on the database's clock, which every host's heartbeats were written with).
WORKER_LIST = select(
    workers,
    func.now().label("now"),
    (
        workers.c.heartbeat_at
        > func.now() - bindparam("alive_within", WORKER_ALIVE_WITHIN, type_=Interval)
    ).label("alive"),
).order_by(workers.c.queue, workers.c.state, workers.c.started_at)


# What still runs in a queue (``queue pause --wait-idle``): its lease-mode jobs that are
# processing, and its live drainers that either hold a job (a transactional mode commits no
# processing row: its lanes' in_flight says) or have not beaten since ``since`` (the wait's
# start, by this clock: their in_flight may predate the pause). ``now`` is the next ``since``.
_queue = bindparam("queue", type_=Text)
QUEUE_BUSY = select(
    select(func.count())
    .select_from(jobs)
    .where(jobs.c.queue == _queue, jobs.c.status == "processing")
    .scalar_subquery()
    .label("processing"),
    select(func.count())
    .select_from(workers)
    .where(
        workers.c.queue == _queue,
        workers.c.heartbeat_at
        > func.now() - bindparam("alive_within", WORKER_ALIVE_WITHIN, type_=Interval),
        or_(
            workers.c.in_flight > 0,
            workers.c.heartbeat_at <= bindparam("since", type_=DateTime(timezone=True)),
        ),
    )
    .scalar_subquery()
    .label("drainers"),
    func.now().label("now"),
)
