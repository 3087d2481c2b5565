"""What a handler knows (``current_job()``) and the outcomes it may return (``JobCancel``,
``JobSnooze``), against PostgreSQL, in both transactional commit modes, from Python, the
command line and HTTP.

A returned outcome is not a failure: no retry is used up, no failure counted, the drain is
not partial, and the handler's writes commit with it (the log lines are counted).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cli import invoke, invoke_async
from jobsupport import create_job_tables, job_app, job_rows, scalar
from sqlalchemy import func, select, update
from testapps import jobs as testjobs
from testdb import on_database

import cronlock
from cronlock import Database, InvalidJobOption, JobCancel, JobSnooze, JobStatus, NoCurrentJob
from cronlock.http import create_api
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.sql.tables import jobs

APP = ("--app", "testapps.jobs")


def at(moment: datetime) -> Callable[[], datetime]:
    def clock() -> datetime:
        return moment

    return clock


async def _log_count(database: Database, job: str) -> int:
    statement = select(func.count()).where(testjobs.job_log.c.job == job)
    return int(await scalar(database, statement))


def test_current_job_outside_a_handler_is_a_clear_error() -> None:
    with pytest.raises(NoCurrentJob, match="outside a job's handler"):
        cronlock.current_job()
    assert issubclass(NoCurrentJob, LookupError)


def test_outcomes_check_what_they_are_given() -> None:
    assert JobSnooze(timedelta(minutes=2)).seconds == 120.0
    assert JobSnooze(0).seconds == 0.0
    for bad in (-1, float("nan"), True, "60", timedelta(days=400), 10**9):
        with pytest.raises(InvalidJobOption, match="JobSnooze's delay"):
            JobSnooze(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobOption, match="reason must be a str"):
        JobCancel(42)  # type: ignore[arg-type]


async def test_a_handler_knows_its_job_on_every_attempt(database: Database) -> None:
    async with job_app(database) as app:
        first = await app.enqueue("knows", {})
        other = await app.enqueue("knows", {"fail_first": True}, queue="other")
        await app.drain()
        [job] = await job_rows(database, id=first.id)
        assert job["status"] == "completed"
        assert job["result"] == {
            "id": str(first.id),
            "job_type": "knows",
            "queue": "default",
            "attempt": 1,
            "max_retries": 2,
            "enqueued_at": job["created_at"].isoformat(),
            "cancel_requested": False,
        }
        later = datetime.now(UTC) + timedelta(hours=1)
        assert (await app.drain(queue="other")).stats["retried"] == 1
        await app.drain(queue="other", clock=at(later))
        [retried] = await job_rows(database, id=other.id)
        assert retried["status"] == "completed"
        assert (retried["result"]["queue"], retried["result"]["attempt"]) == ("other", 2)
    with pytest.raises(NoCurrentJob):  # reset after each attempt
        cronlock.current_job()


@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_job_cancel_ends_the_job_cancelled_never_retried(
    database: Database, commit_mode: str
) -> None:
    async with job_app(database) as app:
        done = await app.enqueue("gives_up", {"reason": "user 7 is gone"})
        fine = await app.enqueue("noop", {})
        result = await app.drain(commit_mode=commit_mode)
        assert result.status is cronlock.RunStatus.COMPLETED  # an outcome, not a failure
        stats = result.stats
        assert (stats["processed"], stats["cancelled"], stats["failed"], stats["retried"]) == (
            1,
            1,
            0,
            0,
        )
        [job] = await job_rows(database, id=done.id)
        assert job["status"] == "cancelled" and job["completed_at"] is not None
        assert (job["retry_count"], job["next_retry_at"]) == (0, None)
        assert job["error_message"] == "cancelled by its handler: user 7 is gone"
        [entry] = job["error_history"]
        assert (entry["attempt"], entry["outcome"], entry["error"]) == (
            1,
            "cancelled",
            "cancelled by its handler: user 7 is gone",
        )
        assert await _log_count(database, "gives_up") == 1  # its writes committed with it
        later = datetime.now(UTC) + timedelta(days=2)
        assert (await app.drain(clock=at(later))).stats["processed"] == 0  # never again
        assert (await app.get_job(fine.id)).status is JobStatus.COMPLETED  # type: ignore[union-attr]
        # Not a failed job: a retry does not apply to it.
        assert (await app.retry_job(done.id)).outcome.value == "wrong_status"


@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_job_snooze_runs_again_later_without_counting_an_attempt(
    database: Database, commit_mode: str
) -> None:
    start = datetime.now(UTC) + timedelta(seconds=5)  # after the enqueues below
    async with job_app(database) as app:
        # max_retries=0: a counted attempt would be its last; it snoozes twice, then runs.
        job_id = (await app.enqueue("snoozy", {"key": "a", "times": 3})).id
        first = await app.drain(commit_mode=commit_mode, clock=at(start))
        assert first.status is cronlock.RunStatus.COMPLETED
        assert (first.stats["snoozed"], first.stats["processed"]) == (1, 0)
        [job] = await job_rows(database, id=job_id)
        assert (job["status"], job["retry_count"], job["completed_at"]) == ("pending", 0, None)
        assert job["run_at"] == start + timedelta(seconds=60)
        # Not due before its delay is over.
        soon = start + timedelta(seconds=30)
        assert (await app.drain(commit_mode=commit_mode, clock=at(soon))).stats["snoozed"] == 0
        then = start + timedelta(seconds=61)
        assert (await app.drain(commit_mode=commit_mode, clock=at(then))).stats["snoozed"] == 1
        last = then + timedelta(seconds=61)
        done = await app.drain(commit_mode=commit_mode, clock=at(last))
        assert (done.stats["processed"], done.stats["failed"]) == (1, 0)
        [job] = await job_rows(database, id=job_id)
        assert job["status"] == "completed" and job["retry_count"] == 0
        assert job["result"] == {"runs": 3, "attempt": 1}  # still its first counted attempt
        assert [(e["attempt"], e["outcome"]) for e in job["error_history"]] == [
            (1, "snoozed"),
            (1, "snoozed"),
        ]
        assert job["error_history"][0]["until"] == (start + timedelta(seconds=60)).isoformat()
        assert await _log_count(database, "snoozy:a") == 3


async def test_a_snoozed_retrying_job_stays_retrying(database: Database) -> None:
    start = datetime.now(UTC) + timedelta(seconds=5)  # after the enqueues below
    async with job_app(database) as app:
        job_id = (await app.enqueue("snoozy", {"key": "r", "times": 2})).id
        async with database.engine.begin() as conn:  # as a failed first attempt leaves it
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(status="retrying", retry_count=1, max_retries=1)
            )
        await app.drain(clock=at(start))
        [job] = await job_rows(database, id=job_id)
        assert (job["status"], job["retry_count"]) == ("retrying", 1)
        assert job["error_history"][-1]["attempt"] == 2


async def test_a_batch_mixes_every_outcome_in_one_commit(database: Database) -> None:
    start = datetime.now(UTC) + timedelta(seconds=5)  # after the enqueues below
    async with job_app(database) as app:
        ids = {
            "noop": (await app.enqueue("noop", {})).id,
            "gives_up": (await app.enqueue("gives_up", {})).id,
            "snoozy": (await app.enqueue("snoozy", {"key": "b", "times": 2})).id,
            "always_fail": (await app.enqueue("always_fail", {})).id,
        }
        result = await app.drain(commit_mode="batch", clock=at(start))
        stats = result.stats
        assert (stats["processed"], stats["cancelled"], stats["snoozed"], stats["retried"]) == (
            1,
            1,
            1,
            1,
        )
        assert result.status is cronlock.RunStatus.PARTIAL  # the failure, not the others
        statuses = {name: (await app.get_job(i)).status.value for name, i in ids.items()}  # type: ignore[union-attr]
        assert statuses == {
            "noop": "completed",
            "gives_up": "cancelled",
            "snoozy": "pending",
            "always_fail": "retrying",
        }
        assert (await app.get_job(ids["gives_up"])).error_message == "cancelled by its handler"  # type: ignore[union-attr]


async def test_outcomes_in_jobs_show_metrics_and_http(
    database: Database, database_url: str
) -> None:
    start = datetime.now(UTC) + timedelta(seconds=5)  # after the enqueues below
    async with job_app(database) as app:
        cancelled = (await app.enqueue("gives_up", {"reason": "gone"})).id
        snoozed = (await app.enqueue("snoozy", {"key": "c", "times": 5})).id
        await app.drain(clock=at(start))
        later = start + timedelta(seconds=61)
        await app.drain(clock=at(later))

        shown = await invoke_async(*APP, "jobs", "show", str(cancelled), database_url=database_url)
        assert shown.returncode == 0, shown.stderr
        assert "status      cancelled" in shown.stdout
        assert "attempt 1 at" in shown.stdout and "cancelled: cancelled by its handler: gone" in (
            shown.stdout
        )
        args = ("jobs", "show", str(snoozed), "--json")
        shown = await invoke_async(*APP, *args, database_url=database_url)
        history = json.loads(shown.stdout)["error_history"]
        assert [e["outcome"] for e in history] == ["snoozed", "snoozed"]
        shown = await invoke_async(*APP, "jobs", "show", str(snoozed), database_url=database_url)
        assert shown.stdout.count("snoozed until") == 2

        text = render_metrics(await scrape(app.database)).decode()
        assert 'cronlock_jobs_cancelled_total{queue="default"} 1.0' in text
        assert 'cronlock_jobs_snoozed_total{queue="default"} 2.0' in text

        transport = httpx.ASGITransport(app=create_api(app, token="t", read_token="r"))
        async with httpx.AsyncClient(transport=transport, base_url="http://cronlock") as http:
            answer = await http.get(f"/jobs/{snoozed}", headers={"Authorization": "Bearer r"})
        assert answer.status_code == 200, answer.text
        assert [e["outcome"] for e in answer.json()["error_history"]] == ["snoozed", "snoozed"]


def test_drain_command_counts_the_outcomes(database_url: str) -> None:
    on_database(database_url, create_job_tables)
    for args in (("gives_up", "{}"), ("snoozy", '{"key": "d", "times": 2}')):
        assert invoke(*APP, "enqueue", *args, database_url=database_url).returncode == 0
    done = invoke(*APP, "drain", "--json", database_url=database_url)
    assert done.returncode == 0, done.stderr  # neither is a failure: exit 0, not 3
    report: dict[str, Any] = json.loads(done.stdout)
    assert (report["status"], report["cancelled"], report["snoozed"]) == ("completed", 1, 1)
    assert (report["failed"], report["retried"]) == (0, 0)
