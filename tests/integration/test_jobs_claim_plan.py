"""The claim is served by ix_jobs_claim, also once the table is mostly finished history."""

from __future__ import annotations

import json

from sqlalchemy import text

from cronlock import Database, sql
from cronlock.pg import AsyncpgStatement


async def test_claim_uses_the_partial_index(database: Database) -> None:
    async with database.engine.begin() as conn:
        # 20,000 finished jobs and 50 waiting ones, as a long-lived queue looks.
        await conn.execute(
            text(
                "INSERT INTO cronlock.jobs (job_type, payload, status) "
                "SELECT 'noop', '{}', CASE WHEN i <= 20000 THEN 'completed' ELSE 'pending' END "
                "FROM generate_series(1, 20050) i"
            )
        )
        await conn.execute(text("ANALYZE cronlock.jobs"))
    compiled = AsyncpgStatement.of(sql.JOB_CLAIM, database.schema)
    async with database.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        # Force the generic plan: what a prepared statement gets after its fifth execution.
        await raw.execute("SET plan_cache_mode = force_generic_plan")
        plan = await raw.fetchval(
            "EXPLAIN (FORMAT JSON) " + compiled.sql,
            *compiled.args(queue="default", limit=10, now=None),
        )
    text_plan = plan if isinstance(plan, str) else json.dumps(plan)
    assert "ix_jobs_claim" in text_plan, text_plan
    assert '"Seq Scan"' not in text_plan
