"""Reads that stay bounded as history grows (issue 23, item 5): GET /jobs walks ix_jobs_created
instead of sorting the table, status and queue list count each status only up to a cap, and
status's latest failures read a few index entries (benchmarks/bounded_reads.py times them)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from plans import PLAN_MODES, plan_of
from sqlalchemy import text

from cronlock import App, Database, sql
from cronlock.cli import render
from cronlock.observe.serving import COMPLETED_CAP
from cronlock.pg import AsyncpgStatement

HISTORY = (
    "INSERT INTO cronlock.jobs (job_type, payload, status, completed_at, error_message, "
    "error_history) SELECT 'noop', '{}', s, "
    "CASE WHEN s <> 'pending' THEN now() - i * interval '1 s' END, "
    "CASE WHEN s = 'failed' THEN 'boom ' || i END, CASE WHEN s = 'failed' THEN "
    "jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now() - i * interval '1 s', "
    "'error', 'boom')) ELSE '[]' END "
    "FROM generate_series(1, :n) i, LATERAL (SELECT CASE WHEN i % 100 = 0 THEN 'failed' "
    "WHEN i % 100 = 1 THEN 'pending' ELSE 'completed' END AS s) c"
)


async def _history(database: Database, n: int) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(text(HISTORY), {"n": n})
        await conn.execute(text("ANALYZE cronlock.jobs"))


@pytest.mark.parametrize("after", [False, True])
async def test_a_page_of_jobs_is_a_walk_of_ix_jobs_created(database: Database, after: bool) -> None:
    await _history(database, 20_000)
    compiled = AsyncpgStatement.of(sql.job_list([], after=after), database.schema)
    given: dict[str, object] = {"limit": 51}
    if after:
        given |= {"after_created_at": datetime.now(UTC), "after_id": uuid.uuid4()}
    async with database.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        for mode in PLAN_MODES:
            plan = json.dumps(await plan_of(raw, compiled, compiled.args(**given), mode))
            assert "ix_jobs_created" in plan, plan
            assert '"Sort"' not in plan and '"Seq Scan"' not in plan, plan


async def test_status_and_queue_list_count_completed_jobs_up_to_a_cap(database: Database) -> None:
    await _history(database, COMPLETED_CAP + 200)
    app = App()
    app.use_database(str(database.url))
    try:
        report = await app.status()
        [queue] = report["queue"]["queues"]
        assert queue["counts"]["completed"] == COMPLETED_CAP  # at least that many
        assert queue["counts_capped"] == ["completed"]
        assert queue["counts"]["failed"] == 12 and queue["counts"]["pending"] == 12
        assert "at least 1,000 completed, 12 failed" in "\n".join(
            render.describe_queue(report["queue"])
        )
        # The latest failures, newest first, whatever the history behind them.
        failures = report["queue"]["recent_failures"]
        assert [f["error_message"] for f in failures][:3] == ["boom 100", "boom 200", "boom 300"]
        [listed] = await app.queues()
        assert listed.counts["completed"] == COMPLETED_CAP and listed.counts_capped == (
            "completed",
        )
    finally:
        await app.aclose()
