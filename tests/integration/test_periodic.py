"""A run: lock, savepoint per item, one recorded outcome (issue 2's acceptance, in process)."""

from __future__ import annotations

from datetime import UTC, datetime

from itemsupport import count, items_app
from sqlalchemy import select, text
from testapps import items

from cronlock import Database, RunStatus
from cronlock.sql.tables import runs


async def _runs(database: Database) -> list[dict[str, object]]:
    async with database.connect() as conn:
        rows = await conn.execute(select(runs).order_by(runs.c.id))
        return [dict(row) for row in rows.mappings()]


async def test_failing_items_roll_back_alone(database: Database) -> None:
    async with items_app(database) as app:
        result = await app.run("thousand", manual=True)

    assert result.status is RunStatus.PARTIAL
    assert (result.items_ok, result.items_failed) == (990, 10)
    assert await count(database, items.processed) == 990
    assert await count(database, items.processed, items.processed.c.item.in_(items.FAILING)) == 0
    [row] = await _runs(database)
    assert row["status"] == "partial"
    assert (row["items_ok"], row["items_failed"]) == (990, 10)
    failures = row["failures"]
    assert isinstance(failures, list)
    assert {f["item"] for f in failures} == {str(i) for i in items.FAILING}
    assert {f["error_type"] for f in failures} == {"ValueError"}
    assert failures[0]["message"] == "item 7 is bad"
    assert row["id"] == result.run_id


async def test_body_that_raises_commits_nothing(database: Database) -> None:
    async with items_app(database) as app:
        result = await app.run("explode", manual=True)

    assert result.status is RunStatus.FAILED
    assert result.error == "RuntimeError: the body blew up"
    assert await count(database, items.processed) == 0
    [row] = await _runs(database)
    assert row["status"] == "failed"
    assert row["error"] == "RuntimeError: the body blew up"
    assert row["items_ok"] == 0


async def test_busy_lock_skips_and_records(database: Database) -> None:
    async with items_app(database) as app:
        task = app.task("thousand")
        async with database.connect() as holder:
            await holder.execute(
                text("SELECT pg_advisory_xact_lock(:ns, :key)"),
                {"ns": task.lock_namespace, "key": task.lock_key},
            )
            result = await app.run("thousand", manual=True)
            await holder.rollback()
        after = await app.run("thousand", manual=True)

    assert result.status is RunStatus.SKIPPED
    assert result.skip_reason == "lock_busy"
    assert after.status is RunStatus.PARTIAL  # the lock ended with the holder's transaction
    statuses = [row["status"] for row in await _runs(database)]
    assert statuses == ["skipped", "partial"]


async def test_run_records_slot_host_and_pid(database: Database) -> None:
    moment = datetime(2026, 11, 29, 10, 15, 2, tzinfo=UTC)  # 2 s late, within grace
    async with items_app(database) as app:
        result = await app.run("thousand", now=moment)

    assert result.slot == datetime(2026, 11, 29, 10, 15, tzinfo=UTC)
    [row] = await _runs(database)
    assert row["slot"] == datetime(2026, 11, 29, 10, 15, tzinfo=UTC)
    assert row["started_at"] == moment
    assert row["host"]
    assert isinstance(row["pid"], int)


async def test_connections_ask_the_server_for_keepalives(database: Database) -> None:
    # Over TCP (CI's server) these bound how long a vanished host keeps its lock.
    async with database.connect() as conn:
        shown = {
            name: (await conn.execute(text(f"SHOW {name}"))).scalar_one()
            for name in ("tcp_keepalives_idle", "tcp_user_timeout", "application_name")
        }
    assert shown["application_name"] == "cronlock"
    if database.url.host:  # a Unix socket has no TCP settings: the server shows 0
        assert shown["tcp_keepalives_idle"] == "10"
        assert shown["tcp_user_timeout"] == "30000"  # milliseconds
