"""The log lines of the command line (issue 16, point 9): a start line for the long-running
commands (what they serve, standby or active), a line per run and per job at INFO, JSON with
stable keys, and `cronlock run` saying each failed item once."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

from cli import invoke_async, kill_all, start_cli
from itemsupport import create_scratch
from jobsupport import job_app
from waiting import eventually

from cronlock import Database

APP = ("--app", "testapps.jobs")


class _JsonLines:
    """A started command's stderr, one JSON object a line, read as it comes."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[dict[str, Any]] = []
        self.other: list[str] = []

        def read() -> None:
            for line in stream:
                try:
                    self.lines.append(json.loads(line))
                except ValueError:
                    self.other.append(line)

        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join(timeout=30)

    async def has(self, **fields: Any) -> bool:
        return any(all(line.get(k) == v for k, v in fields.items()) for line in self.lines)


async def test_worker_says_it_started_then_active_then_each_job_in_json(
    database: Database, database_url: str
) -> None:
    worker = start_cli(*APP, "-v", "--log-format", "json", "worker", database_url=database_url)
    try:
        assert worker.stderr is not None
        said = _JsonLines(worker.stderr)
        await eventually(lambda: said.has(action="drainer_active", queue="default"), timeout=30)
        async with job_app(database) as app:
            answer = await app.enqueue("noop", {"n": 1})
        await eventually(lambda: said.has(action="job_finished", job_id=str(answer.id)), timeout=30)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        said.join()
    finally:
        kill_all(worker)
    assert code == 0
    assert said.other == []  # every line is JSON, what it says of the signal included
    assert await said.has(action="signal_received", level="warning")
    started = said.lines[0]
    assert (started["action"], started["level"], started["logger"]) == (
        "worker_started",
        "info",
        "cronlock.cli",
    )
    assert started["message"].startswith("worker started: queue default on postgresql://")
    assert started["ts"].endswith("Z")
    [job] = [line for line in said.lines if line.get("action") == "job_finished"]
    assert {k: job[k] for k in ("job_id", "job_type", "queue", "attempt", "outcome")} == {
        "job_id": str(answer.id),
        "job_type": "noop",
        "queue": "default",
        "attempt": 1,
        "outcome": "completed",
    }
    assert job["duration_ms"] >= 0


async def test_a_worker_says_active_by_default_but_no_line_per_job(
    database: Database, database_url: str
) -> None:
    worker = start_cli(*APP, "--log-format", "json", "worker", database_url=database_url)
    try:
        assert worker.stderr is not None
        said = _JsonLines(worker.stderr)
        await eventually(lambda: said.has(action="drainer_active"), timeout=30)
        async with job_app(database) as app:
            await app.enqueue("noop", {"n": 1})
            await eventually(lambda: _done(database), timeout=30)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        said.join()
        assert worker.stdout is not None
        printed = worker.stdout.read()
    finally:
        kill_all(worker)
    # The result line drain prints (issue 16, point 12: worker printed a JSON object).
    [result] = printed.splitlines()
    assert result.startswith("worker default: completed — 1 completed, 0 retrying, 0 failed")
    assert [line["action"] for line in said.lines][:1] == ["worker_started"]
    assert not any(line.get("action") == "job_finished" for line in said.lines)


async def _done(database: Database) -> bool:
    from sqlalchemy import func, select

    from cronlock.sql.tables import jobs

    async with database.connect() as conn:
        count = await conn.scalar(
            select(func.count()).select_from(jobs).where(jobs.c.status == "completed")
        )
    return count == 1


async def test_a_run_has_a_line_at_info_with_its_keys(
    database: Database, database_url: str
) -> None:
    await create_scratch(database)
    done = await invoke_async(
        "--app", "testapps.items", "-v", "--log-format", "json", "run", "thousand", "--manual",
        database_url=database_url,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    [run] = [line for line in lines if line.get("action") == "run_finished"]
    assert (run["task"], run["slot"], run["trigger"], run["outcome"]) == (
        "thousand",
        None,
        "manual",
        "partial",
    )
    assert (run["items_ok"], run["items_failed"]) == (990, 10)
    assert isinstance(run["run_id"], int) and run["duration_ms"] > 0


async def test_run_prints_each_failed_item_once(database: Database, database_url: str) -> None:
    # Issue 16, point 12: each item failure came twice, as a log line and in the summary.
    await create_scratch(database)
    done = await invoke_async(
        "--app", "testapps.items", "run", "thousand", "--manual", database_url=database_url
    )
    assert done.returncode == 3
    assert done.stderr == ""
    items = [line for line in done.stdout.splitlines() if line.startswith("  item ")]
    assert len(items) == 10 == len(set(items))
