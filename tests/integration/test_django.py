"""Issue 24, item 3: a Django project on PostgreSQL enqueues with ``django.tasks``, a cronlock
worker runs the tasks, and ``get_result`` returns their outcome.

The project is tests/support/djangosite, on this test's database. Django's settings are the
process's: here they are configured once (``settings.configure`` from the project's settings
module, so that nothing else of the process changes, not its time zone) and each test points
the one database entry at its own database, as Django's test runner does for its test
database. The commands run as a user runs them: ``manage.py cronlock …`` in a subprocess, or
in this process on the same settings.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import django
import pytest
from cli import finish, kill_all
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone
from isolation import process_state
from waiting import wait_for

from cronlock import App, RunStatus, Scheduler
from cronlock.outcome import DrainResult

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "support" / "djangosite"


def _configure() -> None:
    if settings.configured:
        return
    from djangosite import settings as site

    settings.configure(**{name: getattr(site, name) for name in dir(site) if name.isupper()})
    django.setup()


@pytest.fixture
def site(database_url: str) -> Iterator[str]:
    """Django in this process on this test's database, the shop's table migrated; every
    connection of this thread closed after (the handlers' threads close their own)."""
    _configure()
    from djangosite.settings import database

    connections.close_all()
    settings.DATABASES["default"].update(database(database_url))
    call_command("migrate", verbosity=0)
    try:
        yield database_url
    finally:
        connections.close_all()


class Rollback(Exception):
    pass


def project_app() -> App:
    from cronlock.contrib.django.worker import project_app

    return project_app()


def drain(**options: Any) -> DrainResult:
    """The project's drain, in this process (its handlers in threads, as a worker's are)."""
    app = project_app()

    async def go() -> DrainResult:
        try:
            return await app.drain(**options)
        finally:
            await app.aclose()

    return asyncio.run(go())


def jobs_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cronlock.jobs")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def manage_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRONLOCK_", "DJANGO"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "support"), str(ROOT)])
    env["DJANGOSITE_DATABASE_URL"] = database_url
    env.update(extra)
    return env


