"""Advisory locks and the lock connection's settings: taking, waiting for, and seeing locks.

Periodic runs try a transaction-level lock and never wait; a standby drainer waits for one. The
lock connection's keepalives, its disabled timeouts and its ping are here too.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    Text,
    Update,
    bindparam,
    cast,
    column,
    func,
    literal_column,
    select,
    table,
)

__all__ = [
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
]

# Never waits: a busy lock means another run is active, and this one is skipped. The lock is
# released with the transaction, also when the process dies.
LOCK_TRY_XACT = select(
    func.pg_try_advisory_xact_lock(
        bindparam("namespace", type_=Integer), bindparam("key", type_=Integer)
    )
)

# The one-key (bigint) form, for a worker's liveness lock (queue/liveness.py): its key is 8
# bytes of the worker's id, and the one-key form keeps it apart from every two-key lock.
LOCK_TRY_XACT_BIGINT = select(func.pg_try_advisory_xact_lock(bindparam("key", type_=BigInteger)))

# A shared drainer's lock on its queue: any number of shared holders, none while an exclusive
# one holds the lock or waits for it (PostgreSQL queues a shared request behind a waiting
# exclusive one), so a queue is drained by shared drainers or by exclusive ones, never both.
LOCK_TRY_XACT_SHARED = select(
    func.pg_try_advisory_xact_lock_shared(
        bindparam("namespace", type_=Integer), bindparam("key", type_=Integer)
    )
)

_pg_locks = table(
    "pg_locks",
    column("locktype"),
    column("classid"),
    column("objid"),
    column("objsubid"),
    column("granted"),
    column("pid"),
    column("mode"),
    column("database"),
    schema="pg_catalog",
)
_pg_database = table("pg_database", column("oid"), column("datname"), schema="pg_catalog")
# What the reads of pg_locks below share: a granted two-key advisory lock in this database, in
# the namespace asked (with the key asked, in shared mode); LOCK_HOLDERS says why each.
_GRANTED_HERE = (
    _pg_locks.c.locktype == "advisory",
    _pg_locks.c.database
    == select(_pg_database.c.oid)
    .where(_pg_database.c.datname == func.current_database())
    .scalar_subquery(),
    _pg_locks.c.objsubid == 2,
    _pg_locks.c.granted,
)
_IN_NAMESPACE = cast(_pg_locks.c.classid, BigInteger) == bindparam(
    "namespace_oid", type_=BigInteger
)
_WITH_KEY = cast(_pg_locks.c.objid, BigInteger) == bindparam("key_oid", type_=BigInteger)
_SHARED = _pg_locks.c.mode == "ShareLock"

# Backends holding a two-key advisory lock in this database (advisory locks are per database;
# pg_locks shows the whole cluster). The keys show as oids (unsigned), so the caller passes
# them as ``key & 0xFFFFFFFF``.
LOCK_HOLDERS = select(_pg_locks.c.pid).where(*_GRANTED_HERE, _IN_NAMESPACE, _WITH_KEY)

# How many backends hold a two-key advisory lock of this database in shared mode (pg_locks
# says ShareLock): an exclusive drainer that finds its queue's lock taken asks whether shared
# drainers hold it. The keys are oids, as for LOCK_HOLDERS.
LOCK_SHARED_HOLDERS = select(func.count()).where(*_GRANTED_HERE, _SHARED, _IN_NAMESPACE, _WITH_KEY)

# Waits (a standby's lock): returns the moment the holder's transaction ends, also when the
# holder's process dies and PostgreSQL aborts it.
LOCK_XACT = select(
    func.pg_advisory_xact_lock(
        bindparam("namespace", type_=Integer), bindparam("key", type_=Integer)
    )
)

# TCP keepalives for a drainer's connections, in one round trip: the server probes a silent
# client after :idle s and drops it after :count lost probes (or :user_timeout ms of
# unacknowledged data), so a dead host's locks go in seconds, not the kernel's two hours.
# :is_local scopes them to the transaction (the lock connection, which may sit behind
# PgBouncer in transaction mode) or to the session (a job lane's own connection).
KEEPALIVE_SETTINGS = select(
    *[
        func.set_config(setting, bindparam(name, type_=Text), bindparam("is_local", type_=Boolean))
        for setting, name in (
            ("tcp_keepalives_idle", "idle"),
            ("tcp_keepalives_interval", "interval"),
            ("tcp_keepalives_count", "count"),
            ("tcp_user_timeout", "user_timeout"),
        )
    ]
)

# The lock transaction idles by design: no server-side timeout may end it (and so the lock).
NO_TIMEOUTS_LOCAL = select(
    func.set_config("idle_in_transaction_session_timeout", "0", True),
    func.set_config("statement_timeout", "0", True),
    func.set_config("lock_timeout", "0", True),
)

# How long this transaction waits for a row lock (:timeout, e.g. '2500ms') before it gives up:
# an operator's cancel waits for the lane running the job, for as long as it was told to.
# A standby's slice of waiting for the drainer lock uses it too (queue/lease.py).
LOCK_TIMEOUT_LOCAL = select(func.set_config("lock_timeout", bindparam("timeout", type_=Text), True))

# The lock connection is alive (and so is the lock taken in its transaction). No parameters, so
# that it can go by the simple query protocol, which leaves no portal (and no snapshot) behind.
PING = select(literal_column("1", Integer))

# The commit fence of a drainer's lanes (queue/lease.py), sent right before each commit: the
# barrier lock taken shared (it waits while a new active drainer passes the barrier), *then*
# the drainer's alive token tried shared, which fails exactly while the drainer's lock
# transaction holds the token: False = still the active drainer, commit; True = the lock was
# lost, roll back. The subquery runs first (its volatile call keeps it from being flattened):
# the order is what makes the fence exact.
FENCE_CHECK = select(
    func.pg_try_advisory_xact_lock_shared(
        bindparam("alive_namespace", type_=Integer), bindparam("token", type_=Integer)
    )
).select_from(
    select(
        func.pg_advisory_xact_lock_shared(
            bindparam("barrier_namespace", type_=Integer), bindparam("key", type_=Integer)
        ).label("barrier")
    ).subquery("barrier")
)


def fenced(write: Update) -> Select[tuple[bool]]:
    """``write`` and the commit fence in one statement: one round trip a commit instead of
    two. The answer is FENCE_CHECK's (True: the lock was lost, roll back). The write is a
    data-modifying CTE, which PostgreSQL runs to its end whatever the answer. That it may run
    before the fence's locks or after them changes nothing: none of the transaction is seen
    before its commit, and a fence that passed holds the barrier shared until then, so no
    drainer can become active in between."""
    return FENCE_CHECK.add_cte(write.cte("written"))


# Backends other than this one holding an alive token of the queue (a two-key advisory lock in
# its alive namespace, in this database): a new active drainer waits until the one before it
# has let go of its token entirely. Its argument is ``namespace & 0xFFFFFFFF`` (pg_locks shows
# the keys as oids).
FENCE_OTHER_HOLDERS = select(func.count()).where(
    *_GRANTED_HERE, _IN_NAMESPACE, _pg_locks.c.pid != func.pg_backend_pid()
)

# Lanes of a drainer that lost its lock, caught between their fence and their commit (holding
# the barrier shared) for longer than the new drainer waits: a frozen process. Terminating
# their backends rolls their transactions back, which is what the fence would have done.
FENCE_TERMINATE_STALLED = select(func.pg_terminate_backend(_pg_locks.c.pid)).where(
    *_GRANTED_HERE, _SHARED, _IN_NAMESPACE, _WITH_KEY
)
