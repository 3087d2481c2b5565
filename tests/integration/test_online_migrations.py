"""Every migration in migrations/versions keeps the rules of cronlock.online (invariant 14).

For each migration: a fresh database migrated to its parent, rows in jobs and runs, a long
transaction on jobs as a strict-mode job holds one (a row locked FOR UPDATE) and an idle
reader's open transaction, a steady enqueue, claim and run-recording load on connections of
its own; then the upgrade step. It fails when a statement of the load waited longer than
``BOUND``, when the migration waited silently instead of timing out and saying so, when it
rewrote jobs or runs, or when it built an index or a check constraint on an existing table
the blocking way. The tables are small: the bound is about lock waits, not size.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import event
from testdb import libpq_url
from waiting import eventually

from cronlock import Database, schema
from cronlock.errors import DatabaseUnavailable

BOUND = 1.0

_SCRIPTS = ScriptDirectory(str(schema.migrations_directory()))
STEPS = [
    (script.revision, script.down_revision)
    for script in reversed(list(_SCRIPTS.walk_revisions()))
    if isinstance(script.down_revision, str)
]

# Test-only statements, valid against every revision from 0001 on.
_ENQUEUE = "INSERT INTO cronlock.jobs (job_type, payload) VALUES ('load', '{}')"
_CLAIM = """
UPDATE cronlock.jobs SET status = 'completed', completed_at = now()
WHERE id = (SELECT id FROM cronlock.jobs WHERE status = 'pending'
            ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)"""
_RECORD_RUN = "INSERT INTO cronlock.runs (task, status) VALUES ('load', 'completed')"
_SEED = """
INSERT INTO cronlock.jobs (job_type, payload) SELECT 'seed', '{}' FROM generate_series(1, 300);
INSERT INTO cronlock.runs (task, status) SELECT 'seed', 'completed' FROM generate_series(1, 100)
"""
_TABLES = """
SELECT relname, relfilenode FROM pg_class
WHERE relnamespace = 'cronlock'::regnamespace AND relkind = 'r' ORDER BY relname"""

_BLOCKING_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?!CONCURRENTLY)(?:IF NOT EXISTS\s+)?\S+\s+ON\s+"
    r"(?:\S+\.)?\"?(\w+)\"?",
    re.IGNORECASE,
)
_ALTERED = re.compile(r"ALTER\s+TABLE\s+(?:\S+\.)?\"?(\w+)\"?\s+(.*)", re.IGNORECASE | re.DOTALL)


@dataclass
class Load:
    """Enqueues, claims and run records on connections of their own, each statement timed."""

    url: str
    longest: float = 0.0
    statements: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _loop(self, statement: str) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            # A statement stuck behind a lock fails the test in seconds, not at the run's end.
            await conn.execute("SET statement_timeout = '10s'")
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    await conn.execute(statement)
                except asyncpg.PostgresError as exc:
                    self.errors.append(f"{statement.split()[0]}: {exc}")
                self.longest = max(self.longest, time.monotonic() - started)
                self.statements += 1
                await asyncio.sleep(0.005)  # a steady rate, not a synchronisation
        finally:
            await conn.close()

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._loop(s)) for s in (_ENQUEUE, _CLAIM, _RECORD_RUN)]

    def stop(self) -> None:
        self._stop.set()


@contextmanager
def _statements_of(database: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    engine = database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _blocking_ddl(statements: list[str], existing: set[str]) -> list[str]:
    """The statements that lock an existing table for a scan of it (cronlock.online 2-4)."""
    found = []
    for statement in statements:
        index = _BLOCKING_INDEX.search(statement)
        if index and index.group(1) in existing:
            found.append(statement)
        altered = _ALTERED.search(statement)
        if altered and altered.group(1) in existing:
            rest = altered.group(2).upper()
            if ("CHECK" in rest and "NOT VALID" not in rest) or "SET NOT NULL" in rest:
                found.append(statement)
    return found


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "migrate_retry"]


async def _hold_jobs(url: str) -> tuple[asyncpg.Connection, asyncpg.Connection]:
    """A strict-mode job's transaction (a job row locked FOR UPDATE) and an idle reader's."""
    job, reader = await asyncpg.connect(url), await asyncpg.connect(url)
    await job.execute("BEGIN")
    await job.fetchval(
        "SELECT id FROM cronlock.jobs WHERE job_type = 'seed' ORDER BY created_at LIMIT 1 "
        "FOR UPDATE"
    )
    await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await reader.fetchval("SELECT count(*) FROM cronlock.jobs")
    return job, reader


@pytest.mark.parametrize(("revision", "parent"), STEPS, ids=[step[0] for step in STEPS])
async def test_a_migration_never_stalls_the_queue(
    empty_database: Database, revision: str, parent: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = await _at(empty_database, parent, caplog)
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(_SEED)
        tables_before = dict(await admin.fetch(_TABLES))
        statements, held_through, load = await _upgrade_under_load(
            empty_database, url, revision, caplog
        )
        tables_after = dict(await admin.fetch(_TABLES))
    finally:
        await admin.close()

    assert await schema.current_revision(empty_database) == revision
    assert load.errors == []
    assert load.longest < BOUND, f"a statement of the queue waited {load.longest:.2f} s"
    assert held_through or _retries(caplog)
    rewritten = [t for t, node in tables_before.items() if tables_after.get(t) != node]
    assert rewritten == [], f"{revision} rewrote {rewritten}"
    assert _blocking_ddl(statements, set(tables_before)) == []


async def _now(value: bool) -> bool:
    return value


async def _upgrade_under_load(
    database: Database, url: str, revision: str, caplog: pytest.LogCaptureFixture
) -> tuple[list[str], bool, Load]:
    """Upgrade to ``revision`` under the long transactions and the load: the statements it
    ran, whether it ended with the transactions still open, and the load's figures."""
    job, reader = await _hold_jobs(url)
    load = Load(url)
    workers = load.start()
    upgrade: asyncio.Task[None] | None = None
    try:
        await eventually(lambda: _now(load.statements > 30))
        with _statements_of(database) as statements:
            upgrade = asyncio.create_task(
                schema.upgrade(database, revision, index_timeout=0.3, retry_for=60)
            )
            # It ends with the long transactions still open (it needed no lock they hold),
            # or it says that it waited and will retry: never a silent wait.
            await eventually(lambda: _now(upgrade.done() or bool(_retries(caplog))))
            held_through = upgrade.done()
            await job.execute("ROLLBACK")
            await reader.execute("ROLLBACK")
            await asyncio.wait_for(upgrade, 60)
        during = load.statements
        await eventually(lambda: _now(load.statements > during + 10))
    finally:
        if upgrade is not None and not upgrade.done():
            upgrade.cancel()
        load.stop()
        await asyncio.gather(*workers)
        for conn in (job, reader):
            await conn.close()
    return statements, held_through, load


