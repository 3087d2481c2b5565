"""A job's own timeout (issue 22): an enqueue option on every surface (Python, the command line,
``POST /jobs``), beside its type's, honoured by the one attempt runner in every commit mode."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from cli import invoke
from jobsupport import job_rows
from sqlalchemy.ext.asyncio import AsyncSession

from cronlock import App, Database, InvalidJobOption
from cronlock.http import create_api

MODES = ["strict", "batch", "lease"]


def _app(database: Database) -> App:
    app = App()

    @app.job("sleepy", max_retries=0, timeout=30)
    async def sleepy(_session: AsyncSession, payload: Any) -> str:
        await asyncio.sleep(payload["seconds"])
        return "woke"

    app.use_database(str(database.url))
    return app


@pytest.mark.parametrize("mode", MODES)
async def test_a_jobs_own_timeout_wins_over_its_types_in_every_mode(
    database: Database, mode: str
) -> None:
    app = _app(database)
    try:
        short = await app.enqueue("sleepy", {"seconds": 30}, timeout=0.2)
        roomy = await app.enqueue("sleepy", {"seconds": 0.3}, timeout=5)
        typed = await app.enqueue("sleepy", {"seconds": 0.01})  # the type's 30 s
        result = await asyncio.wait_for(app.drain(commit_mode=mode), 20)
    finally:
        await app.aclose()
    assert result.stats["failed"] == 1 and result.stats["processed"] == 2
    rows = {row["id"]: row for row in await job_rows(database)}
    assert rows[short.id]["status"] == "failed"
    assert rows[short.id]["error_message"] == (
        "TimeoutError: the handler ran longer than its timeout of 0.2 s"
    )
    assert rows[short.id]["timeout"] == 0.2
    assert rows[roomy.id]["status"] == rows[typed.id]["status"] == "completed"
    assert rows[typed.id]["timeout"] is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5"])
async def test_a_timeout_that_is_not_a_positive_number_writes_nothing(
    database: Database, bad: Any
) -> None:
    app = _app(database)
    try:
        with pytest.raises(InvalidJobOption, match="timeout must be a positive number"):
            await app.enqueue("sleepy", {"seconds": 0}, timeout=bad)
    finally:
        await app.aclose()
    assert await job_rows(database) == []


def test_enqueue_on_the_command_line_takes_a_timeout(database_url: str) -> None:
    app = ("--app", "testapps.jobs")
    answer = invoke(
        *app, "enqueue", "log", '{"n": 1}', "--timeout", "2.5", database_url=database_url
    )
    assert answer.returncode == 0, answer.stderr
    bad = invoke(*app, "enqueue", "log", "--timeout", "0", database_url=database_url)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "Error: timeout must be a positive number of seconds, not 0.0"

    async def stored() -> list[Any]:
        database = Database(database_url)
        try:
            return [row["timeout"] for row in await job_rows(database)]
        finally:
            await database.dispose()

    assert asyncio.run(stored()) == [2.5]


async def test_post_jobs_takes_a_timeout(database: Database) -> None:
    app = _app(database)
    transport = httpx.ASGITransport(app=create_api(app, token="t"))
    auth = {"Authorization": "Bearer t"}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"job_type": "sleepy", "payload": {"seconds": 0}, "timeout": 1.5}
            answer = await client.post("/jobs", json=body, headers=auth)
            assert answer.status_code == 201, answer.text
            refused = await client.post("/jobs", json={**body, "timeout": 0}, headers=auth)
            assert refused.status_code == 422
    finally:
        await app.aclose()
    assert [row["timeout"] for row in await job_rows(database)] == [1.5]
