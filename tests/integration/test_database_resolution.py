"""One resolution of the database for every entry point (issue 16, point 3): the Python API
uses what the command line uses (``$CRONLOCK_DATABASE_URL``, the App's ``database_url``, the
embedded default), and an unmigrated database says "run `cronlock migrate`" from Python too,
never the driver's ``UndefinedTableError``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from cli import invoke, invoke_async
from sqlalchemy import text

import cronlock
from cronlock import Database, DatabaseUnavailable
from cronlock.database import resolve


def _app() -> cronlock.App:
    app = cronlock.App()

    @app.job("hello")
    async def hello(session: Any, payload: dict[str, Any]) -> None:
        return None

    @app.periodic("tick", cron="* * * * *")
    async def tick(run: cronlock.Run) -> None:
        return None

    return app


async def test_the_python_api_honours_cronlock_database_url(
    database: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRONLOCK_DATABASE_URL", database_url)
    app = _app()
    try:
        answer = await app.enqueue("hello", {"n": 1})
        assert answer.created
        result = await app.drain()
        assert result.stats["processed"] == 1
    finally:
        await app.aclose()
    async with database.connect() as conn:
        statuses = (await conn.execute(text("SELECT status FROM cronlock.jobs"))).scalars().all()
    assert statuses == ["completed"]


def test_the_command_line_and_python_resolve_in_one_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRONLOCK_DATABASE_URL", "postgresql://env/db")
    monkeypatch.setenv("CRONLOCK_SCHEMA", "from_env")
    monkeypatch.setenv("CRONLOCK_PGBOUNCER", "1")
    given = resolve("postgresql://flag/db", app_url="postgresql://app/db", schema="flag")
    assert (given.url, given.origin, given.schema, given.pgbouncer) == (
        "postgresql://flag/db",
        "--database-url",
        "flag",
        True,
    )
    from_env = resolve(app_url="postgresql://app/db")
    assert (from_env.url, from_env.origin, from_env.schema) == (
        "postgresql://env/db",
        "CRONLOCK_DATABASE_URL",
        "from_env",
    )
    monkeypatch.delenv("CRONLOCK_DATABASE_URL")
    monkeypatch.delenv("CRONLOCK_SCHEMA")
    from_app = resolve(app_url="postgresql://app/db", app_schema="mine")
    assert (from_app.url, from_app.schema) == ("postgresql://app/db", "mine")
    assert cronlock.App(database_url="postgresql://app/db").database.pgbouncer
    monkeypatch.setenv("CRONLOCK_PGBOUNCER", "perhaps")
    with pytest.raises(cronlock.ConfigurationError, match="CRONLOCK_PGBOUNCER must be 1 or 0"):
        resolve(app_url="postgresql://app/db")


Call = Callable[[cronlock.App], Awaitable[object]]
CALLS: dict[str, Call] = {
    "enqueue on app.database": lambda app: app.enqueue("hello", {}),
    "enqueue_many": lambda app: app.enqueue_many("hello", [{}, {}]),
    "run": lambda app: app.run("tick", manual=True),
    "drain": lambda app: app.drain(),
    "list_jobs": lambda app: app.list_jobs(),
    "retry_jobs": lambda app: app.retry_jobs(cronlock.JobFilter(status="failed")),
    "pause_queue": lambda app: app.pause_queue("default"),
    "queues": lambda app: app.queues(),
    "prune": lambda app: app.prune(dry_run=True),
    "status": lambda app: app.status(),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
async def test_an_unmigrated_database_says_run_cronlock_migrate_from_python(
    empty_database: Database, call: Call
) -> None:
    app = _app()
    app.use_database(empty_database.url.render_as_string(hide_password=False))
    try:
        with pytest.raises(DatabaseUnavailable) as raised:
            await call(app)
    finally:
        await app.aclose()
    message = str(raised.value)
    assert "run `cronlock migrate`" in message, message
    assert "\n" not in message
    assert raised.value.__cause__ is None


async def test_libpq_options_in_the_url_reach_the_server(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 16, point 4: connect_timeout= or application_name= crashed every command.
    joiner = "&" if "?" in database_url else "?"
    url = (
        f"{database_url}{joiner}connect_timeout=5&application_name=billing"
        "&options=-c%20statement_timeout%3D5s"
    )
    monkeypatch.setenv("CRONLOCK_DATABASE_URL", url)
    app = _app()
    try:
        async with app.database.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT current_setting('application_name'), "
                        "current_setting('statement_timeout')"
                    )
                )
            ).one()
        assert tuple(row) == ("billing", "5s")
        assert (await app.enqueue("hello", {})).created
    finally:
        await app.aclose()
    listed = await invoke_async("list", database_url=url)
    assert listed.returncode == 0, listed.stderr
    status = await invoke_async("status", "--json", database_url=url)
    assert status.returncode == 0, status.stderr


def test_an_unknown_url_option_is_one_line_exit_2(database_url: str) -> None:
    joiner = "&" if "?" in database_url else "?"
    result = invoke("status", database_url=f"{database_url}{joiner}frobnicate=1")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: unknown database URL option 'frobnicate' (cronlock under")


def test_a_password_with_an_at_sign_is_never_shown() -> None:
    result = invoke("status", database_url="postgresql://u:hunter@2#x@127.0.0.1:1/db")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "hunter" not in line and "2#x" not in line
    assert "postgresql://***@127.0.0.1:1/db" in line and "%40" in line