def test_the_check_sees_a_blocking_build() -> None:
    """The statement check itself: a plain build and a validating check are caught."""
    existing = {"jobs"}
    assert _blocking_ddl(["CREATE INDEX ix_x ON cronlock.jobs (queue)"], existing)
    assert _blocking_ddl(["ALTER TABLE cronlock.jobs ADD CONSTRAINT ck CHECK (x > 0)"], existing)
    assert not _blocking_ddl(
        ["CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_x ON cronlock.jobs (queue)"], existing
    )
    assert not _blocking_ddl(
        ["ALTER TABLE cronlock.jobs ADD CONSTRAINT ck CHECK (x > 0) NOT VALID"], existing
    )
    assert not _blocking_ddl(['CREATE INDEX ix_y ON cronlock."workers" (queue)'], existing)


async def _at(database: Database, revision: str, caplog: pytest.LogCaptureFixture) -> str:
    """The database migrated to ``revision``, its warnings captured; its URL."""
    caplog.set_level(logging.WARNING)
    await schema.upgrade(database, revision)
    return libpq_url(database.url)


async def test_an_invalid_index_left_by_an_interrupted_build_is_built_again(
    empty_database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    url = await _at(empty_database, "0012", caplog)
    admin, reader = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        # A build that gave up waiting for an older transaction leaves its index invalid.
        await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await reader.fetchval("SELECT count(*) FROM cronlock.jobs")
        await admin.execute("SET lock_timeout = '100ms'")
        with pytest.raises(asyncpg.LockNotAvailableError):
            await admin.execute("CREATE INDEX CONCURRENTLY ix_jobs_retried ON cronlock.jobs (id)")
        await reader.execute("ROLLBACK")
        valid = (
            "SELECT indisvalid FROM pg_index "
            "WHERE indexrelid = 'cronlock.ix_jobs_retried'::regclass"
        )
        assert await admin.fetchval(valid) is False
        await schema.upgrade(empty_database, "0013")
        assert await admin.fetchval(valid) is True
        definition = await admin.fetchval(
            "SELECT pg_get_indexdef('cronlock.ix_jobs_retried'::regclass)"
        )
    finally:
        await admin.close()
        await reader.close()
    assert "(queue, retry_count) WHERE" in definition
    assert any("ix_jobs_retried is invalid" in r.getMessage() for r in caplog.records)


async def test_a_migration_that_cannot_get_its_lock_gives_up_in_one_line(
    empty_database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    url = await _at(empty_database, "0008", caplog)
    admin = await asyncpg.connect(url)
    await admin.execute(_SEED)
    job, reader = await _hold_jobs(url)
    try:
        with pytest.raises(DatabaseUnavailable) as raised:
            await schema.upgrade(empty_database, "0009", retry_for=1.0)
    finally:
        for conn in (job, reader, admin):
            await conn.close()
    message = str(raised.value)
    assert "\n" not in message
    assert "migrating from revision 0008: a lock wait kept timing out" in message
    assert "oldest open transaction: pid" in message
    assert "run `cronlock migrate` again" in message
    assert _retries(caplog), "it said nothing while it retried"
    assert await schema.current_revision(empty_database) == "0008"


@pytest.mark.parametrize("script", list(_SCRIPTS.walk_revisions()), ids=lambda s: s.revision)
def test_a_migration_declares_the_oldest_code_that_works_with_it(script: Any) -> None:
    """cronlock.online, rule 6: usually its down_revision (code N runs against N and N+1)."""
    oldest = getattr(script.module, "oldest_code", None)
    known = {s.revision for s in _SCRIPTS.walk_revisions()}
    assert oldest in known, f"{script.revision} declares no known oldest_code ({oldest!r})"
    assert oldest <= script.revision
