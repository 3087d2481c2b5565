"""``benchmarks.sync_enqueue`` measures what it says, on tiny N (no timing asserted): every way
commits the jobs it counts (the script checks the rows of both queues against its own count,
and fails otherwise), and its scratch database is dropped."""

from __future__ import annotations

import os
import uuid

import asyncpg
import pytest
from sqlalchemy import URL


async def test_every_way_writes_its_jobs_on_a_dropped_scratch_database(pg_server: URL) -> None:
    if os.environ.get("CI"):  # CI installs the bench extra: its absence there is a broken CI
        import pgqueuer  # noqa: F401
    else:
        pytest.importorskip("pgqueuer", reason="PgQueuer's sync enqueue needs the bench extra")
    from benchmarks import sync_enqueue

    server = pg_server.set(drivername="postgresql").render_as_string(hide_password=False)
    prefix = "syncbench" + uuid.uuid4().hex[:8]
    results = await sync_enqueue.measure(server, 3, 4, 2, 1, warmup=1, prefix=prefix)
    assert len(results["one_at_a_time"]) == 5 and len(results["bulk"]) == 3
    for kind in results.values():
        for figures in kind.values():
            assert figures["per_s"]["median"] > 0 and len(figures["per_s"]["runs"]) == 1
    conn = await asyncpg.connect(server)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)", prefix
        )
    finally:
        await conn.close()
    assert left == 0
