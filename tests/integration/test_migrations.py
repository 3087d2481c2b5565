"""The migrations produce exactly the declared tables, downgrade cleanly and are idempotent."""

from __future__ import annotations

from catalog import fingerprint
from sqlalchemy.schema import CreateSchema

from cronlock import Database, schema
from cronlock.sql.tables import metadata


async def _declared(database: Database, name: str = "cronlock") -> None:
    async with database.engine.begin() as conn:
        await conn.execute(CreateSchema(name))
        await conn.run_sync(metadata.create_all)


async def test_migrations_match_the_declared_tables(
    database: Database, empty_database: Database
) -> None:
    await _declared(empty_database)
    declared = await fingerprint(empty_database)
    migrated = await fingerprint(database)
    assert declared["tables"], "nothing declared?"
    for part in declared:
        assert migrated[part] == declared[part], part


async def test_downgrade_to_base_and_back(database: Database) -> None:
    before = await fingerprint(database)
    await schema.downgrade(database, "base")
    emptied = await fingerprint(database)
    assert emptied["tables"] == [] and emptied["functions"] == []
    assert await schema.current_revision(database) is None
    await schema.upgrade(database)
    assert await fingerprint(database) == before
    assert await schema.current_revision(database) == schema.head_revision()


async def test_migrate_is_idempotent(database: Database) -> None:
    before = await fingerprint(database)
    await schema.upgrade(database)
    await schema.upgrade(database)
    assert await fingerprint(database) == before


async def test_custom_schema(empty_database: Database) -> None:
    other = Database(empty_database.url, schema="jobs_here")
    try:
        await schema.upgrade(other)
        await schema.ensure_ready(other)
        shape = await fingerprint(other, "jobs_here")
        assert {name for name, _ in shape["tables"]} >= {"jobs", "runs"}
        assert await fingerprint(other, "cronlock") == {
            key: [] for key in shape
        }  # nothing leaked into the default schema
    finally:
        await other.dispose()


async def test_downgrade_below_0004_keeps_cancelled_jobs_as_failed(database: Database) -> None:
    from sqlalchemy import insert, select

    from cronlock.sql.tables import jobs

    async with database.engine.begin() as conn:
        await conn.execute(
            insert(jobs).values(job_type="noop", payload={}, status="cancelled", completed_at=None)
        )
    await schema.downgrade(database, "0003")
    async with database.connect() as conn:
        row = (await conn.execute(select(jobs.c.status, jobs.c.error_message))).one()
    assert tuple(row) == ("failed", "cancelled")
    await schema.upgrade(database)
    assert await schema.current_revision(database) == schema.head_revision()
