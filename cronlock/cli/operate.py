"""Operating the queue from the shell: ``jobs list|show|wait|retry|cancel|delete`` and
``queue list|pause|resume|delete`` (``App.list_jobs``, ``App.retry_job``, ``App.pause_queue``, …).

Every command takes ``--json`` (one JSON object on stdout) and the jobs' filters (``--status``,
``--queue``, ``--type``, ``--since``, ``--until``). ``retry``, ``cancel`` and ``delete`` act on
one job (``ID``) or on every job a filter matches; a change by filter says how many jobs it
would change and asks first, unless ``--yes``.

Exit codes: 0 done (or nothing matched); 1 nothing was changed: the one job is running, not
found or in a status the verb does not act on (a running job cancelled too late: it
completed), or the question was answered no (or could not be asked); 2 usage or configuration
error (one line, nothing changed); 3 partial: a change by filter left some matching jobs alone
(running now, or their dedup key is held), the rest done, or a running job's cancel was
requested but had not stopped it within ``--wait``. ``jobs wait``: 0 the job completed (its
result printed as JSON), 1 it failed, was cancelled or does not exist, 3 not ended within
``--timeout``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

from ..app import App
from ..errors import InvalidJobOption, JobNotFound
from ..outcome import JobStatus
from ..queue import control
from ..queue.cancel import DEFAULT_CANCEL_WAIT
from ..queue.operate import ChangeOutcome, JobChange, JobFilter, JobInfo, JobsChanged
from . import render
from .context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    Options,
    emit,
    exit_with,
    moment,
    pass_options,
    run,
)

__all__ = ["jobs_group", "queue_group"]


def _filters(command: Callable[..., Any]) -> Callable[..., Any]:
    """The jobs' filters, given to ``command`` as one ``where`` (a ``JobFilter``)."""

    @functools.wraps(command)
    def given(
        *args: Any,
        statuses: tuple[str, ...],
        queue: str | None,
        job_type: str | None,
        since: str | None,
        until: str | None,
        **rest: Any,
    ) -> Any:
        where = JobFilter(
            status=statuses or None,
            queue=queue,
            job_type=job_type,
            created_after=moment("--since", since),
            created_before=moment("--until", until),
        )
        return command(*args, where=where, **rest)

    decorated: Callable[..., Any] = given
    statuses = click.Choice([status.value for status in JobStatus])
    for option in reversed(
        [
            click.option("--status", "statuses", multiple=True, type=statuses, help="Repeatable."),
            click.option("--queue", help="Only this queue."),
            click.option("--type", "job_type", help="Only this job type."),
            click.option("--since", help="Created at or after this time (ISO 8601, with zone)."),
            click.option("--until", help="Created before this time (ISO 8601, with zone)."),
        ]
    ):
        decorated = option(decorated)
    return decorated


@click.group("jobs")
def jobs_group() -> None:
    """Find jobs and act on them: list, show, wait, retry, cancel, delete.

    Exit codes: 0 done (or nothing matched), 1 nothing changed (the job is running, not
    found or in the wrong status; a bulk change not confirmed), 2 usage error, 3 partial (a
    change by filter left some matching jobs alone; a running job's cancel requested but not
    stopped within --wait)."""


@jobs_group.command("list")
@_filters
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--cursor", help="The next page: the cursor the previous page printed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_options
def list_jobs(
    options: Options, where: JobFilter, limit: int, cursor: str | None, as_json: bool
) -> None:
    """Jobs newest first, a page at a time (--cursor for the next)."""
    app = options.connected_app()
    page = run(lambda: app.list_jobs(where, limit=limit, cursor=cursor), app)
    emit(as_json, page.to_dict(), *render.job_table(page))


