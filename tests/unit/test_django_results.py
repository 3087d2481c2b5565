"""A Django task's errors as cronlock records them and as ``get_result`` reads them back
(cronlock.contrib.django.results): the exception's import path survives cronlock's one line."""

from __future__ import annotations

import pytest

from cronlock.contrib.django.results import arguments, raised, task_error
from cronlock.outcome import error_line


class OutOfStock(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "line", "path"),
    [
        (ValueError("boom"), "ValueError: boom", "builtins.ValueError"),
        (KeyError("k"), "KeyError: 'k'", "builtins.KeyError"),
        (OutOfStock(), f"{__name__}.OutOfStock", f"{__name__}.OutOfStock"),
        (
            OutOfStock("no tea\nleft"),
            f"{__name__}.OutOfStock: no tea",
            f"{__name__}.OutOfStock",
        ),
    ],
)
def test_a_task_s_exception_keeps_its_class_path_in_the_line(
    exc: Exception, line: str, path: str
) -> None:
    try:
        raise raised(exc) from exc
    except Exception as again:
        recorded = error_line(again)
    assert recorded == line
    assert task_error(recorded).exception_class_path == path
    assert task_error(recorded).traceback == recorded


@pytest.mark.parametrize(
    "line",
    [
        "worker lost: 0b4c… ended while the job ran",
        "stopped: its worker was lost 3 times while it ran",
        "no handler registered for job type 'shop.tasks.gone'",
        "LostLease: the lane's connection was lost",
        "cancelled by an operator while running",
    ],
)
def test_cronlock_s_own_lines_are_attempt_failures(line: str) -> None:
    path = task_error(line).exception_class_path
    assert path == "cronlock.contrib.django.results.AttemptFailed"


def test_a_timeout_is_the_builtin_timeout_error() -> None:
    line = "TimeoutError: the handler ran longer than its timeout of 5 s"
    assert task_error(line).exception_class_path == "builtins.TimeoutError"


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        {"to": "a@b"},
        '{"args": [], "kwargs": {}}',
        "not json",
        {"args": {}, "kwargs": {}, "backend": "default", "run_after": None},
    ],
)
def test_a_payload_that_is_not_a_task_s_is_none(payload: object) -> None:
    assert arguments(payload) is None


def test_a_task_s_payload_reads_back() -> None:
    given = arguments(
        '{"args": [1], "kwargs": {"a": 2}, "backend": "default", '
        '"run_after": "2026-12-03T03:00:00+00:00"}'
    )
    assert given is not None
    assert (given.args, given.kwargs, given.backend) == ([1], {"a": 2}, "default")
    assert (
        given.run_after is not None and given.run_after.isoformat() == "2026-12-03T03:00:00+00:00"
    )
