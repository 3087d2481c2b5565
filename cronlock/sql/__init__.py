"""Every SQL statement cronlock issues, named, parameterised, in one place: this package.

Statements are SQLAlchemy Core built from the tables (``tables.py``), one module per table
(``jobs``, ``runs``, ``workers``) plus the advisory locks (``locks``), the item savepoints'
verbs (``savepoints``), alembic's version table (``migrations``), histogram buckets computed
in SQL (``histograms``) and ``cronlock bench``'s own (``bench``). Values are bound parameters
and the schema is applied by ``schema_translate_map``, so nothing from input is ever formatted
into SQL. Names put the noun first so related statements sort together; every statement is
re-exported here, so code reads ``sql.JOB_CLAIM``.
"""

from __future__ import annotations

from .histograms import LATENCY_BUCKETS
from .jobs import (
    JOB_BY_DEDUP_KEY,
    JOB_CLAIM,
    JOB_COMPLETE_MANY,
    JOB_COMPLETE_ONE,
    JOB_COUNTS,
    JOB_FINISH_MANY,
    JOB_GET,
    JOB_INSERT_MANY,
    JOB_INSERT_ONE,
    JOB_NEXT_DUE,
    JOB_OLDEST_DUE,
    JOB_RATES,
    JOB_RECENT_FAILURES,
    JOB_TOTALS,
)
from .locks import (
    KEEPALIVE_SETTINGS,
    LOCK_HOLDERS,
    LOCK_TRY_XACT,
    LOCK_XACT,
    NO_TIMEOUTS_LOCAL,
    PING,
)
from .migrations import SCHEMA_REVISION
from .runs import (
    RUN_CLAIMING_RECENT_PER_TASK,
    RUN_INSERT,
    RUN_INSERT_MISSED,
    RUN_LAST_SLOT,
    RUN_LAST_SLOT_PER_TASK,
    RUN_LAST_SUCCESS_PER_TASK,
    RUN_RECENT,
    RUN_RECENT_PER_TASK,
    RUN_SLOT_CLAIMED,
    RUN_SLOTS_RECORDED,
    RUN_TOTALS,
)
from .savepoints import ITEM_RELEASE, ITEM_RELEASE_AND_SAVEPOINT, ITEM_ROLLBACK, ITEM_SAVEPOINT
from .workers import (
    WORKER_ALIVE_WITHIN,
    WORKER_DELETE,
    WORKER_HEARTBEAT_SECONDS,
    WORKER_LIST,
    WORKER_PRUNE,
    WORKER_UPSERT,
)

__all__ = [
    "ITEM_RELEASE",
    "ITEM_RELEASE_AND_SAVEPOINT",
    "ITEM_ROLLBACK",
    "ITEM_SAVEPOINT",
    "JOB_BY_DEDUP_KEY",
    "JOB_CLAIM",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_ONE",
    "JOB_COUNTS",
    "JOB_FINISH_MANY",
    "JOB_GET",
    "JOB_INSERT_MANY",
    "JOB_INSERT_ONE",
    "JOB_NEXT_DUE",
    "JOB_OLDEST_DUE",
    "JOB_RATES",
    "JOB_RECENT_FAILURES",
    "JOB_TOTALS",
    "KEEPALIVE_SETTINGS",
    "LATENCY_BUCKETS",
    "LOCK_HOLDERS",
    "LOCK_TRY_XACT",
    "LOCK_XACT",
    "NO_TIMEOUTS_LOCAL",
    "PING",
    "RUN_CLAIMING_RECENT_PER_TASK",
    "RUN_INSERT",
    "RUN_INSERT_MISSED",
    "RUN_LAST_SLOT",
    "RUN_LAST_SLOT_PER_TASK",
    "RUN_LAST_SUCCESS_PER_TASK",
    "RUN_RECENT",
    "RUN_RECENT_PER_TASK",
    "RUN_SLOTS_RECORDED",
    "RUN_SLOT_CLAIMED",
    "RUN_TOTALS",
    "SCHEMA_REVISION",
    "WORKER_ALIVE_WITHIN",
    "WORKER_DELETE",
    "WORKER_HEARTBEAT_SECONDS",
    "WORKER_LIST",
    "WORKER_PRUNE",
    "WORKER_UPSERT",
]
