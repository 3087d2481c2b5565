"""The typed payloads' benchmark runs on a tiny N (no timing asserted): every way enqueues all
its payloads, every figure is reported, and its scratch database is dropped."""

from __future__ import annotations

import asyncpg
from sqlalchemy import URL

from benchmarks import typed_enqueue


async def test_every_way_enqueues_and_is_reported(pg_server: URL) -> None:
    server = pg_server.set(drivername="postgresql").render_as_string(hide_password=False)
    results = await typed_enqueue.measure(server, n=20, rounds=2, check_rounds=2)
    assert list(results) == list(typed_enqueue.WAYS)
    for figures in results.values():
        assert len(figures["wall_ms"]["runs"]) == 2 and len(figures["prepare_ms"]["runs"]) == 2
    baseline = results[typed_enqueue.BASELINE]
    assert baseline["paired_overhead_vs_dicts"] == baseline["checks_share_of_enqueue"] == 0
    assert "| pydantic dicts |" in typed_enqueue._table(results)
    conn = await asyncpg.connect(server)  # its scratch database was dropped
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_database WHERE starts_with(datname, 'typed_enqueue_')"
        )
    finally:
        await conn.close()
    assert left == 0
