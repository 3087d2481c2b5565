"""The lease mode's benchmark scripts measure what they say, on tiny N (no timing asserted).

``lease_vacuum``: VACUUM frees every dead version beside a running lease-mode job and none
beside a strict one, whose worker holds its transaction in every sample while the lease
worker holds none across samples; a lease job outlives the role's idle-in-transaction
timeout. ``lease_sigkill``: a SIGKILLed worker's job is returned, run again and written once.
``lease_drain``: its variants are the harness's and every run drains.
"""

from __future__ import annotations

import os
import uuid

import asyncpg
import pytest
from sqlalchemy import URL

from benchmarks import lease_drain, lease_sigkill, lease_vacuum
from benchmarks.run import Runner


def _server(pg_server: URL) -> str:
    return pg_server.set(drivername="postgresql").render_as_string(hide_password=False)


async def _left(server: str, prefix: str) -> int:
    conn = await asyncpg.connect(server)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)", prefix
            )
        )
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["lease", "strict"])
async def test_vacuum_beside_a_long_job(pg_server: URL, mode: str) -> None:
    jobs = 300
    case = await lease_vacuum.measure_vacuum(
        _server(pg_server), mode, long_seconds=5, jobs=jobs, sample_interval=0.1
    )
    assert case["vacuum_during_long_job"] and case["long_job"]["status"] == "completed"
    vacuum, held = case["vacuum"], case["activity"]["long_worker"]
    assert case["activity"]["samples"] > 0
    if mode == "lease":
        assert case["dead_produced"] == jobs + 1  # the long job's committed claim too
        assert vacuum["dead_not_removable"] == 0, case["horizon_at_vacuum"]
        assert vacuum["dead_items_removed"] >= 0.99 * case["dead_produced"]
        assert case["removed_share"] >= 0.99
        # Nothing of the long job's worker holds a transaction across samples.
        assert held["most_samples_in_a_row_holding"] <= 1
        oldest = held["oldest_holding_transaction_s"]
        assert oldest is None or oldest < 1.0
    else:
        assert vacuum["dead_not_removable"] == jobs and vacuum["dead_items_removed"] == 0
        assert case["removed_share"] == 0
        assert held["most_samples_in_a_row_holding"] == case["activity"]["samples"]
        assert held["oldest_holding_transaction_s"] >= 1.0


async def test_a_lease_job_outlives_the_roles_idle_timeout(pg_server: URL) -> None:
    case = await lease_vacuum.measure_idle(
        _server(pg_server), "lease", job_seconds=1.5, idle_timeout="500ms"
    )
    assert case["completed"] and case["rows_written"] == 1
    assert "idle_in_transaction_session_timeout=500ms" in case["role_settings"]


async def test_sigkilled_lease_workers_lose_no_job_and_apply_none_twice(pg_server: URL) -> None:
    result = await lease_sigkill.measure(_server(pg_server), kills=1, job_seconds=0.3, shared=False)
    assert result["every_job_once"], result
    [record] = result["records"]
    assert record["attempt"] == 2 and record["lost_runs"] == 1
    assert 0 < record["back_s"] <= record["started_again_s"] <= record["completed_s"]
    assert result["lost_runs"].get(1) == 1


def test_drain_variants_are_the_harness_options() -> None:
    lease = lease_drain.variant("lease:50")
    assert (lease.system, lease.options) == ("cronlock", {"commit_mode": "lease", "batch_size": 50})
    assert lease_drain.variant("strict").options == {"commit_mode": "strict"}
    peer = lease_drain.variant("pgqueuer:500")
    assert (peer.system, peer.options) == ("pgqueuer", {"batch_size": 500})
    with pytest.raises(SystemExit):
        lease_drain.variant("nonsense")


async def test_lease_drain_runs_every_variant_on_a_dropped_scratch_database(
    pg_server: URL,
) -> None:
    if os.environ.get("CI"):  # CI installs the bench extra: its absence there is a broken CI
        import pgqueuer  # noqa: F401
    else:
        pytest.importorskip("pgqueuer", reason="the PgQueuer variant needs the bench extra")
    server = _server(pg_server)
    prefix = "leasetest" + uuid.uuid4().hex[:8]
    runner = Runner(server, py312=None, log=False, prefix=prefix)
    variants = [lease_drain.variant(v) for v in ("lease:10", "pgqueuer:10")]
    entries = await lease_drain.measure(runner, variants, 30, 1)
    for entry in entries.values():
        assert entry["errors"] == [] and [run["n"] for run in entry["runs"]] == [30]
        assert entry["summary"]["jobs_per_s"]["median"] > 0
    assert lease_drain._tuned(entries) == "pgqueuer:batch_size=10"
    assert await _left(server, prefix) == 0
