"""Every SQL statement cronlock issues, named, parameterised, in one place: this package.

Statements are SQLAlchemy Core built from the tables (``tables.py``), one module per table
(``jobs``, ``runs``, ``workers``, ``queues``, ``tasks``, ``waits``, ``dependencies``) plus
the advisory locks (``locks``),
the item savepoints' verbs (``savepoints``), alembic's version table (``migrations``) and
histogram buckets computed in SQL (``histograms``); ``cronlock bench``'s are
``cronlock_bench.sql``, held to the same rules. Values are bound parameters and the schema is
applied by ``schema_translate_map``, so nothing from input is ever formatted into SQL. Names
put the noun first so related statements sort together; every statement is re-exported here,
so code reads ``sql.JOB_CLAIM``. A statement whose shape follows an operator's filter is built
by a lower-case function (``sql.job_list(...)``) from the same tables, its values bound all
the same.

A statement module is imported the first time one of its names is asked for (PEP 562's
module ``__getattr__``), not by ``import cronlock.sql``: building the statements is most of
what importing cronlock costs, and ``cronlock run TASK`` sends the runs' and the locks'
statements, not the queue's or the metrics' (issue 26). ``_STATEMENTS`` says which module
holds each name; ``tests/unit/test_startup.py`` holds it to the modules' own ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What the type checker reads: every name, as if imported at once.
    from .cancels import *  # noqa: F403
    from .dependencies import *  # noqa: F403
    from .histograms import LATENCY_BUCKETS as LATENCY_BUCKETS
    from .jobs import *  # noqa: F403
    from .locks import *  # noqa: F403
    from .migrations import *  # noqa: F403
    from .queues import *  # noqa: F403
    from .rollups import *  # noqa: F403
    from .runs import *  # noqa: F403
    from .savepoints import *  # noqa: F403
    from .tasks import *  # noqa: F403
    from .waits import *  # noqa: F403
    from .workers import *  # noqa: F403

# Each statement module's names (its __all__), and the latency buckets.
_STATEMENTS: dict[str, tuple[str, ...]] = {
    "cancels": (
        "CANCEL_FORGET",
        "CANCEL_NOTIFY",
        "CANCEL_PRUNE",
        "CANCEL_REQUEST",
        "CANCEL_REQUESTED",
    ),
    "dependencies": ("DEPENDENCY_LOCK", "DEPENDENCY_PARENTS"),
    "jobs": (
        "CONCURRENCY_NAMESPACE",
        "JOB_BY_DEDUP_KEY",
        "JOB_CANCEL",
        "JOB_CLAIM",
        "JOB_CLAIM_TRACED",
        "JOB_COMPLETED_CAPPED",
        "JOB_COMPLETE_MANY",
        "JOB_COMPLETE_MANY_FENCED",
        "JOB_COMPLETE_ONE",
        "JOB_COMPLETE_ONE_FENCED",
        "JOB_COUNTS",
        "JOB_COUNTS_CAPPED",
        "JOB_COUNTS_OPEN",
        "JOB_DELETE",
        "JOB_FINISH_CLAIMED",
        "JOB_FINISH_CLAIMED_FENCED",
        "JOB_FINISH_MANY",
        "JOB_GET",
        "JOB_GET_COLUMNS",
        "JOB_INSERT_DEPENDENT",
        "JOB_INSERT_DEPENDENT_TRACED",
        "JOB_INSERT_MANY",
        "JOB_INSERT_MANY_TRACED",
        "JOB_INSERT_ONE",
        "JOB_INSERT_ONE_TRACED",
        "JOB_KEY_SLOT_FREE",
        "JOB_LEASE_CANDIDATES",
        "JOB_LEASE_CLAIM",
        "JOB_LEASE_CLAIM_KEYED",
        "JOB_LEASE_CLAIM_KEYED_TRACED",
        "JOB_LEASE_CLAIM_TRACED",
        "JOB_LEASE_COMPLETE_MANY",
        "JOB_LEASE_FINISH_MANY",
        "JOB_LEASE_GIVE_UP",
        "JOB_LEASE_HAND_BACK",
        "JOB_LEASE_KEYS_LOCK",
        "JOB_LEASE_LOST_IDS",
        "JOB_LEASE_NEXT_DUE",
        "JOB_LEASE_RECORD_FENCED",
        "JOB_LEASE_RETURN_LOST",
        "JOB_LEASE_STATE",
        "JOB_LEASE_TRY_CLAIM",
        "JOB_NEXT_DUE",
        "JOB_OLDEST_DUE",
        "JOB_PRUNE",
        "JOB_PRUNE_COUNT",
        "JOB_RATES_BY_QUEUE",
        "JOB_RECENT_FAILURES",
        "JOB_RETRY",
        "JOB_STATES",
        "JOB_STATUS_SETTLED",
        "JOB_TASK_RESULT",
        "JOB_TOTALS",
        "job_candidates",
        "job_completed_page",
        "job_count",
        "job_list",
        "job_open_page",
        "job_where",
        "owner_lock_key",
    ),
    "locks": (
        "FENCE_CHECK",
        "FENCE_OTHER_HOLDERS",
        "FENCE_TERMINATE_STALLED",
        "KEEPALIVE_SETTINGS",
        "LOCK_HOLDERS",
        "LOCK_SHARED_HOLDERS",
        "LOCK_TIMEOUT_LOCAL",
        "LOCK_TRY_XACT",
        "LOCK_TRY_XACT_BIGINT",
        "LOCK_TRY_XACT_SHARED",
        "LOCK_XACT",
        "NO_TIMEOUTS_LOCAL",
        "PING",
        "fenced",
    ),
    "migrations": (
        "INDEX_VALID",
        "MIGRATE_LOCK",
        "MIGRATE_UNLOCK",
        "OLDEST_CODE",
        "OLDEST_TRANSACTION",
        "SCHEMA_REVISION",
        "SET_LOCK_TIMEOUT",
        "record_oldest_code",
    ),
    "queues": (
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
    ),
    "rollups": (
        "JOBS_MARK",
        "JOB_TOTALS_FOLD",
        "JOB_TOTALS_NOW",
        "METRICS_FOLD_LOCAL",
        "METRICS_NO_JIT_LOCAL",
        "METRIC_MARK_CREATE",
        "METRIC_MARK_GET",
        "METRIC_MARK_MOVE",
        "METRIC_MARK_TAKE",
        "RUNS_MARK",
        "RUN_MARK_GET",
        "RUN_MARK_MOVE",
        "RUN_MARK_TAKE",
        "RUN_TOTALS_FOLD",
        "RUN_TOTALS_NOW",
    ),
    "runs": (
        "RUN_CHUNK_COMMIT",
        "RUN_FINISH",
        "RUN_GET",
        "RUN_INSERT",
        "RUN_INSERT_MISSED",
        "RUN_INTERRUPT",
        "RUN_INTERRUPT_DEAD",
        "RUN_LAST_REAL_PER_TASK",
        "RUN_LAST_SLOT",
        "RUN_LAST_SLOT_PER_TASK",
        "RUN_LATEST_PER_TASK",
        "RUN_OF_TASK_SINCE",
        "RUN_OUTCOMES_PER_TASK",
        "RUN_PRUNE",
        "RUN_PRUNE_COUNT",
        "RUN_RECENT",
        "RUN_RECENT_PER_TASK",
        "RUN_SLOTS_RECORDED",
        "RUN_TASK_NAMES",
        "RUN_TOTALS",
        "run_page",
    ),
    "savepoints": (
        "ITEM_RELEASE",
        "ITEM_RELEASE_AND_SAVEPOINT",
        "ITEM_ROLLBACK",
        "ITEM_SAVEPOINT",
    ),
    "tasks": (
        "ITEMS_FAILED",
        "ITEMS_FORGET",
        "ITEMS_FORGET_ALL",
        "ITEMS_OF_TASK",
        "ITEMS_PARKED",
        "ITEMS_PARKED_COUNTS",
        "ITEMS_SUCCEEDED",
        "ITEM_UNPARK",
        "RUN_GATE",
        "TASK_PAUSE",
        "TASK_RESUME",
        "TASK_STATES",
    ),
    "waits": (
        "WAIT_ADD",
        "WAIT_JOBS",
        "WAIT_JOBS_HELD",
        "WAIT_JOB_SETTLED",
        "WAIT_PRUNE",
        "WAIT_REMOVE",
    ),
    "workers": (
        "QUEUE_BUSY",
        "WORKER_ALIVE_WITHIN",
        "WORKER_DELETE",
        "WORKER_HEARTBEAT_SECONDS",
        "WORKER_LIST",
        "WORKER_PRUNE",
        "WORKER_PRUNE_COUNT",
        "WORKER_UPSERT",
    ),
    "histograms": ("LATENCY_BUCKETS",),
}

_MODULE_OF = {name: module for module, names in _STATEMENTS.items() for name in names}

__all__ = list(_MODULE_OF)


# PEP 562. Hidden from the type checker, which reads the imports above: a misspelt sql.X
# stays an error rather than Any.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _MODULE_OF.get(name)
        if module is None:
            # No f-string: a statement module formats nothing (test_sql_in_one_place).
            raise AttributeError("module " + repr(__name__) + " has no attribute " + repr(name))
        value = getattr(importlib.import_module("." + module, __name__), name)
        globals()[name] = value  # the next look-up is a plain one
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
