"""A Django task as a cronlock job, and back: the job's payload, and the ``TaskResult`` its row
says.

The job is the whole record (``SELECT * FROM cronlock.jobs``): its type is the task's module
path, its payload the arguments (``{"args", "kwargs", "backend", "run_after"}``), its
``priority``, ``queue`` and ``run_at`` the task's, its ``result`` column the return value.
From the row:

========================  ================================================================
``TaskResult``            the job's row
========================  ================================================================
``status``                ``pending``/``retrying``: READY; ``processing``: RUNNING (only the
                          lease commit mode commits a running job: in ``strict`` and ``batch``
                          it stays READY until it ends); ``completed``: SUCCESSFUL;
                          ``failed``/``cancelled``: FAILED
``return_value``          ``result``
``errors``                one ``TaskError`` per entry of ``error_history`` that has an error
                          (a failed attempt, a lost worker's run, an operator's cancel)
``attempts``              those, plus the attempt that succeeded or runs now
``enqueued_at``           ``created_at``
``started_at``,           ``started_at``: the last attempt's start (cronlock keeps no other)
``last_attempted_at``
``finished_at``           ``completed_at`` once it ended
``worker_ids``            one ``"cronlock"`` per attempt: cronlock does not record which
                          worker ran an attempt
========================  ================================================================

cronlock records an error as one line, ``Type: message`` (``cronlock.outcome.error_line``).
The worker raises a task's exception again as a ``TaskRaised`` named by the exception's import
path (``shop.errors.OutOfStock: sold out``; a builtin's bare name, ``ValueError: boom``), so
that the line keeps the path and ``TaskError.exception_class_path`` is read back from it; its
``traceback`` is that line (the whole traceback is in the worker's log). A line that is not an
exception's (a lost worker, a timeout's own) is an ``AttemptFailed``.
"""

from __future__ import annotations

import builtins
import functools
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...outcome import JobStatus
from .api import Task, TaskError, TaskResult, TaskResultStatus

__all__ = [
    "WORKER_ID",
    "Arguments",
    "AttemptFailed",
    "JobRow",
    "TaskRaised",
    "arguments",
    "payload",
    "raised",
    "result_of",
]

WORKER_ID = "cronlock"

_STATUS = {
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.RETRYING: TaskResultStatus.READY,
    JobStatus.PROCESSING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
    JobStatus.BLOCKED: TaskResultStatus.READY,
}
_ENDED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
_RAN_NOW = frozenset({JobStatus.COMPLETED, JobStatus.PROCESSING})
# ``Type`` or ``Type: message``, where Type is a name or a dotted path.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s|$)")


class TaskRaised(Exception):
    """What a task raised, raised again by the worker under a class named by the original's
    import path, so that cronlock's error line records the path (the module docstring)."""


class AttemptFailed(Exception):
    """An attempt that ended with no exception of the task's: cronlock's line says why (its
    worker was lost, its timeout, an operator's cancel, no handler for its type)."""


@functools.cache
def _named(path: str) -> type[TaskRaised]:
    return type(path, (TaskRaised,), {"__module__": __name__, "__qualname__": path})


def raised(exc: Exception) -> TaskRaised:
    """``exc`` as the worker raises it again (``raise raised(exc) from exc``)."""
    kind = type(exc)
    path = kind.__qualname__
    if kind.__module__ != "builtins":
        path = f"{kind.__module__}.{path}"
    return _named(path)(str(exc))


@dataclass(frozen=True)
class Arguments:
    """A job's payload, read back."""

    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    run_after: datetime | None


def payload(task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], alias: str) -> Any:
    """The job's payload for ``task`` called with ``args`` and ``kwargs`` (already JSON)."""
    run_after = task.run_after
    return {
        "args": args,
        "kwargs": kwargs,
        "backend": alias,
        "run_after": None if run_after is None else run_after.isoformat(),
    }


def arguments(value: Any) -> Arguments | None:
    """A payload ``payload`` made, or None for any other (a job that is not a task's)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or set(value) != {"args", "kwargs", "backend", "run_after"}:
        return None
    args, kwargs, backend, run_after = (
        value["args"],
        value["kwargs"],
        value["backend"],
        value["run_after"],
    )
    if not (isinstance(args, list) and isinstance(kwargs, dict) and isinstance(backend, str)):
        return None
    try:
        after = None if run_after is None else datetime.fromisoformat(run_after)
    except (TypeError, ValueError):
        return None
    return Arguments(args, kwargs, backend, after)


@dataclass(frozen=True)
class JobRow:
    """What ``sql.JOB_TASK_RESULT`` reads of a job (its JSON columns still text)."""

    id: uuid.UUID
    job_type: str
    queue: str
    priority: int
    status: JobStatus
    payload: str
    result: str | None
    error_history: str
    retry_count: int
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    completed_at: datetime | None

    @classmethod
    def from_row(cls, names: Sequence[str], row: Sequence[Any]) -> JobRow:
        values: Mapping[str, Any] = dict(zip(names, row, strict=True))
        return cls(
            id=uuid.UUID(str(values["id"])),
            job_type=values["job_type"],
            queue=values["queue"],
            priority=values["priority"],
            status=JobStatus(values["status"]),
            payload=values["payload"],
            result=values["result"],
            error_history=values["error_history"],
            retry_count=values["retry_count"],
            created_at=values["created_at"],
            run_at=values["run_at"],
            started_at=values["started_at"],
            completed_at=values["completed_at"],
        )


def task_error(line: str) -> TaskError:
    """An ``error_history`` entry's error line as Django's ``TaskError``."""
    found = _EXCEPTION_LINE.match(line)
    path = f"{AttemptFailed.__module__}.{AttemptFailed.__qualname__}"
    if found is not None:
        name = found.group(1)
        if "." in name:
            path = name
        elif isinstance(getattr(builtins, name, None), type) and issubclass(
            getattr(builtins, name), BaseException
        ):
            path = f"builtins.{name}"
    return TaskError(exception_class_path=path, traceback=line)


def result_of(row: JobRow, task: Task[Any, Any], args: Arguments, alias: str) -> TaskResult[Any]:
    """The ``TaskResult`` of ``task`` that the job's row says (the module docstring)."""
    history = json.loads(row.error_history)
    errors = [
        task_error(str(entry["error"]))
        for entry in history
        if isinstance(entry, dict) and entry.get("error") is not None
    ]
    attempts = len(errors) + (1 if row.status in _RAN_NOW else 0)
    result: TaskResult[Any] = TaskResult(
        task=task.using(
            priority=row.priority,
            queue_name=row.queue,
            run_after=args.run_after,
            backend=alias,
        ),
        id=str(row.id),
        status=_STATUS[row.status],
        enqueued_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.completed_at if row.status in _ENDED else None,
        last_attempted_at=row.started_at,
        args=args.args,
        kwargs=args.kwargs,
        backend=alias,
        errors=errors,
        worker_ids=[WORKER_ID] * attempts,
    )
    if row.status is JobStatus.COMPLETED and row.result is not None:
        # Django's own backends set the value so: it has no public setter.
        object.__setattr__(result, "_return_value", json.loads(row.result))
    return result
