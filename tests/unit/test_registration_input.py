"""Registration refuses arguments of the wrong type with cronlock's own one-line errors, never
an AttributeError or TypeError from inside (issue 16, point 6: a cron of None)."""

from __future__ import annotations

from typing import Any

import pytest

import cronlock
from cronlock import ConfigurationError, InvalidCron


async def _body(run: cronlock.Run) -> None:
    return None


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"cron": None}, InvalidCron, "invalid cron expression None: give a string"),
        ({"cron": 5}, InvalidCron, "invalid cron expression 5: give a string"),
        ({"namespace": None}, ConfigurationError, "namespace must be a name or an int4"),
        ({"namespace": 2**40}, ConfigurationError, "does not fit in int4"),
        ({"grace": "5"}, ConfigurationError, "grace must be seconds (a number) or a timedelta"),
        ({"early": None}, ConfigurationError, "early must be seconds"),
        ({"max_lateness": "x"}, ConfigurationError, "max_lateness must be seconds"),
        ({"jitter": None}, ConfigurationError, "jitter must be seconds"),
        ({"catch_up_limit": "3"}, ConfigurationError, "catch_up_limit must be an integer"),
    ],
)
def test_a_periodic_task_of_the_wrong_types_is_refused(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    app = cronlock.App()
    given = {"cron": "* * * * *", **options}
    with pytest.raises(error) as raised:
        app.periodic("t", **given)(_body)
    assert message in str(raised.value)
    assert app.tasks == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": "5"}, "timeout must be positive"),
        ({"backoff": 5}, "backoff must be a cronlock.Backoff"),
    ],
)
def test_a_job_type_of_the_wrong_types_is_refused(options: dict[str, Any], message: str) -> None:
    app = cronlock.App()
    with pytest.raises(ConfigurationError, match=message):
        app.job("j", **options)
    assert app.handlers == {}


@pytest.mark.parametrize("name", [None, 5])
def test_names_that_are_not_strings_are_refused(name: Any) -> None:
    app = cronlock.App()
    with pytest.raises(ConfigurationError, match="invalid task name"):
        app.periodic(name, cron="* * * * *")
    with pytest.raises(ConfigurationError, match="invalid job type name"):
        app.job(name)
