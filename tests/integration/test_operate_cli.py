"""Operating the queue from the shell: cronlock jobs …, queue …, prune; JSON, exit codes, the
confirmation of bulk changes, bad input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cli import ROOT, cli_env, cronlock_command, invoke, invoke_async, run_cli
from jobsupport import job_app, job_rows
from sqlalchemy import insert
from waiting import eventually

from cronlock import Database
from cronlock.sql.tables import jobs, workers

APP = ("--app", "testapps.jobs")


async def cli(
    *args: str, database_url: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The command, in this process; with ``stdin`` as its input, in a process of its own
    (without: no input at all, as under cron)."""
    if stdin is None:
        return await invoke_async(*APP, *args, database_url=database_url)
    return await asyncio.to_thread(
        subprocess.run,
        cronlock_command(*APP, *args),
        cwd=ROOT,
        env=cli_env(database_url),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.stdout.count("\n") == 1, done.stdout
    return json.loads(done.stdout)


async def _failed(database: Database, count: int, **values: Any) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(
            insert(jobs),
            [
                {
                    "job_type": "noop",
                    "payload": {"n": n},
                    "status": "failed",
                    "error_message": "ValueError: boom",
                    "completed_at": datetime.now(UTC),
                    **values,
                }
                for n in range(count)
            ],
        )


async def test_list_show_and_pages(database: Database, database_url: str) -> None:
    async with job_app(database) as app:
        ids = [str((await app.enqueue("noop", {"n": n})).id) for n in range(3)]
    page = as_json(await cli("jobs", "list", "--limit", "2", "--json", database_url=database_url))
    assert [j["id"] for j in page["jobs"]] == [ids[2], ids[1]] and page["next_cursor"]
    rest = await cli(
        "jobs", "list", "--json", "--cursor", page["next_cursor"], database_url=database_url
    )
    assert [j["id"] for j in as_json(rest)["jobs"]] == [ids[0]]
    text = await cli(
        "jobs", "list", "--status", "pending", "--type", "noop", database_url=database_url
    )
    assert text.returncode == 0 and text.stdout.splitlines()[0].startswith("ID")
    assert len(text.stdout.splitlines()) == 4
    none = await cli("jobs", "list", "--status", "failed", database_url=database_url)
    assert none.stdout.strip() == "no jobs match"

    shown = as_json(await cli("jobs", "show", ids[0], "--json", database_url=database_url))
    assert (shown["id"], shown["status"], shown["payload"]) == (ids[0], "pending", {"n": 0})
    assert (
        "status      pending"
        in (await cli("jobs", "show", ids[0], database_url=database_url)).stdout
    )
    missing = await cli(
        "jobs", "show", "00000000-0000-0000-0000-000000000001", database_url=database_url
    )
    assert missing.returncode == 1 and "no job" in missing.stderr


async def test_one_job_exit_codes(database: Database, database_url: str) -> None:
    async with job_app(database) as app:
        job_id = str((await app.enqueue("noop", {})).id)
    cancelled = await cli("jobs", "cancel", job_id, "--json", database_url=database_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert as_json(cancelled)["outcome"] == "cancelled"
    again = await cli("jobs", "cancel", job_id, database_url=database_url)
    assert again.returncode == 1 and "wrong_status" in again.stdout
    retried = await cli("jobs", "retry", job_id, database_url=database_url)
    assert retried.returncode == 1
    deleted = await cli("jobs", "delete", job_id, "--json", database_url=database_url)
    assert (deleted.returncode, as_json(deleted)["outcome"]) == (0, "deleted")
    assert await job_rows(database) == []


async def test_bulk_changes_ask_first(database: Database, database_url: str) -> None:
    async with job_app(database):
        pass
    await _failed(database, 3)
    # No terminal and no answer (cron): nothing changes, exit 1.
    refused = await cli("jobs", "retry", "--status", "failed", database_url=database_url)
    assert refused.returncode == 1, refused.stderr
    assert "retry 3 job(s)?" in refused.stderr and "nothing changed" in refused.stdout
    said_no = await cli("jobs", "retry", database_url=database_url, stdin="n\n")
    assert said_no.returncode == 1
    assert {r["status"] for r in await job_rows(database)} == {"failed"}
    said_yes = await cli("jobs", "retry", "--json", database_url=database_url, stdin="y\n")
    assert said_yes.returncode == 0, said_yes.stderr
    assert as_json(said_yes) == {"verb": "retry", "matched": 3, "changed": 3, "unchanged": {}}
    cancelled = await cli(
        "jobs", "cancel", "--queue", "default", "--yes", database_url=database_url
    )
    assert cancelled.returncode == 0 and "3 of 3 job(s) cancelled" in cancelled.stdout
    nothing = await cli("jobs", "cancel", "--yes", "--json", database_url=database_url)
    assert nothing.returncode == 0 and as_json(nothing)["matched"] == 0
    gone = await cli("jobs", "delete", "--status", "cancelled", "--yes", database_url=database_url)
    assert gone.returncode == 0 and await job_rows(database) == []


async def test_a_bulk_change_that_leaves_some_alone_exits_3(
    database: Database, database_url: str
) -> None:
    async with job_app(database):
        pass
    await _failed(database, 2, dedup_key="same")
    done = await cli("jobs", "retry", "--yes", "--json", database_url=database_url)
    assert done.returncode == 3, done.stderr
    report = as_json(done)
    assert (report["changed"], report["unchanged"]) == (1, {"dedup_key_held": 1})


async def test_bad_input_is_one_line_and_exit_2(database: Database, database_url: str) -> None:
    async with job_app(database):
        pass
    for args in (
        ("jobs", "list", "--status", "lost"),
        ("jobs", "list", "--since", "yesterday"),
        ("jobs", "list", "--since", "2026-01-01T00:00:00"),
        ("jobs", "list", "--cursor", "nope"),
        ("jobs", "show", "not-an-id"),
        ("jobs", "retry", "00000000-0000-0000-0000-000000000001", "--queue", "q"),
        ("jobs", "delete", "--status", "pending", "--yes"),
        ("queue", "pause", "x" * 201),
        ("enqueue", "nope", "{}"),
    ):
        done = await cli(*args, database_url=database_url)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith("Error: "), done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""


async def test_queue_pause_resume_list(database: Database, database_url: str) -> None:
    async with job_app(database) as app:
        await app.enqueue("noop", {})
    paused = await cli("queue", "pause", "default", "--json", database_url=database_url)
    assert paused.returncode == 0, paused.stderr
    assert as_json(paused)["paused"] is True and as_json(paused)["changed"] is True
    assert (
        "already was" in (await cli("queue", "pause", "default", database_url=database_url)).stdout
    )
    drained = run_cli(*APP, "drain", "--json", database_url=database_url)
    report = json.loads(drained.stdout)
    assert report["processed"] == 0  # paused: nothing claimed, and it says so
    assert (report["status"], report["paused"], drained.returncode) == ("skipped", True, 0)
    assert "queue default is paused" in report["skip_reason"]
    line = run_cli(*APP, "drain", database_url=database_url)
    assert "skipped (queue default is paused" in line.stdout and line.returncode == 0
    flagged = run_cli(*APP, "drain", "--skipped-exit-code", "75", database_url=database_url)
    assert flagged.returncode == 75, flagged.stdout
    listed = as_json(await cli("queue", "list", "--json", database_url=database_url))
    [queue] = [q for q in listed["queues"] if q["queue"] == "default"]
    assert queue["paused"] and queue["counts"] == {"pending": 1} and queue["handled_here"]
    assert "paused" in (await cli("queue", "list", database_url=database_url)).stdout
    status = await invoke_async(*APP, "status", database_url=database_url)
    assert "PAUSED since" in status.stdout
    resumed = await cli("queue", "resume", "default", "--json", database_url=database_url)
    assert as_json(resumed)["paused"] is False
    drained = run_cli(*APP, "drain", "--json", database_url=database_url)
    assert json.loads(drained.stdout)["processed"] == 1
    assert json.loads(drained.stdout)["paused"] is False


async def test_a_typod_queue_is_refused_and_a_made_one_can_be_deleted(
    database: Database, database_url: str
) -> None:
    async with job_app(database) as app:
        await app.enqueue("noop", {}, queue="busy")
    typo = await cli("queue", "pause", "nosuchqueue", database_url=database_url)
    assert typo.returncode == 2 and typo.stdout == ""
    [line] = typo.stderr.strip().splitlines()
    assert "no queue 'nosuchqueue'" in line and "--create" in line
    listed = as_json(await cli("queue", "list", "--json", database_url=database_url))
    assert "nosuchqueue" not in {q["queue"] for q in listed["queues"]}
    # A queue jobs or a drainer (another app's worker) name is known without a row; --create
    # makes one nothing knows of.
    assert (await cli("queue", "pause", "busy", database_url=database_url)).returncode == 0
    async with database.engine.begin() as conn:
        await conn.execute(insert(workers).values(id=uuid.uuid4(), queue="remote", state="standby"))
    assert (await cli("queue", "pause", "remote", database_url=database_url)).returncode == 0
    made = await cli("queue", "pause", "later", "--create", "--json", database_url=database_url)
    assert made.returncode == 0 and as_json(made)["paused"] is True
    # Delete: refused while jobs name the queue, done for the empty one, then nothing to do.
    busy = await cli("queue", "delete", "busy", database_url=database_url)
    assert busy.returncode == 1 and "jobs name it" in busy.stdout
    gone = await cli("queue", "delete", "later", "--json", database_url=database_url)
    assert gone.returncode == 0 and as_json(gone) == {
        "queue": "later",
        "deleted": True,
        "was_paused": True,
        "has_jobs": False,
        "detail": "",
    }
    again = await cli("queue", "delete", "later", database_url=database_url)
    assert again.returncode == 1 and "nothing to delete" in again.stdout
    listed = as_json(await cli("queue", "list", "--json", database_url=database_url))
    assert {q["queue"] for q in listed["queues"]} >= {"busy"}
    assert "later" not in {q["queue"] for q in listed["queues"]}


async def test_prune_by_hand_says_what_it_removed(database: Database, database_url: str) -> None:
    async with job_app(database):
        pass
    old = datetime.now(UTC) - timedelta(days=40)
    await _failed(database, 2, completed_at=old)
    async with database.engine.begin() as conn:
        await conn.execute(
            insert(jobs).values(job_type="noop", payload={}, status="completed", completed_at=old)
        )
    dry = await cli("prune", "--dry-run", "--json", database_url=database_url)
    assert dry.returncode == 0, dry.stderr
    report = as_json(dry)
    assert (report["dry_run"], report["completed_jobs"], report["failed_jobs"]) == (True, 1, 2)
    assert len(await job_rows(database)) == 3
    done = await cli("prune", database_url=database_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("prune: removed 1 completed, 2 failed and 0 cancelled job(s)")
    assert await job_rows(database) == []
    again = await invoke_async(*APP, "run", "prune", "--json", database_url=database_url)
    assert again.returncode == 0 and json.loads(again.stdout)["completed_jobs"] == 0


def test_list_and_crontab_show_the_builtin_prune() -> None:
    listed = invoke(*APP, "list", "--json", database_url=None)
    assert listed.returncode == 0, listed.stderr
    [prune] = json.loads(listed.stdout)["builtin"]
    assert (prune["name"], prune["cron"]) == ("prune", "17 * * * *")
    assert prune["retention"]["completed_s"] == 7 * 86400
    assert prune["retention"]["failed_s"] == 30 * 86400
    text = invoke(*APP, "list", database_url=None)
    assert "prune (17 * * * * UTC; next " in text.stdout
    assert "completed jobs after 7 d, failed and cancelled after 30 d" in text.stdout


async def test_enqueue_an_unknown_type_only_when_allowed(
    database: Database, database_url: str
) -> None:
    async with job_app(database):
        pass
    done = await invoke_async(
        *APP, "enqueue", "elsewhere", "{}", "--allow-unknown", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    assert "has no handler or declaration in this app" in done.stderr
    [row] = await job_rows(database)
    assert (row["job_type"], row["queue"]) == ("elsewhere", "default")


async def test_cancel_of_a_job_a_worker_process_is_running(
    database: Database, database_url: str, tmp_path: Any
) -> None:
    """A real ``cronlock worker``: the cancel reaches it by NOTIFY, its handler is stopped and
    rolled back (exit 0, cancelled); a second job's cancel that cannot wait exits 3 and the
    request still stops it; the worker goes on with the next job and exits 0 on SIGTERM."""
    from cli import finish, kill_all, start_cli
    from waiting import wait_for

    async with job_app(database) as app:
        first = str((await app.enqueue("gated", {"n": 1})).id)
        second = str((await app.enqueue("gated", {"n": 2})).id)
    started, release = tmp_path / "started", tmp_path / "release"
    gate = {"GATE_STARTED": str(started), "GATE_RELEASE": str(release)}
    worker = start_cli(*APP, "worker", database_url=database_url, **gate)
    try:
        await asyncio.to_thread(wait_for, started.exists, timeout=30)
        done = await cli("jobs", "cancel", first, "--json", database_url=database_url)
        assert done.returncode == 0, done.stderr
        assert (as_json(done)["outcome"], as_json(done)["status"]) == ("cancelled", "cancelled")
        await asyncio.to_thread(wait_for, lambda: started.read_text() == "2", timeout=30)
        asked = await cli("jobs", "cancel", second, "--wait", "0", database_url=database_url)
        assert asked.returncode == 3, asked.stderr
        assert "cancel_requested" in asked.stdout
        bad = await cli("jobs", "cancel", second, "--wait", "-1", database_url=database_url)
        assert bad.returncode == 2
        async with job_app(database) as app:
            after = (await app.enqueue("count", {"n": 3})).id
            await eventually(lambda: _status_is(app, after, "completed"), timeout=30)
        worker.terminate()
        code, _, stderr = await asyncio.to_thread(finish, worker)
        assert code == 0, stderr
    finally:
        kill_all(worker)
    rows = {str(row["id"]): row for row in await job_rows(database)}
    assert rows[first]["status"] == rows[second]["status"] == "cancelled"
    shown = await cli("jobs", "show", first, database_url=database_url)
    assert "cancelled: cancelled by an operator while running" in shown.stdout
    assert not release.exists()


async def _status_is(app: Any, job_id: Any, status: str) -> bool:
    job = await app.get_job(job_id)
    return job is not None and job.status.value == status
