"""The queue on the command line: enqueue, drain, run drain, status; exit codes and bad input.

In process (tests/support/cli.py); a drain installs signal handlers, which only the main thread
may, so the tests that drain are synchronous and reach the database with ``on_database``.
"""

from __future__ import annotations

import json

import pytest
from cli import invoke, invoke_async
from jobsupport import create_job_tables, job_rows
from testdb import on_database

from cronlock import Database

APP = ("--app", "testapps.jobs")


def test_enqueue_then_drain_json(database_url: str) -> None:
    on_database(database_url, create_job_tables)
    done = invoke(
        *APP, "enqueue", "echo", '{"to": "a@b.c"}', "--priority", "3", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    dedup = [
        invoke(*APP, "enqueue", "noop", "--dedup-key", "k", "--json", database_url=database_url)
        for _ in range(2)
    ]
    answers = [json.loads(d.stdout) for d in dedup]
    assert [a["created"] for a in answers] == [True, False]
    assert answers[0]["id"] == answers[1]["id"]

    drained = invoke(*APP, "drain", "--json", database_url=database_url)
    assert drained.returncode == 0, drained.stderr
    report = json.loads(drained.stdout)
    assert report["status"] == "completed"
    assert report["processed"] == 2
    for key in ("failed", "retried", "throughput_per_sec", "avg_latency_ms", "p95_latency_ms"):
        assert key in report
    rows = {str(r["id"]): r for r in on_database(database_url, job_rows)}
    assert rows[job_id]["result"] == {"echo": {"to": "a@b.c"}}
    assert rows[job_id]["priority"] == 3

    again = invoke(*APP, "run", "drain", "--json", database_url=database_url)
    assert again.returncode == 0
    assert json.loads(again.stdout)["processed"] == 0


def test_drain_with_failures_exits_3_and_status_shows_them(database_url: str) -> None:
    on_database(database_url, create_job_tables)
    for args in (("always_fail", "{}"), ("noop", "{}")):
        assert invoke(*APP, "enqueue", *args, database_url=database_url).returncode == 0
    drained = invoke(*APP, "drain", "--json", "--commit-mode", "batch", database_url=database_url)
    assert drained.returncode == 3, drained.stderr
    report = json.loads(drained.stdout)
    assert (report["status"], report["processed"], report["retried"]) == ("partial", 1, 1)

    status = invoke(*APP, "status", "--json", database_url=database_url)
    assert status.returncode == 0, status.stderr
    queue = json.loads(status.stdout)["queue"]
    [default] = queue["queues"]
    assert default["counts"] == {"completed": 1, "retrying": 1}
    [failure] = queue["recent_failures"]
    assert failure["job_type"] == "always_fail"
    assert failure["error_message"] == "ValueError: permanent error"
    assert queue["rates"]["completed_per_min_1m"] == 1.0
    human = invoke(*APP, "status", database_url=database_url)
    assert "queue default: 1 completed, 1 retrying" in human.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("enqueue", "nope", "{}"), "no handler registered for job type 'nope'"),
        (("enqueue", "noop", "{not json"), "PAYLOAD is not JSON"),
        (("enqueue", "noop", "NaN"), "PAYLOAD is not JSON"),
        (("enqueue", "noop", "{}", "--delay", "-5"), "delay must not be negative"),
        (("enqueue", "noop", "{}", "--max-retries", "100000"), "max_retries must be between"),
        (("enqueue", "noop", "{}", "--run-at", "2030-01-01T00:00"), "give a timezone"),
    ],
)
async def test_bad_enqueue_is_one_line_exit_2_and_writes_nothing(
    database: Database, database_url: str, args: tuple[str, ...], message: str
) -> None:
    done = await invoke_async(*APP, *args, database_url=database_url)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert await job_rows(database) == []
