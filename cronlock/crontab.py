"""Crontab lines for an app's periodic tasks that run as they are under cron's own environment.

cron starts a line with ``sh -c``, a ``PATH`` of ``/usr/bin:/bin``, the user's home directory
as working directory and none of the user's shell settings. So each line names everything:

* the absolute path of the ``cronlock`` of the environment that printed it (a virtualenv's
  ``bin/cronlock``, or its ``python -m cronlock``);
* ``cd`` to the project directory, from which ``--app`` imports, as it did when printing;
* the database: an environment file the line sources (``--env-file``, the place for a
  password: readable by its owner only, never in the crontab, which may be world-readable
  in ``/etc/cron.d``, nor on a command line, which ``ps`` shows), or, for a URL without a
  password, one ``CRONLOCK_DATABASE_URL=`` line at the top of the crontab;
* ``{ …; } >> LOG 2>&1``: everything the line says, errors of ``cd`` included, goes to a log;
* a ``drain`` line every minute per queue when the app registers job handlers, and a
  ``prune`` line (the built-in retention) unless the app turned it off.

``--task`` narrows the lines to the tasks named, ``drain`` and ``prune`` (the built-ins)
included. Debian's cron ignores ``CRON_TZ`` and fires every line in its own zone
(``/etc/localtime``), so a task whose zone is another would fire at the wrong times: it gets
no line, and one stderr line (``left_out``) says why and what to do, while every other line is
printed (``--cron-timezone`` states the zone of the host the lines are for). Only when no line
at all is left is it an error: a crontab of comments, piped to ``crontab -``, would replace the
user's crontab with nothing. cronie honours
``CRON_TZ``, but by its own account misses or doubles jobs at the DST changes of that zone,
so cronlock never prints it. ``crontab.example`` is the output for ``tasks/``.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .app import RESERVED_NAMES, App
from .errors import ConfigurationError
from .retention import PRUNE_TASK

__all__ = [
    "CrontabSetup",
    "default_cronlock",
    "default_log",
    "host_timezone",
    "left_out",
    "render",
    "same_clock",
    "setup_for",
    "warnings",
]

DRAIN_SECONDS = 55  # a drain per minute that ends before the next starts


@dataclass(frozen=True)
class CrontabSetup:
    """Everything a printed line names besides the schedule."""

    app_spec: str
    directory: str
    cronlock: str  # the command, already shell-quoted
    log: str
    cron_timezone: ZoneInfo
    env_file: str | None = None
    database_url: str | None = None  # set on the command line or in the environment
    app_has_database: bool = False  # the app sets its database itself
    schema: str | None = None
    pgbouncer: bool = False
    user: str | None = None  # the user field of /etc/cron.d and /etc/crontab
    tasks: Sequence[str] | None = None  # only these (default: every task)


def default_cronlock() -> str:
    """This environment's ``cronlock``: the script that runs now, or its interpreter's."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) == "cronlock" and os.path.isfile(script):
        return shlex.quote(os.path.abspath(script))
    # abspath, not realpath: a virtualenv's python is a symlink out of the virtualenv.
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "cronlock")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return shlex.quote(beside)
    return f"{shlex.quote(os.path.abspath(sys.executable))} -m cronlock"