def manage(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SITE / "manage.py"), *args],
        cwd=SITE,
        env=manage_env(database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_job_exists_if_and_only_if_its_atomic_block_commits(site: str) -> None:
    from djangosite.shop.tasks import add

    from cronlock.contrib.django.api import TaskResultDoesNotExist, TaskResultStatus

    with pytest.raises(Rollback), transaction.atomic():
        gone = add.enqueue(2, 3)
        # The enqueuing block sees its own job (the same connection).
        assert add.get_result(gone.id).status == TaskResultStatus.READY
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(gone.id)
    assert jobs_count() == 0

    with transaction.atomic():
        kept = add.enqueue(2, 3)
        # Not committed: the worker, on connections of its own, does not see it.
        assert drain().stats["processed"] == 0
    assert drain().stats["processed"] == 1

    result = add.get_result(kept.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert (result.attempts, result.errors) == (1, [])
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.enqueued_at is not None and result.finished_at is not None
    assert result.started_at is not None and result.enqueued_at <= result.started_at
    assert result.backend == "default" and result.task.func is add.func


def test_manage_py_cronlock_in_this_process(site: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The command's two ways in: ``manage.py`` (``run_from_argv``, Django's own options taken
    out) and ``call_command``; cronlock's exit code either way."""
    from djangosite.shop.tasks import add

    from cronlock.contrib.django.management.commands.cronlock import Command

    first, second = add.enqueue(1, 2), add.enqueue(3, 4)
    argv = ["manage.py", "cronlock", "--settings=djangosite.settings", "drain", "--json"]
    with process_state(), pytest.raises(SystemExit) as drained:
        Command().run_from_argv(argv)
    assert drained.value.code == 0
    assert json.loads(capsys.readouterr().out)["processed"] == 2
    assert [add.get_result(r.id).return_value for r in (first, second)] == [3, 7]

    with process_state(), pytest.raises(SystemExit) as listed:
        call_command("cronlock", "list")
    assert listed.value.code == 0
    assert "djangosite.shop.tasks.add " in capsys.readouterr().out


def test_priority_queue_and_run_after_are_the_jobs(site: str) -> None:
    from djangosite.shop.tasks import report

    from cronlock.contrib.django.api import TaskResultStatus

    later = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    deferred = report.using(run_after=later).enqueue("q3", pages=4)
    low = report.using(priority=-100).enqueue("low")
    high = report.using(priority=100).enqueue("high")
    with connection.cursor() as cursor:
        cursor.execute("SELECT id::text, job_type, priority, queue, run_at FROM cronlock.jobs")
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    path = "djangosite.shop.tasks.report"
    assert rows[deferred.id] == (path, 7, "reports", later)  # the task's priority and queue
    assert rows[low.id][1] == -100 and rows[high.id][1] == 100

    waiting = report.get_result(deferred.id)
    assert waiting.status == TaskResultStatus.READY
    assert (waiting.task.priority, waiting.task.queue_name) == (7, "reports")
    assert waiting.task.run_after == later
    assert (waiting.args, waiting.kwargs, waiting.attempts) == (["q3"], {"pages": 4}, 0)

    assert drain().stats["processed"] == 0  # the default queue has none of them
    assert drain(queue="reports").stats["processed"] == 2  # the deferred one is not due
    assert report.get_result(deferred.id).status == TaskResultStatus.READY
    first, second = (report.get_result(r.id) for r in (high, low))
    assert first.return_value == {"report": "high", "pages": 1}
    assert first.started_at is not None and second.started_at is not None
    assert first.started_at <= second.started_at  # higher priority first


def test_a_failing_task_s_errors_and_a_second_attempt(site: str) -> None:
    from djangosite.shop.errors import OutOfStock
    from djangosite.shop.models import Order
    from djangosite.shop.tasks import second_time_lucky, sell

    from cronlock.contrib.django.api import TaskResultStatus

    failing = sell.enqueue("tea")
    assert drain().stats["failed"] == 1
    result = sell.get_result(failing.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1 and result.finished_at is not None
    [error] = result.errors
    assert error.exception_class_path == "djangosite.shop.errors.OutOfStock"
    assert error.exception_class is OutOfStock
    assert "no tea left" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value

    lucky = second_time_lucky.enqueue("lucky")
    assert drain().stats["failed"] == 1
    app = project_app()

    async def retry() -> None:
        try:
            await app.retry_job(lucky.id)
        finally:
            await app.aclose()

    asyncio.run(retry())
    assert drain().stats["processed"] == 1
    again = second_time_lucky.get_result(lucky.id)
    assert again.status == TaskResultStatus.SUCCESSFUL and again.return_value == "second"
    assert again.attempts == 2
    assert [e.exception_class_path for e in again.errors] == ["builtins.RuntimeError"]
    # The failed attempt's ORM write committed on Django's connection all the same.
    assert Order.objects.filter(note="lucky").count() == 1


@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
def test_every_commit_mode_runs_the_tasks_and_records_their_outcomes(
    site: str, commit_mode: str
) -> None:
    from djangosite.shop.models import Order
    from djangosite.shop.tasks import record, sell

    from cronlock.contrib.django.api import TaskResultStatus

    done, failed = record.enqueue(commit_mode), sell.enqueue(commit_mode)
    result = drain(commit_mode=commit_mode)
    assert (result.stats["processed"], result.stats["failed"]) == (1, 1)
    assert record.get_result(done.id).return_value == 1
    assert Order.objects.filter(note=commit_mode).count() == 1
    lost = sell.get_result(failed.id)
    assert lost.status == TaskResultStatus.FAILED and lost.attempts == 1
    assert [e.exception_class_path for e in lost.errors] == ["djangosite.shop.errors.OutOfStock"]


def test_context_the_orm_and_async_tasks_in_the_worker_threads(site: str) -> None:
    from djangosite.shop.models import Order
    from djangosite.shop.tasks import add_later, backend_pid, record, which_attempt

    context = which_attempt.enqueue()
    recorded = record.enqueue("from a task")
    later = add_later.enqueue(1, 2)
    pids = [backend_pid.enqueue() for _ in range(2)]
    assert drain(threads=1).stats["processed"] == 5

    assert which_attempt.get_result(context.id).return_value == {
        "attempt": 1,
        "id": context.id,
    }
    assert record.get_result(recorded.id).return_value == 1
    assert Order.objects.filter(note="from a task").count() == 1
    summed: object = add_later.get_result(later.id).return_value  # an async def task's
    assert summed == 3
    # One thread ran both, and closed its connection after each (CONN_MAX_AGE = 0), as a
    # request's end does; none is left open (the database fixture checks).
    first, second = (backend_pid.get_result(r.id).return_value for r in pids)
    assert first != second


def test_a_task_outside_the_task_modules_is_refused_at_the_enqueue(site: str) -> None:
    from djangosite.shop import errors

    from cronlock.contrib.django.api import InvalidTask, Task

    def stray() -> None:
        pass

    stray.__module__ = errors.__name__
    stray.__qualname__ = "stray"
    task = Task(func=stray)
    with pytest.raises(InvalidTask, match=r"djangosite\.shop\.errors"):
        task.enqueue()
    assert jobs_count() == 0


def test_the_periodic_task_runs_for_its_slot_under_the_scheduler(site: str) -> None:
    from djangosite.shop.models import Order

    app = project_app()
    nightly = app.task("shop-nightly")
    assert nightly.schedule.expression == "0 3 * * *"

    async def wake() -> list[Any]:
        try:
            scheduler = Scheduler(app, app.database, tasks=["shop-nightly"])
            return await scheduler.wake(nightly, now=datetime(2026, 12, 3, 3, 0, 5, tzinfo=UTC))
        finally:
            await app.aclose()

    [run] = asyncio.run(wake())
    assert run.status is RunStatus.COMPLETED
    assert Order.objects.filter(note="nightly 2026-12-03").count() == 1


def test_manage_py_cronlock_worker_runs_what_the_site_enqueues(site: str) -> None:
    from djangosite.shop.tasks import add, sell

    from cronlock.contrib.django.api import TaskResultStatus

    worker = subprocess.Popen(
        [sys.executable, str(SITE / "manage.py"), "cronlock", "worker"],
        cwd=SITE,
        env=manage_env(site),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with transaction.atomic():
            done = add.enqueue(20, 22)
            failed = sell.enqueue("milk")
        finished = wait_for(
            lambda: add.get_result(done.id).is_finished and sell.get_result(failed.id).is_finished,
            timeout=60,
        )
        assert finished
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker)
    finally:
        kill_all(worker)
    assert code == 0, err
    assert add.get_result(done.id).return_value == 42
    result = sell.get_result(failed.id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["djangosite.shop.errors.OutOfStock"]
    # Django's task_finished receiver logged the failure with its traceback.
    assert 'raise OutOfStock(f"no {item} left")' in err


def test_cronlock_with_django_settings_module_drains_the_project(site: str) -> None:
    from djangosite.shop.tasks import add

    result = add.enqueue(1, 1)
    drained = subprocess.run(
        [sys.executable, "-m", "cronlock", "--app", "cronlock.contrib.django", "drain", "--json"],
        cwd=SITE,
        env=manage_env(site, DJANGO_SETTINGS_MODULE="djangosite.settings"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert drained.returncode == 0, drained.stderr
    assert json.loads(drained.stdout)["processed"] == 1
    assert add.get_result(result.id).return_value == 2

    unset = subprocess.run(
        [sys.executable, "-m", "cronlock", "--app", "cronlock.contrib.django", "list"],
        cwd=SITE,
        env=manage_env(site),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert unset.returncode == 2
    assert unset.stderr.count("\n") == 1 and "DJANGO_SETTINGS_MODULE" in unset.stderr


def test_the_crontab_lines_run_the_periodic_task_through_manage_py(
    site: str, tmp_path: Path
) -> None:
    from djangosite.shop.models import Order

    log = tmp_path / "cron.log"
    printed = manage("cronlock", "crontab", "--log", str(log), database_url=site)
    assert printed.returncode == 0, printed.stderr
    [line] = [ln for ln in printed.stdout.splitlines() if ln.startswith("0 3 * * *")]
    command = line.removeprefix("0 3 * * *").strip()
    assert f"{SITE / 'manage.py'} cronlock --app cronlock.contrib.django:app run shop-nightly" in (
        command
    )
    assert any("drain --max-seconds 55" in ln for ln in printed.stdout.splitlines())

    # The line as cron runs it (sh, from anywhere): now is outside 03:00's slot.
    ran = subprocess.run(
        ["sh", "-c", command],
        cwd="/",
        env=manage_env(site),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, log.read_text()
    assert "no_slot" in log.read_text() or "skipped" in log.read_text()

    manual = manage("cronlock", "run", "shop-nightly", "--manual", "--json", database_url=site)
    assert manual.returncode == 0, manual.stderr
    assert json.loads(manual.stdout)["status"] == "completed"
    assert Order.objects.filter(note="nightly").count() == 1
