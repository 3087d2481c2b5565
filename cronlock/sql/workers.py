"""Statements on ``workers``: a drainer's heartbeat row, its removal, and the list status reads."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, Interval, Text, Uuid, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .tables import workers

__all__ = ["WORKER_DELETE", "WORKER_LIST", "WORKER_PRUNE", "WORKER_UPSERT"]

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

WORKER_LIST = select(workers, func.now().label("now")).order_by(
    workers.c.queue, workers.c.state, workers.c.started_at
)