@jobs_group.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_options
def show_job(options: Options, job_id: str, as_json: bool) -> None:
    """One job: its status, payload, result, retries and error history. Exit 1 if none."""
    app = options.connected_app()
    job = run(lambda: app.get_job(job_id), app)
    if job is None:
        if as_json:
            click.echo(json.dumps({"id": job_id, "found": False}))
        else:
            click.echo(f"no job {job_id}", err=True)
        exit_with(EXIT_FAILED)
    emit(as_json, job.to_dict(), *render.job_lines(job))


@jobs_group.command("wait")
@click.argument("job_id")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds to wait at most (exit 3 if the job has not ended by then).  [default: none]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON object.")
@pass_options
def wait_job(options: Options, job_id: str, timeout: float | None, as_json: bool) -> None:
    """Wait for a job to end; print its result. Exit 1 if it failed or was cancelled."""
    app = options.connected_app()

    async def waited() -> JobInfo | None:
        try:
            return await app.wait_for_end(job_id, timeout=timeout)
        except TimeoutError:
            return None

    try:
        job = run(waited, app)
    except JobNotFound:
        click.echo(f"no job {job_id}", err=True)
        exit_with(EXIT_FAILED)
    if job is None:
        click.echo(f"job {job_id} has not ended after {timeout:g} s", err=True)
        exit_with(EXIT_PARTIAL)
    if as_json:
        click.echo(json.dumps(job.to_dict()))
    elif job.status is JobStatus.COMPLETED:
        click.echo(json.dumps(job.result))
    else:
        click.echo(f"job {job.id} {job.status}: {job.error_message or ''}".rstrip(": "), err=True)
    if job.status is not JobStatus.COMPLETED:
        exit_with(EXIT_FAILED)


def _wait_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--wait",
        type=click.FloatRange(0, 3600),
        default=DEFAULT_CANCEL_WAIT,
        show_default=True,
        help="Seconds to wait for a running job's drainer to stop it (exit 3 if it has not).",
    )(command)


