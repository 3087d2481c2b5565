"""The claim is served by ix_jobs_claim, also once the table is mostly finished history."""

from __future__ import annotations

import json
import uuid

from plans import PLAN_MODES, plan_of
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
        # The generic plan: what a prepared statement may keep from its sixth execution.
        args = compiled.args(queue="default", limit=10, now=None)
        plan = await plan_of(raw, compiled, args, "force_generic_plan")
    text_plan = json.dumps(plan)
    assert "ix_jobs_claim" in text_plan, text_plan
    assert '"Seq Scan"' not in text_plan


async def test_lease_claim_finds_its_rows_by_the_primary_key(database: Database) -> None:
    """A lease claim of 500 from 10,000 due jobs, analyzed: the UPDATE finds the claimed rows
    through pk_jobs, in the custom plan and the generic one, never by hashing a scan of the
    whole table (what the join with the claimed CTE got at that size)."""
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO cronlock.jobs (job_type, payload) "
                "SELECT 'noop', '{}' FROM generate_series(1, 10000)"
            )
        )
        await conn.execute(text("ANALYZE cronlock.jobs"))
    compiled = AsyncpgStatement.of(sql.JOB_LEASE_CLAIM, database.schema)
    args = compiled.args(queue="default", limit=500, worker=uuid.uuid4(), now=None)
    async with database.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        for mode in PLAN_MODES:
            text_plan = json.dumps(await plan_of(raw, compiled, args, mode))
            assert "ix_jobs_claim" in text_plan, text_plan
            assert "pk_jobs" in text_plan, text_plan
            assert '"Seq Scan"' not in text_plan, text_plan
            assert '"Hash Join"' not in text_plan, text_plan


async def test_a_lease_completion_is_no_join_in_its_generic_plan(database: Database) -> None:
    """A batched lease completion of 500 running jobs, in the generic plan a prepared statement
    switches to from its sixth run: one scan of jobs, no join to the arrays (whose nested
    loop rescanned the unnest once per row)."""
    worker = uuid.uuid4()
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO cronlock.jobs (job_type, payload, status, owner, attempt) "
                "SELECT 'noop', '{}', 'processing', :worker, 1 FROM generate_series(1, 500)"
            ),
            {"worker": worker},
        )
        ids = list(await conn.scalars(text("SELECT id FROM cronlock.jobs")))
        await conn.execute(text("ANALYZE cronlock.jobs"))
    compiled = AsyncpgStatement.of(sql.JOB_LEASE_COMPLETE_MANY, database.schema)
    args = compiled.args(ids=ids, attempts=[1] * 500, results=None, worker=worker, now=None)
    async with database.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        text_plan = json.dumps(await plan_of(raw, compiled, args, "force_generic_plan"))
    assert '"Nested Loop"' not in text_plan, text_plan
    assert '"Function Scan"' not in text_plan, text_plan


async def test_a_batch_completion_reads_only_its_rows_before_any_analyze(
    database: Database,
) -> None:
    """A burst of 10,000 new jobs that autovacuum has not analyzed yet, and a batch of 50 of
    them completed: the statements of the claim's transaction find their rows without the
    claim index. Guarded by the status, they were planned from its statistics (a few waiting
    rows) and read all 10,000 waiting jobs through ix_jobs_claim for every batch."""
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO cronlock.jobs (job_type, payload) "
                "SELECT 'noop', '{}' FROM generate_series(1, 10000)"
            )
        )
        ids = list(await conn.scalars(text("SELECT id FROM cronlock.jobs LIMIT 50")))
    now = None
    many = AsyncpgStatement.of(sql.JOB_COMPLETE_MANY, database.schema)
    finish = AsyncpgStatement.of(sql.JOB_FINISH_CLAIMED, database.schema)
    statements = [
        (many, many.args(ids=ids, results=None, now=now)),
        (
            finish,
            finish.args(
                now=now,
                ids=ids,
                statuses=["retrying"] * 50,
                retry_counts=[1] * 50,
                delays=[1.0] * 50,
                errors=["ValueError: no"] * 50,
                error_entries=['{"attempt": 1, "error": "ValueError: no"}'] * 50,
                results=[None] * 50,
                started_ats=[None] * 50,
            ),
        ),
    ]
    async with database.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        for compiled, args in statements:
            for mode in PLAN_MODES:
                text_plan = json.dumps(await plan_of(raw, compiled, args, mode))
                assert "ix_jobs_claim" not in text_plan, text_plan
