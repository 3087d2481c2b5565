"""``cronlock task …``: control of periodic tasks for every scheduler and crontab line.

    task pause TASK [--by WHO]     its slots are recorded skipped (paused) until resumed
    task resume TASK               its next slot runs
    task run-now TASK              one manual run now, under the task's lock (``run --manual``)
    task parked TASK [--retry KEY | --clear KEY | --clear-all]
                                   its failing items, parked ones first; or give one another try

Exit codes are the other commands': 0 done, 2 an unknown task or bad usage; ``run-now`` exits
as ``run`` does (1 failed, 3 partial); ``--retry``/``--clear`` of a key with nothing to change
exits 1.
"""

from __future__ import annotations

import click

from ..app import App
from ..outcome import RunResult
from ..periodic.control import FailingItem, TaskState
from . import render
from .context import EXIT_FAILED, EXIT_OK, Options, emit, exit_with, pass_options, run_ready
from .runs import report_run

__all__ = ["task_group"]

_json = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


@click.group("task")
def task_group() -> None:
    """Pause, resume or run a periodic task now, everywhere; list its parked items."""


def _app(options: Options, task: str) -> App:
    app = options.load_app()
    app.task(task)  # an unknown task fails before any connection is made
    options.database(app)
    return app


def _state_line(state: TaskState) -> str:
    if state.paused:
        what = "paused" if state.changed else "already paused"
        since = f"{state.paused_at:%Y-%m-%d %H:%M:%S %Z}"
        return f"{state.name}: {what} by {state.paused_by} since {since}"
    return f"{state.name}: {'resumed' if state.changed else 'not paused'}"


def _pause_command(name: str, pause: bool) -> click.Command:
    @task_group.command(name)
    @click.argument("task")
    @_json
    @pass_options
    def command(options: Options, task: str, as_json: bool, by: str | None = None) -> None:
        app = _app(options, task)
        state: TaskState = run_ready(
            app, lambda: app.tasks.pause(task, by=by) if pause else app.tasks.resume(task)
        )
        emit(as_json, state.to_dict(), _state_line(state))

    return command


pause = click.option("--by", help="Who pauses it, as status shows (default: user@host).")(
    _pause_command("pause", True)
)
pause.help = """Pause TASK for every scheduler and crontab line: from now on its slots are
    recorded skipped (paused), so its history stays whole, and it is not overdue. A manual
    run (run-now) still runs."""
resume = _pause_command("resume", False)
resume.help = """Resume TASK: its next slot runs."""


@task_group.command("run-now")
@click.argument("task")
@_json
@pass_options
def run_now(options: Options, task: str, as_json: bool) -> None:
    """One run of TASK now, here, under its lock (as `cronlock run TASK --manual`): skipped
    while another run holds the lock; it runs even while TASK is paused."""
    app = _app(options, task)
    result: RunResult = run_ready(app, lambda: app.tasks.run_now(task))
    report_run(result, as_json)


def _item_rows(items: list[FailingItem]) -> list[str]:
    rows: list[tuple[str, ...]] = [("ITEM", "STATE", "FAILURES", "LAST FAILED", "ERROR")]
    for item in items:
        rows.append(
            (
                item.item,
                "parked" if item.parked else "failing",
                str(item.failures),
                f"{item.last_failed_at:%Y-%m-%d %H:%M:%S %Z}",
                item.error[:120],
            )
        )
    return render.table(rows)


@task_group.command("parked")
@click.argument("task")
@click.option("--retry", "retry_key", metavar="KEY", help="Unpark KEY: the next run tries it.")
@click.option("--clear", "clear_key", metavar="KEY", help="Forget KEY's failures altogether.")
@click.option("--clear-all", is_flag=True, help="Forget every failing item of TASK.")
@_json
@pass_options
def parked(
    options: Options,
    task: str,
    retry_key: str | None,
    clear_key: str | None,
    clear_all: bool,
    as_json: bool,
) -> None:
    """TASK's failing items, parked ones first, with their last error; or, with --retry KEY,
    let the next run try KEY again (one more failure parks it again), or with --clear KEY /
    --clear-all forget the failures (the count starts again)."""
    if sum((retry_key is not None, clear_key is not None, clear_all)) > 1:
        raise click.UsageError("give one of --retry, --clear, --clear-all")
    app = _app(options, task)

    async def go() -> tuple[str, int] | list[FailingItem]:
        if retry_key is not None:
            retried = await app.tasks.retry_parked(task, retry_key)
            return ("retried" if retried else "not parked", int(retried))
        if clear_key is not None or clear_all:
            cleared = await app.tasks.clear_parked(task, clear_key)
            return ("cleared", cleared)
        return await app.tasks.parked(task)

    found = run_ready(app, go)
    if isinstance(found, list):
        lines = _item_rows(found) if found else [f"{task}: no failing items"]
        emit(as_json, {"task": task, "items": [i.to_dict() for i in found]}, *lines)
        return
    word, count = found
    done = f"item {retry_key} {word}" if retry_key is not None else f"{count} item(s) forgotten"
    emit(as_json, {"task": task, "outcome": word, "items": count}, f"{task}: {done}")
    exit_with(EXIT_OK if count or clear_all else EXIT_FAILED)