def _change(
    verb: str,
    one: Callable[..., Any],
    many: Callable[..., Any],
    extra: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> Any:
    def command(
        options: Options,
        job_id: str | None,
        where: JobFilter,
        yes: bool,
        as_json: bool,
        **more: Any,
    ) -> None:
        if job_id is not None and where != JobFilter():
            raise InvalidJobOption(f"give a job id or filters to {verb}, not both")
        app = options.connected_app()
        if job_id is not None:
            change: JobChange = run(lambda: one(app, job_id, **more), app)
            emit(as_json, change.to_dict(), render.job_change(change))
            if change.outcome is ChangeOutcome.CANCEL_REQUESTED:
                exit_with(EXIT_PARTIAL)  # asked, not yet stopped: the request stands
            exit_with(EXIT_OK if change.changed else EXIT_FAILED)

        async def go() -> tuple[int, JobsChanged | None]:
            matching = await app.count_jobs(where, verb=verb)
            if matching == 0 or not (yes or _confirm(verb, matching)):
                return matching, None
            return matching, await many(app, where)

        matching, done = run(go, app)
        if done is None:
            nothing = {"verb": verb, "matched": matching, "changed": 0}
            emit(as_json, nothing, render.nothing_changed(verb, matching))
            exit_with(EXIT_OK if matching == 0 else EXIT_FAILED)
        emit(as_json, done.to_dict(), render.jobs_changed(done))
        exit_with(EXIT_PARTIAL if done.changed < done.matched else EXIT_OK)

    decorated: Any = command if extra is None else extra(command)
    for decorate in (
        pass_options,
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
        click.option("--yes", "-y", is_flag=True, help="Change every matching job without asking."),
        _filters,
        click.argument("job_id", required=False),
        jobs_group.command(verb),
    ):
        decorated = decorate(decorated)
    return decorated


def _confirm(verb: str, matching: int) -> bool:
    try:
        return click.confirm(f"{verb} {matching:,} job(s)?", default=False, err=True)
    except click.Abort:  # no terminal, no answer: nothing is changed
        click.echo("", err=True)
        return False


retry = _change("retry", lambda app, job_id: app.retry_job(job_id), App.retry_jobs)
retry.help = """Make failed (or retrying) jobs due now, their history kept: ID, or every
    failed and retrying job the filters match (asks first unless --yes)."""
cancel = _change(
    "cancel",
    lambda app, job_id, wait: app.cancel_job(job_id, wait=wait),
    App.cancel_jobs,
    _wait_option,
)
cancel.help = """Cancel jobs: ID, or every pending and retrying job the filters match (asks
    first unless --yes). A waiting job is cancelled and never runs. A job a drainer runs now
    (ID only) is stopped at its handler's next await, its writes rolled back, and cancelled:
    exit 0 once it is, 1 if it completed first, 3 if not stopped within --wait (the request
    stands). By filter, the running ones are asked to stop without waiting (counted
    cancel_requested, exit 3)."""
delete = _change("delete", lambda app, job_id: app.delete_job(job_id), App.delete_jobs)
delete.help = """Delete finished jobs (completed, failed, cancelled): ID, or every finished job
    the filters match (asks first unless --yes)."""


@click.group("queue")
def queue_group() -> None:
    """Queue control for every drainer on every host: list, pause, resume, delete."""


@queue_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_options
def list_queues(options: Options, as_json: bool) -> None:
    """Queues: jobs by status, due, drainers, paused, unserved."""
    app = options.connected_app()
    found = run(app.queues, app)
    emit(as_json, {"queues": [queue.to_dict() for queue in found]}, *render.queue_table(found))


def _pause_command(name: str, pause: bool) -> Any:
    @click.argument("queue")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    @pass_options
    def command(
        options: Options,
        queue: str,
        as_json: bool,
        create: bool = False,
        wait_idle: bool = False,
        timeout: float = 0.0,
    ) -> None:
        app = options.connected_app()

        async def act() -> tuple[control.QueueState, control.Running | None]:
            changed = app.pause_queue(queue, create=create) if pause else app.resume_queue(queue)
            state = await changed
            if not wait_idle:
                return state, None
            return state, await control.wait_idle(app.database, queue, within=timeout)

        state, running = run(act, app)
        if running is None:
            emit(as_json, state.to_dict(), render.queue_state(state))
        else:
            idle = render.queue_idle(queue, running, timeout)
            emit(as_json, {**state.to_dict(), "idle": not running}, render.queue_state(state), idle)
        if running:
            exit_with(EXIT_PARTIAL)

    if pause:
        command = click.option(
            "--timeout",
            type=click.FloatRange(0),
            default=300.0,
            show_default=True,
            help="Seconds --wait-idle waits at most.",
        )(command)
        command = click.option(
            "--wait-idle",
            is_flag=True,
            help="Then wait until no job of QUEUE runs, on any host (exit 3 at --timeout).",
        )(command)
    return queue_group.command(name)(command)


pause = click.option(
    "--create",
    is_flag=True,
    help="Pause a queue nothing knows of yet (no job, no row, no handler routed to it).",
)(_pause_command("pause", True))
pause.help = """Pause QUEUE: its drainers, on every host, finish what they hold and claim
    nothing until it is resumed. A queue with no jobs, no row and no handler routed to it is
    refused (exit 2: a typo?) unless --create. With --wait-idle, then wait until none of its
    jobs runs: exit 0 once idle, 3 if jobs still run at --timeout (the queue stays paused)."""
resume = _pause_command("resume", False)
resume.help = """Resume QUEUE: its drainers are woken at once and claim again."""


@queue_group.command("delete")
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_options
def delete_queue(options: Options, queue: str, as_json: bool) -> None:
    """Delete QUEUE's row (and its pause) when no job names it: exit 0 deleted, 1 not (jobs
    name it, or it has no row)."""
    app = options.connected_app()
    done = run(lambda: app.delete_queue(queue), app)
    emit(as_json, done.to_dict(), render.queue_deleted(done))
    exit_with(EXIT_OK if done.deleted else EXIT_FAILED)
