"""Every SQL statement cronlock issues, named, parameterised, in one place: this package.

Statements are SQLAlchemy Core built from the tables (``tables.py``), one module per table
(``jobs``, ``runs``, ``workers``, ``queues``) plus the advisory locks (``locks``), the item
savepoints' verbs (``savepoints``), alembic's version table (``migrations``), histogram
buckets computed in SQL (``histograms``) and ``cronlock bench``'s own (``bench``). Values are
bound parameters and the schema is applied by ``schema_translate_map``, so nothing from input
is ever formatted into SQL. Names put the noun first so related statements sort together;
every statement is re-exported here, so code reads ``sql.JOB_CLAIM``. A statement whose shape
follows an operator's filter is built by a lower-case function (``sql.job_list(...)``) from
the same tables, its values bound all the same.
"""

from __future__ import annotations

from .histograms import LATENCY_BUCKETS
from .jobs import (
    JOB_BY_DEDUP_KEY,
    JOB_CANCEL,
    JOB_CLAIM,
    JOB_COMPLETE_MANY,
    JOB_COMPLETE_ONE,
    JOB_COUNTS,
    JOB_DELETE,
    JOB_FINISH_MANY,
    JOB_GET,
    JOB_INSERT_MANY,
    JOB_INSERT_ONE,
    JOB_NEXT_DUE,
    JOB_OLDEST_DUE,
    JOB_PRUNE,
    JOB_PRUNE_COUNT,
    JOB_RATES,
    JOB_RECENT_FAILURES,
    JOB_RETRY,
    JOB_STATES,
    JOB_TOTALS,
    job_candidates,
    job_count,
    job_list,
    job_where,
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
from .queues import (
    QUEUE_GET,
    QUEUE_LIST,
    QUEUE_NOTIFY,
    QUEUE_PAUSE,
    QUEUE_PAUSED_NOW,
    QUEUE_RESUME,
)
from .runs import (
    RUN_CHUNK_COMMIT,
    RUN_CLAIMING_RECENT_PER_TASK,
    RUN_FINISH,
    RUN_INSERT,
    RUN_INSERT_MISSED,
    RUN_INTERRUPT,
    RUN_INTERRUPT_DEAD,
    RUN_LAST_SLOT,
    RUN_LAST_SLOT_PER_TASK,
    RUN_LAST_SUCCESS_PER_TASK,
    RUN_PRUNE,
    RUN_PRUNE_COUNT,
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
    WORKER_PRUNE_COUNT,
    WORKER_UPSERT,
)

__all__ = [
    "ITEM_RELEASE",
    "ITEM_RELEASE_AND_SAVEPOINT",
    "ITEM_ROLLBACK",
    "ITEM_SAVEPOINT",
    "JOB_BY_DEDUP_KEY",
    "JOB_CANCEL",
    "JOB_CLAIM",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_ONE",
    "JOB_COUNTS",
    "JOB_DELETE",
    "JOB_FINISH_MANY",
    "JOB_GET",
    "JOB_INSERT_MANY",
    "JOB_INSERT_ONE",
    "JOB_NEXT_DUE",
    "JOB_OLDEST_DUE",
    "JOB_PRUNE",
    "JOB_PRUNE_COUNT",
    "JOB_RATES",
    "JOB_RECENT_FAILURES",
    "JOB_RETRY",
    "JOB_STATES",
    "JOB_TOTALS",
    "KEEPALIVE_SETTINGS",
    "LATENCY_BUCKETS",
    "LOCK_HOLDERS",
    "LOCK_TRY_XACT",
    "LOCK_XACT",
    "NO_TIMEOUTS_LOCAL",
    "PING",
    "QUEUE_GET",
    "QUEUE_LIST",
    "QUEUE_NOTIFY",
    "QUEUE_PAUSE",
    "QUEUE_PAUSED_NOW",
    "QUEUE_RESUME",
    "RUN_CHUNK_COMMIT",
    "RUN_CLAIMING_RECENT_PER_TASK",
    "RUN_FINISH",
    "RUN_INSERT",
    "RUN_INSERT_MISSED",
    "RUN_INTERRUPT",
    "RUN_INTERRUPT_DEAD",
    "RUN_LAST_SLOT",
    "RUN_LAST_SLOT_PER_TASK",
    "RUN_LAST_SUCCESS_PER_TASK",
    "RUN_PRUNE",
    "RUN_PRUNE_COUNT",
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
    "WORKER_PRUNE_COUNT",
    "WORKER_UPSERT",
    "job_candidates",
    "job_count",
    "job_list",
    "job_where",
]
