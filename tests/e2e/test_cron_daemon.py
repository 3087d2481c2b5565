"""Debian's cron daemon runs the lines `cronlock crontab` prints (issue 12, part 3).

Slow (three minutes of real cron) and it changes the machine (root, the `cron` package,
files in /etc/cron.d), so it is marked ``cron_daemon``, left out of the default run, and is a
CI step of its own:

    CRONLOCK_TEST_DATABASE_URL=postgresql://root@127.0.0.1:5432/postgres \\
        pytest -m cron_daemon tests/e2e

It installs ``cron`` if missing, starts the daemon if it is not running (and stops it after,
if it started it), and installs two copies of the printed lines, as two "hosts" each with its
own log, for three minutes: each minute must have exactly one ``completed`` run, the second
host only ``skipped`` rows, and no invocation may be ``no_slot``. The database is the test's
own (created from the template and dropped after). A second test asks Debian's own parser
(``crontab -n``) about random expressions: what it accepts, cronlock accepts, but for the
documented refusals.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import cronfuzz
import pytest
from cli import SUPPORT
from history import runs_of
from waiting import eventually

from cronlock import CronSchedule, Database, InvalidCron

pytestmark = pytest.mark.cron_daemon

CRON = "/usr/sbin/cron"
CRON_D = Path("/etc/cron.d")


def _cron_running() -> bool:
    return subprocess.run(["pidof", "cron"], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def cron_installed() -> None:
    if os.geteuid() != 0:
        pytest.fail("the cron daemon test installs packages and /etc/cron.d files: run as root")
    if not os.path.exists(CRON):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "cron"],
            check=True,
            env=env,
        )


@pytest.fixture
def cron_daemon(cron_installed: None) -> Iterator[None]:
    """cron running for the test: the machine's if it runs, else one started (and stopped) here."""
    if _cron_running():
        yield
        return
    daemon = subprocess.Popen([CRON, "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def _lines(tmp_path: Path, host: str, env_file: Path) -> str:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "cronlock"),
            "--app",
            "testapps.crontabapp",
            "crontab",
            "--user",
            "root",
            "--env-file",
            str(env_file),
            "--log",
            str(tmp_path / f"{host}.log"),
        ],
        cwd=SUPPORT,
        env={k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


async def test_real_cron_runs_each_minute_once_from_two_hosts(
    cron_daemon: None, database: Database, database_url: str, tmp_path: Path
) -> None:
    env_file = tmp_path / "cronlock.env"
    env_file.write_text(f"CRONLOCK_DATABASE_URL='{database_url}'\n")
    env_file.chmod(0o600)
    tag = uuid.uuid4().hex[:12]
    installed = [CRON_D / f"cronlock-e2e-{tag}-{host}" for host in ("a", "b")]
    try:
        for path in installed:
            path.write_text(_lines(tmp_path, path.name[-1], env_file))
            path.chmod(0o644)
        # cron reads /etc/cron.d when its mtime changes, at the top of a minute.
        first = _minute(datetime.now(UTC) + timedelta(seconds=5)) + timedelta(minutes=1)
        slots = [first + timedelta(minutes=i) for i in range(3)]

        async def third_minute_ran_on_both_hosts() -> bool:
            rows = await runs_of(database, "minutely")
            return sum(1 for row in rows if row["slot"] == slots[-1]) >= 2

        wait = (slots[-1] - datetime.now(UTC)).total_seconds() + 90
        await eventually(third_minute_ran_on_both_hosts, timeout=wait, interval=1)
    finally:
        for path in installed:
            path.unlink(missing_ok=True)
    rows = await runs_of(database, "minutely")
    by_slot: dict[datetime | None, list[str]] = defaultdict(list)
    for row in rows:
        by_slot[row["slot"]].append(f"{row['status']}:{row['skip_reason'] or ''}")
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    assert not [row for row in rows if row["skip_reason"] == "no_slot"], (by_slot, logs)
    assert None not in by_slot, by_slot
    for slot in slots:
        assert sorted(by_slot[slot]) in (
            ["completed:", "skipped:slot_done"],
            ["completed:", "skipped:lock_busy"],
        ), (slot, by_slot, logs)
    for moment, outcomes in by_slot.items():  # a minute before or after the three: the same
        assert sorted(o.split(":")[0] for o in outcomes).count("completed") == 1, (moment, by_slot)
    assert set(logs) == {"a.log", "b.log"}
    for text in logs.values():
        assert "not found" not in text and "Traceback" not in text, logs


def _debian_accepts(expressions: list[str], tmp_path: Path) -> list[bool]:
    verdicts = []
    for i, expression in enumerate(expressions):
        path = tmp_path / f"crontab-{i}"
        path.write_text(f"{expression} true\n")
        done = subprocess.run(["crontab", "-n", str(path)], capture_output=True, check=False)
        verdicts.append(done.returncode == 0)
    return verdicts


# What Debian's cron accepts and cronlock refuses on purpose (README, "Scheduling").
DELIBERATE = (
    "goes backwards",
    "two dashes",
    "'*' takes only a step",
    "never fires",
    "has no slots",
)
TRICKY = [
    "5/10 * * * *", "5-1 * * * *", "* * * * mon-sun", "1-5-7 * * * *", "*5 * * * *",
    "*-3 * * * *", "0 0 30 2 *", "@reboot", "@HOURLY", "@hourly", "? * * * *", "0 0 L * *",
    "*/0 * * * *", "61 * * * *", "0 0 * * 7", "0 0 * * sunday", "0 0 * JAN-mar/2 *",
    "1,,2 * * * *", "0 0 * * */8", "20-21/3 * * * *", "*/100 * * * *", "007 * * * *",
]  # fmt: skip


def test_debians_parser_and_cronlock_accept_the_same_expressions(
    cron_installed: None, tmp_path: Path
) -> None:
    rng = random.Random(12)
    expressions = TRICKY + [cronfuzz.expression(rng) for _ in range(2000)]
    mismatches = []
    deliberate = 0
    for expression, debian in zip(expressions, _debian_accepts(expressions, tmp_path), strict=True):
        try:
            CronSchedule.parse(expression)
            ours, reason = True, ""
        except InvalidCron as exc:
            ours, reason = False, str(exc)
        if debian and not ours and any(d in reason for d in DELIBERATE):
            deliberate += 1
        elif debian != ours:
            mismatches.append((expression, debian, reason))
    print(f"{len(expressions)} expressions; {deliberate} refused on purpose")
    assert not mismatches, mismatches
    assert deliberate >= 6  # the TRICKY ones Debian takes and cronlock refuses


def test_cron_is_in_place(cron_installed: None) -> None:
    assert shutil.which("crontab") and os.path.exists(CRON)
