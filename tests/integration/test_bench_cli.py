"""``cronlock bench`` as a user runs it: every section measured, nothing left behind.

The bench runs as the real command with tiny sizes: in a subprocess where it starts and kills
its workers or is itself interrupted, in process (tests/support/cli.py) for its table and its
refusals; a bench installs a SIGTERM handler, which only the main thread may, so those tests are
synchronous. "Nothing left behind" is checked in the database (no ``cronlock_bench_*`` schema in
pg_namespace, the user's own ``cronlock`` schema and its job untouched) and in /proc (no process
still carries the scratch schema in its environment: the bench's worker children are gone).
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cli import finish, invoke, invoke_async, kill_all, run_cli, start_cli
from jobsupport import job_app, job_rows
from sqlalchemy import URL, column, select, table
from testdb import libpq_url, on_database
from waiting import eventually

from cronlock import Database

TINY = (
    "bench", "--quick", "--sizes", "100", "--latency-seconds", "1", "--items", "200",
    "--latency-rate", "100",
)  # fmt: skip

_namespaces = table("pg_namespace", column("nspname"), schema="pg_catalog")


async def scratch_schemas(database: Database) -> list[str]:
    query = select(_namespaces.c.nspname).where(_namespaces.c.nspname.like("cronlock_bench_%"))
    async with database.connect() as conn:
        return list((await conn.execute(query)).scalars())


def processes_on(schema: str) -> list[int]:
    """Processes whose environment names the scratch schema (the bench's workers)."""
    marker = f"CRONLOCK_SCHEMA={schema}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def all_positive(spread: dict[str, Any]) -> bool:
    return all(positive(spread[key]) for key in ("median", "min", "max"))


async def test_quick_json_measures_every_section_and_leaves_nothing(
    database: Database, database_url: str
) -> None:
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_tx(session, "noop", {"mine": True})  # the user's own job
        await session.commit()
    done = run_cli(*TINY, "--json", database_url=database_url, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    assert report["cronlock"] and report["postgresql"] and positive(report["cores"])
    assert report["schema"].startswith("cronlock_bench_")
    enqueue = report["enqueue"]
    assert (enqueue["bulk"]["jobs"], enqueue["single"]["jobs"]) == (1000, 200)
    assert all_positive(enqueue["bulk"]["jobs_per_s"])
    assert all_positive(enqueue["single"]["jobs_per_s"])
    assert [(d["mode"], d["n"]) for d in report["drain"]] == [("strict", 100), ("batch", 100)]
    for drain in report["drain"]:
        assert all_positive(drain["seconds"]) and all_positive(drain["jobs_per_s"])
        assert all_positive(drain["p95_ms"])
    latency = report["latency"]
    assert latency["jobs"] == 100
    for key in ("p50_ms", "p95_ms", "p99_ms", "achieved_rate"):
        assert all_positive(latency[key]), key
    assert latency["p50_ms"]["median"] <= latency["p95_ms"]["median"]
    assert latency["p95_ms"]["median"] <= latency["p99_ms"]["median"]
    periodic = report["periodic"]
    assert periodic["items"] == 200
    assert all_positive(periodic["seconds"]) and all_positive(periodic["items_per_s"])
    recovery = report["recovery"]
    assert recovery["kills"] == 1 and all_positive(recovery["seconds"])
    assert 0 < recovery["p95_s"] < 30

    # Progress went to stderr, one line per step (not a terminal); stdout is the JSON alone.
    steps = [line for line in done.stderr.splitlines() if line.startswith("cronlock bench: [")]
    assert len(steps) == 6, done.stderr
    assert await scratch_schemas(database) == []
    assert processes_on(report["schema"]) == []
    [mine] = await job_rows(database)
    assert (mine["payload"], mine["status"]) == ({"mine": True}, "pending")


def test_table_output_has_the_reference_columns(database_url: str) -> None:
    done = invoke(
        "bench", "--quick", "--only", "drain,enqueue", "--sizes", "100", "--modes", "batch",
        database_url=database_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cronlock bench — cronlock ")
    assert "PostgreSQL" in lines[0] and "cores" in lines[0]
    header = next(line for line in lines if line.startswith("mode"))
    assert header.split() == ["mode", "N", "jobs", "time", "jobs/s", "p95"]
    assert any(line.split()[:2] == ["batch", "100"] for line in lines)
    assert sum(line.startswith("enqueue") for line in lines) == 2
    assert not any(line.startswith(("latency", "periodic", "recovery")) for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sizes", "100,many"), "--sizes: 'many' is not a job count"),
        (("--sizes", "0"), "--sizes: '0' is not a job count"),
        (("--modes", "strict,fast"), "--modes: 'fast' is not a commit mode (strict, batch, lease)"),
        (("--only", "drain,speed"), "--only: 'speed' is not a section"),
        (("--repeats", "0"), "--repeats"),
    ],
)
async def test_bad_option_is_one_line_exit_2_and_creates_nothing(
    database: Database, database_url: str, args: tuple[str, ...], message: str
) -> None:
    done = await invoke_async("bench", *args, database_url=database_url)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert message in lines[-1]
    assert len([line for line in lines if line.startswith("Error")]) == 1, done.stderr
    assert done.stdout == ""
    assert await scratch_schemas(database) == []


def test_unreachable_database_is_one_line_exit_2() -> None:
    done = invoke("bench", "--quick", database_url="postgresql://nobody@127.0.0.1:1/nowhere")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: cannot connect to postgresql://nobody@127.0.0.1:1/nowhere")


def test_a_user_who_may_not_create_a_schema_is_told_so(database_name: str, pg_server: URL) -> None:
    role = f"bench_noperm_{uuid.uuid4().hex[:8]}"  # roles are per server: a unique name

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(libpq_url(pg_server))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE ROLE "{role}" LOGIN'))
    try:
        url = pg_server.set(username=role, database=database_name)
        done = invoke("bench", "--quick", database_url=libpq_url(url))
    finally:
        asyncio.run(admin(f'DROP ROLE IF EXISTS "{role}"'))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: cannot create a scratch schema in ")
    assert line.endswith("(the bench needs CREATE on the database)")


def test_a_failing_step_exits_1_and_drops_the_schema(database_url: str) -> None:
    done = invoke(
        "bench", "--only", "enqueue,periodic", "--quick", "--items", "10",
        "--fail-at", "periodic", database_url=database_url,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("cronlock bench: the periodic step failed")
    assert "the scratch schema was dropped" in last
    assert done.stdout == ""
    assert on_database(database_url, scratch_schemas) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_interrupted_mid_recovery_kills_its_workers_and_drops_the_schema(
    database: Database, database_url: str, signum: int
) -> None:
    bench = start_cli(
        "bench", "--only", "recovery", "--recovery-kills", "100", database_url=database_url
    )
    try:
        [schema] = await eventually(lambda: scratch_schemas(database), timeout=30)

        async def two_workers() -> bool:
            return len(processes_on(schema)) == 2

        await eventually(two_workers, timeout=30)
        bench.send_signal(signum)
        code, _, stderr = finish(bench)
    finally:
        kill_all(bench)
    assert code == 1, stderr
    if signum == signal.SIGTERM:
        assert stderr.strip().splitlines()[-1] == (
            "cronlock bench: stopped by SIGTERM; the scratch schema was dropped"
        )
    assert await scratch_schemas(database) == []
    assert processes_on(schema) == []