def default_log() -> str:
    """``$XDG_STATE_HOME/cronlock/cron.log`` (``~/.local/state/cronlock/cron.log``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return os.path.join(os.path.abspath(state), "cronlock", "cron.log")


def host_timezone() -> ZoneInfo:
    """The zone cron runs in here: ``/etc/localtime`` (cron's TZ is not the shell's)."""
    link = Path("/etc/localtime")
    try:
        target = os.readlink(link)
    except OSError:
        target = ""
    if "zoneinfo/" in target:
        try:
            return ZoneInfo(target.split("zoneinfo/", 1)[1])
        except (ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with link.open("rb") as file:
            return ZoneInfo.from_file(file, key=None)
    except (OSError, ValueError):
        return ZoneInfo("UTC")


def _zone_name(zone: ZoneInfo) -> str:
    return zone.key or "the zone of /etc/localtime"


def same_clock(a: ZoneInfo, b: ZoneInfo, now: datetime | None = None) -> bool:
    """Whether two zones keep the same wall clock from now on (Madrid and Paris do)."""
    if a.key is not None and a.key == b.key:
        return True
    moment = (now or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    for _ in range(2 * 24 * 2 * 366):  # every half hour for two years
        if moment.astimezone(a).utcoffset() != moment.astimezone(b).utcoffset():
            return False
        moment += timedelta(minutes=30)
    return True


def setup_for(
    app: App,
    app_spec: str,
    *,
    database_url: str | None = None,
    schema: str | None = None,
    pgbouncer: bool = False,
    directory: str | None = None,
    cronlock: str | None = None,
    log: str | None = None,
    env_file: str | None = None,
    cron_timezone: str | None = None,
    user: str | None = None,
    tasks: Sequence[str] = (),
) -> CrontabSetup:
    """A setup with this host's defaults; paths made absolute, the default log's directory made."""
    if log is None:
        log = default_log()
        os.makedirs(os.path.dirname(log), exist_ok=True)
    if cron_timezone is None:
        zone = host_timezone()
    else:
        try:
            zone = ZoneInfo(cron_timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"unknown timezone {cron_timezone!r} for --cron-timezone "
                "(use an IANA name such as 'Europe/Madrid')"
            ) from None
    if user is not None and (not user or any(ch.isspace() for ch in user)):
        raise ConfigurationError(f"invalid --user {user!r}")
    return CrontabSetup(
        app_spec=app_spec,
        directory=os.path.abspath(directory or os.getcwd()),
        cronlock=cronlock or default_cronlock(),
        log=os.path.abspath(log),
        cron_timezone=zone,
        env_file=None if env_file is None else os.path.abspath(env_file),
        database_url=database_url,
        app_has_database=app.database_url is not None,
        schema=schema,
        pgbouncer=pgbouncer,
        user=user,
        tasks=tuple(tasks) or None,
    )


def has_password(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.password) or "password" in parse_qs(parts.query)


def _command_field(text: str) -> str:
    # crontab(5): an unescaped % in the command ends it and starts its standard input.
    return text.replace("%", "\\%")


def left_out(app: App, setup: CrontabSetup) -> list[str]:
    """Why each task asked for (every task by default) that cron here cannot fire at its times
    has no line: one sentence per zone, for stderr. The others' lines are printed."""
    foreign: dict[str, list[str]] = {}
    for name in _task_names(app, setup):
        zone = app.task(name).schedule.timezone
        if not same_clock(zone, setup.cron_timezone):
            foreign.setdefault(zone.key or str(zone), []).append(name)
    return [
        f"left out: {', '.join(map(repr, names))} run(s) in {zone} but cron here runs in "
        f"{_zone_name(setup.cron_timezone)}, and Debian's cron ignores CRON_TZ (cronie "
        "honours it but misses or doubles jobs at its DST changes): fire them with "
        f"`cronlock scheduler --task {names[0]}`, give them the host's zone, or print their "
        "lines for a host in their zone with --cron-timezone"
        for zone, names in sorted(foreign.items())
    ]


def _task_names(app: App, setup: CrontabSetup) -> list[str]:
    """The periodic tasks asked for; the built-ins ``drain`` and ``prune`` are not tasks."""
    if setup.tasks is None:
        return sorted(app.tasks)
    names = [name for name in setup.tasks if name not in RESERVED_NAMES]
    for name in names:
        app.task(name)  # an unknown name is the usual one-line error
    if PRUNE_TASK in setup.tasks and app.retention is None:
        raise ConfigurationError("no prune line: retention is off for this app")
    return names


def _check(app: App, setup: CrontabSetup) -> list[str]:
    """The tasks whose lines are printed: those asked for that cron here fires on time."""
    names = [
        name
        for name in _task_names(app, setup)
        if same_clock(app.task(name).schedule.timezone, setup.cron_timezone)
    ]
    if setup.env_file is None and setup.database_url and has_password(setup.database_url):
        raise ConfigurationError(
            "the database URL has a password, which a crontab line would show: put "
            "CRONLOCK_DATABASE_URL=… in a file only you can read and pass --env-file FILE "
            "(or keep the password in ~/.pgpass and drop it from the URL)"
        )
    return names


