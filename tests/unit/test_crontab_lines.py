"""`cronlock crontab`'s lines: what they name, and what they refuse to print."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

import cronlock
from cronlock import ConfigurationError
from cronlock.cron import parse_timezone
from cronlock.crontab import (
    CrontabSetup,
    default_cronlock,
    has_password,
    left_out,
    render,
    same_clock,
)


def make_app(
    zone: str = "UTC", queues: tuple[str, ...] = (), retention: bool = False
) -> cronlock.App:
    app = cronlock.App(retention=retention)

    async def body(run: cronlock.Run) -> None:
        """Nothing."""

    app.periodic("nightly", cron="30 2 * * *", timezone=zone)(body)
    app.periodic("often", cron="*/5 * * * *", timezone=zone)(body)
    for i, queue in enumerate(queues):

        async def handler(session: object, payload: object) -> None:
            """Nothing."""

        app.job(f"job{i}", queue=queue)(handler)
    return app


def setup(**changes: object) -> CrontabSetup:
    values: dict[str, object] = {
        "app_spec": "myapp",
        "directory": "/srv/my app",
        "cronlock": "/srv/venv/bin/cronlock",
        "log": "/var/log/cronlock/cron.log",
        "cron_timezone": parse_timezone("UTC"),
    }
    values.update(changes)
    return CrontabSetup(**values)  # type: ignore[arg-type]


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_each_line_names_the_command_the_directory_and_the_log() -> None:
    out = lines(render(make_app(), setup()))
    assert out == [
        "30 2 * * *  { cd '/srv/my app' && /srv/venv/bin/cronlock --app myapp run nightly; } "
        ">> /var/log/cronlock/cron.log 2>&1",
        "*/5 * * * *  { cd '/srv/my app' && /srv/venv/bin/cronlock --app myapp run often; } "
        ">> /var/log/cronlock/cron.log 2>&1",
    ]


def test_a_drain_line_per_queue_of_the_job_handlers() -> None:
    out = lines(render(make_app(queues=("default", "mail", "default")), setup()))
    drains = [line for line in out if " drain " in line]
    assert [line.split("drain ", 1)[1].split(";")[0] for line in drains] == [
        "--max-seconds 55",
        "--max-seconds 55 --queue mail",
    ]
    assert all(line.startswith("* * * * *  ") for line in drains)


def test_the_database_setting_never_carries_a_password_into_the_crontab() -> None:
    url = "postgresql://app@db.internal/app"
    text = render(make_app(), setup(database_url=url))
    assert f"\nCRONLOCK_DATABASE_URL={url}\n" in text
    with pytest.raises(ConfigurationError, match=r"has a password.*--env-file"):
        render(make_app(), setup(database_url="postgresql://app:secret@db/app"))
    with pytest.raises(ConfigurationError, match="has a password"):
        render(make_app(), setup(database_url="postgresql://app@db/app?password=secret"))
    env_file = render(
        make_app(), setup(database_url="postgresql://a:secret@db/app", env_file="/etc/e")
    )
    assert "secret" not in env_file and "CRONLOCK_DATABASE_URL=" not in lines(env_file)[0]
    assert "set -a && . /etc/e && set +a && " in lines(env_file)[0]
    assert has_password("postgres://u:p@h/d") and not has_password("postgres://u@h/d")


def test_schema_pgbouncer_user_and_percent_signs() -> None:
    out = lines(
        render(make_app(), setup(schema="jobs", pgbouncer=True, user="deploy", log="/l/%d.log"))
    )
    assert out[0].startswith("30 2 * * *  deploy  { cd ")
    assert "--app myapp --schema jobs --pgbouncer run nightly" in out[0]
    assert out[0].endswith(">> /l/\\%d.log 2>&1")  # cron would end the command at a bare %


def test_tasks_in_another_zone_than_crons_are_left_out_and_the_rest_printed() -> None:
    app = make_app("Europe/Madrid", queues=("default",), retention=True)
    out = lines(render(app, setup()))
    assert [line.split("myapp ", 1)[1].split(";")[0] for line in out] == [
        "drain --max-seconds 55",
        "prune",
    ]
    [why] = left_out(app, setup())
    assert why.startswith("left out: 'nightly', 'often' run(s) in Europe/Madrid but cron here")
    assert "CRON_TZ" in why and "cronlock scheduler --task nightly" in why
    assert left_out(app, setup(tasks=("drain",))) == []  # not asked for: nothing to say
    # Nothing left to print of what was asked: an error, not an empty crontab for `crontab -`.
    with pytest.raises(ConfigurationError, match=r"nothing to print: left out: 'often'"):
        render(app, setup(tasks=("often",)))
    # The same wall clock under another name is the same to cron.
    text = render(make_app("Europe/Paris"), setup(cron_timezone=parse_timezone("Europe/Madrid")))
    assert len(lines(text)) == 2
    assert same_clock(parse_timezone("UTC"), parse_timezone("Etc/UTC"))
    assert same_clock(parse_timezone("Europe/London"), parse_timezone("Europe/Lisbon"))
    assert not same_clock(parse_timezone("Europe/London"), parse_timezone("Europe/Madrid"))


def test_only_the_tasks_asked_for() -> None:
    app = make_app(queues=("default",))
    out = lines(render(app, setup(tasks=("often",))))
    assert len(out) == 1 and out[0].endswith("run often; } >> /var/log/cronlock/cron.log 2>&1")
    with pytest.raises(cronlock.UnknownTask):
        render(app, setup(tasks=("nope",)))


def test_the_default_command_is_this_environments_cronlock(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Path(sys.executable).parent / "cronlock"
    monkeypatch.setattr(sys, "argv", [str(script), "crontab"])
    assert default_cronlock() == shlex.quote(str(script))
    monkeypatch.setattr(sys, "argv", [os.path.join("cronlock", "__main__.py"), "crontab"])
    assert default_cronlock() == shlex.quote(str(script))  # python -m cronlock, same venv
    assert os.path.isabs(shlex.split(default_cronlock())[0])


def test_the_builtin_prune_has_a_line_unless_retention_is_off() -> None:
    out = lines(render(make_app(retention=True), setup()))
    assert out[-1] == (
        "17 * * * *  { cd '/srv/my app' && /srv/venv/bin/cronlock --app myapp prune; } "
        ">> /var/log/cronlock/cron.log 2>&1"
    )
    app = cronlock.App(retention=cronlock.Retention(cron="0 4 * * *"))
    assert lines(render(app, setup()))[-1].startswith("0 4 * * *  {")
    assert not any(" prune;" in line for line in lines(render(make_app(), setup())))
    chosen = render(make_app(retention=True), setup(tasks=("often",)))
    assert not any(" prune;" in line for line in lines(chosen))


def test_the_builtins_lines_are_printed_by_task_name() -> None:
    app = make_app(queues=("default", "mail"), retention=True)
    prune = lines(render(app, setup(tasks=("prune",))))
    assert len(prune) == 1 and prune[0].startswith("17 * * * *  {") and " prune;" in prune[0]
    drains = lines(render(app, setup(tasks=("drain", "often"))))
    assert [line.split("myapp ", 1)[1].split(";")[0] for line in drains] == [
        "run often",
        "drain --max-seconds 55",
        "drain --max-seconds 55 --queue mail",
    ]
    with pytest.raises(ConfigurationError, match="retention is off"):
        render(make_app(), setup(tasks=("prune",)))
    with pytest.raises(ConfigurationError, match="no job handler"):
        render(make_app(), setup(tasks=("drain",)))
