"""Version skew: code N works against schema N and N+1 (cronlock.online, rule 6).

The previous code (the tree at ``PREVIOUS``, materialised from git: CI runs on a full clone,
and a missing git or commit fails the test) drains real jobs, enqueued by its own producers,
while this code migrates the schema forward under it: nothing lost, nothing doubled. A newer
schema that says it needs newer code is refused in one line; one that says this code still
works is accepted; an older one says `run cronlock migrate`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from cli import ROOT, finish, invoke, kill_all
from testdb import libpq_url, on_database
from waiting import eventually

from cronlock import Database, schema

PREVIOUS = "290b0b0"

_APP = """
import os
from sqlalchemy import text
import cronlock

app = cronlock.App(database_url=os.environ["CRONLOCK_DATABASE_URL"])


@app.job("skew", max_retries=0)
async def skew(session, payload):
    await session.execute(text("INSERT INTO skew_log (n) VALUES (:n)"), {"n": payload["n"]})
"""
_PRODUCER = """
import asyncio, sys
import cronlock, skewapp

assert cronlock.__file__.startswith(sys.argv[3]), cronlock.__file__


async def main(start: int, stop: int) -> None:
    for n in range(start, stop):
        await skewapp.app.enqueue(skewapp.app.database, "skew", {"n": n})
    await skewapp.app.aclose()

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""
# Test-only statements.
_LOG = "CREATE TABLE public.skew_log (n int NOT NULL)"
_LOGGED = "SELECT count(*), count(DISTINCT n), min(n), max(n) FROM public.skew_log"
_OPEN = "SELECT count(*) FROM cronlock.jobs WHERE completed_at IS NULL"
_PRETEND = "UPDATE cronlock.cronlock_alembic_version SET version_num = $1"


def _previous_tree(into: Path) -> Path:
    """The code at PREVIOUS, as its release would have installed it."""
    tree = into / "previous"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS], capture_output=True, check=False
    )
    assert archive.returncode == 0, f"git archive {PREVIOUS}: {archive.stderr.decode()}"
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def _env(tree: Path, app_dir: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(app_dir)])
    env["CRONLOCK_DATABASE_URL"] = url
    return env


def _previous(
    *args: str, tree: Path, app_dir: Path, url: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    # From app_dir, not the repository: `python -m` puts the working directory first.
    return subprocess.run(
        [sys.executable, *args],
        cwd=app_dir,
        env=_env(tree, app_dir, url),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _start(tree: Path, app_dir: Path, url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=app_dir,
        env=_env(tree, app_dir, url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_the_previous_code_drains_on_while_the_schema_moves_forward(
    empty_database: Database, tmp_path: Path
) -> None:
    url = libpq_url(empty_database.url)
    tree = _previous_tree(tmp_path)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "skewapp.py").write_text(_APP)
    (app_dir / "produce.py").write_text(_PRODUCER)

    def previous(*args: str) -> subprocess.CompletedProcess[str]:
        return _previous(*args, tree=tree, app_dir=app_dir, url=url)

    # The database as the previous release left it: its own `cronlock migrate`.
    migrated = await asyncio.to_thread(previous, "-m", "cronlock", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    conn = await asyncpg.connect(url)
    worker: subprocess.Popen[str] | None = None
    producer: subprocess.Popen[str] | None = None
    try:
        await conn.execute(_LOG)
        first = await asyncio.to_thread(previous, "produce.py", "0", "150", str(tree))
        assert first.returncode == 0, first.stderr
        worker = _start(tree, app_dir, url, "-m", "cronlock", "--app", "skewapp", "worker")

        async def logged(at_least: int) -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM public.skew_log") >= at_least)

        await eventually(lambda: logged(20), timeout=60)  # a drain in progress
        producer = _start(tree, app_dir, url, "produce.py", "150", "300", str(tree))
        # This code's migrations, under the previous code's worker and producer.
        await schema.upgrade(empty_database)
        assert await asyncio.to_thread(producer.wait, 120) == 0, producer.stderr
        await eventually(lambda: logged(300), timeout=60)
        await eventually(lambda: _none_open(conn), timeout=30)
        worker.send_signal(signal.SIGTERM)
        code, _out, err = await asyncio.to_thread(finish, worker, 30)
        counts = tuple(await conn.fetchrow(_LOGGED))
        completed = await conn.fetchval(
            "SELECT count(*) FROM cronlock.jobs WHERE status = 'completed'"
        )
    finally:
        await conn.close()
        kill_all(*(p for p in (worker, producer) if p is not None))
    assert code == 0, err  # a graceful stop with nothing in flight
    assert "Traceback" not in err
    assert counts == (300, 300, 0, 299)  # every job's writes once: none lost, none doubled
    assert completed == 300
    assert await schema.current_revision(empty_database) == schema.head_revision()
    await schema.ensure_ready(empty_database)


async def _none_open(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(_OPEN) == 0)


async def _pretend(database: Database, revision: str, oldest_code: str | None) -> None:
    """The schema as a newer cronlock would leave it (its revision, and its window)."""
    await schema.upgrade(database)
    conn = await asyncpg.connect(libpq_url(database.url))
    try:
        await conn.execute(_PRETEND, revision)
        if oldest_code is not None:
            # Test-only: the literal is a constant of this test.
            await conn.execute(
                f"COMMENT ON TABLE cronlock.cronlock_alembic_version IS '{oldest_code}'"
            )
    finally:
        await conn.close()


@pytest.fixture
def empty_url(empty_database: Database) -> str:
    return libpq_url(empty_database.url)


def test_a_newer_schema_that_needs_newer_code_is_refused_in_one_line(empty_url: str) -> None:
    on_database(empty_url, lambda database: _pretend(database, "0099", "0099"))
    result = invoke("worker", database_url=empty_url)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert (
        "cronlock's schema is at revision 0099, which needs cronlock code from revision 0099 "
        f"on; this cronlock is at {schema.head_revision()}: upgrade cronlock"
    ) in result.stderr


def test_a_newer_schema_that_this_code_still_works_with_is_accepted(empty_url: str) -> None:
    on_database(empty_url, lambda database: _pretend(database, "0099", schema.head_revision()))
    result = invoke("status", "--json", database_url=empty_url)
    assert result.returncode == 0, result.stderr


def test_an_older_schema_says_run_cronlock_migrate(empty_url: str) -> None:
    on_database(empty_url, lambda database: schema.upgrade(database, "0012"))
    result = invoke("worker", database_url=empty_url)
    assert result.returncode == 2
    assert "is at revision 0012, this cronlock needs" in result.stderr
    assert "run `cronlock migrate`" in result.stderr