def render(app: App, setup: CrontabSetup) -> str:
    """The crontab text for ``setup``: every line it can print (``left_out`` says why the rest
    have none); ConfigurationError when no line would be right."""
    names = _check(app, setup)
    options = [f"--app {shlex.quote(setup.app_spec)}"]
    if setup.schema:
        options.append(f"--schema {shlex.quote(setup.schema)}")
    if setup.pgbouncer:
        options.append("--pgbouncer")
    prefix = f"cd {shlex.quote(setup.directory)} && "
    if setup.env_file is not None:
        prefix += f"set -a && . {shlex.quote(setup.env_file)} && set +a && "
    user = f"{setup.user}  " if setup.user else ""

    def line(schedule: str, arguments: str) -> str:
        command = f"{{ {prefix}{setup.cronlock} {' '.join(options)} {arguments}; }}"
        log = f">> {shlex.quote(setup.log)} 2>&1"
        return f"{schedule}  {user}{_command_field(f'{command} {log}')}\n"

    if setup.env_file is not None:
        database = f"reads CRONLOCK_DATABASE_URL=… (and any other setting) from {setup.env_file}"
    elif setup.database_url:
        database = "uses the CRONLOCK_DATABASE_URL below"
    elif setup.app_has_database:
        database = "uses the database the app sets"
    else:
        database = "uses the embedded PostgreSQL (no database was configured)"
    out = [
        f"# Generated by `cronlock --app {setup.app_spec} crontab`. The same lines may go on "
        "every host: the\n",
        "# advisory lock lets one run do the work and the others record `skipped`.\n",
        f"# cron must run in {_zone_name(setup.cron_timezone)}, the tasks' timezone (Debian's "
        "cron ignores CRON_TZ).\n",
        f"# Each line changes to {setup.directory}, {database},\n",
        f"# and appends its output to {setup.log}.\n",
    ]
    if setup.user:
        out.append(
            "# System crontab format (/etc/cron.d/NAME, NAME of letters, digits, - and _).\n"
        )
    if setup.env_file is None and setup.database_url:
        out.append(f"CRONLOCK_DATABASE_URL={setup.database_url}\n")
    for name in names:
        task = app.task(name)
        out.append(line(task.schedule.expression, f"run {shlex.quote(name)}"))
    printed = len(names)
    if setup.tasks is None or "drain" in setup.tasks:
        for queue in sorted({handler.queue for handler in app.handlers.values()}):
            chosen = "" if queue == "default" else f" --queue {shlex.quote(queue)}"
            out.append(line("* * * * *", f"drain --max-seconds {DRAIN_SECONDS}{chosen}"))
            printed += 1
    if (setup.tasks is None or PRUNE_TASK in setup.tasks) and app.retention is not None:
        # The built-in retention (App(retention=False) leaves it out). It has no slots, so
        # cron's zone does not matter to it.
        out.append(line(app.retention.cron, PRUNE_TASK))
        printed += 1
    if not printed and (setup.tasks is not None or left_out(app, setup)):
        # A crontab of comments only, piped to `crontab -`, would replace the user's with none.
        why = left_out(app, setup) or ["no line: the app has no job handler for --task drain"]
        raise ConfigurationError(f"nothing to print: {why[0]}")
    return "".join(out)


def warnings(setup: CrontabSetup) -> list[str]:
    """What the lines depend on that is not right on this host (said on stderr)."""
    found = []
    if setup.env_file is not None:
        try:
            mode = os.stat(setup.env_file).st_mode
        except OSError:
            found.append(f"{setup.env_file} does not exist here: create it before cron runs")
        else:
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                found.append(f"{setup.env_file} is readable by others: chmod 600 it")
    log_directory = os.path.dirname(setup.log)
    if not os.path.isdir(log_directory):
        found.append(f"{log_directory} does not exist here: create it, or the lines fail")
    return found
