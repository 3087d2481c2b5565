"""The printed crontab lines run as they are under cron's environment (issue 12, part 2).

cron runs a line with `sh -c`, PATH=/usr/bin:/bin and none of the user's environment; these
tests run each printed line the same way, from `/`, with `env -i`, and look at the runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli import ROOT, SUPPORT, invoke
from history import runs_of

from cronlock import Database

EXAMPLE_OPTIONS = (
    "--directory",
    "/srv/app",
    "--cronlock",
    "/srv/app/.venv/bin/cronlock",
    "--log",
    "/var/log/cronlock/cron.log",
    "--env-file",
    "/etc/cronlock/env",
    "--cron-timezone",
    "UTC",
)


def test_crontab_example_is_the_output_for_tasks() -> None:
    """crontab.example is `cronlock --app tasks crontab` for a project in /srv/app."""
    done = invoke("--app", "tasks", "crontab", *EXAMPLE_OPTIONS, database_url=None)
    assert done.returncode == 0, done.stderr
    assert (ROOT / "crontab.example").read_text() == done.stdout
    assert "/srv/app/.venv/bin/cronlock --app tasks run reindex-fts;" in done.stdout
    assert "drain --max-seconds 55" in done.stdout
    assert "/srv/app/.venv/bin/cronlock --app tasks prune;" in done.stdout


def test_a_task_in_another_zone_is_said_on_stderr_and_the_rest_printed() -> None:
    options = [*EXAMPLE_OPTIONS[:-1], "Asia/Tokyo"]
    done = invoke("--app", "tasks", "crontab", *options, database_url=None)
    assert done.returncode == 0, done.stderr
    printed = [line for line in done.stdout.splitlines() if line and line[0] != "#"]
    assert [line.split("--app tasks ", 1)[1].split(";")[0] for line in printed] == [
        "drain --max-seconds 55",
        "prune",
    ]
    [said] = [line for line in done.stderr.splitlines() if "left out" in line]
    assert "run(s) in UTC but cron here runs in Asia/Tokyo" in said
    assert "cronlock scheduler --task" in said
    prune = invoke("--app", "tasks", "crontab", *options, "--task", "prune", database_url=None)
    assert (
        prune.returncode == 0 and " prune; }" in prune.stdout and "tasks run " not in prune.stdout
    )
    none = invoke("--app", "tasks", "crontab", *options, "--task", "reindex-fts", database_url=None)
    assert none.returncode == 2 and none.stdout == "" and "nothing to print" in none.stderr


def cron_command(line: str) -> str:
    """What cron hands to `sh -c` for a crontab line: the command field, `\\%` unescaped."""
    command = line.split(None, 5)[5]
    return command.replace("\\%", "%")


def under_cron(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            *(f"{k}={v}" for k, v in env.items()),
            "sh",
            "-c",
            command,
        ],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def printed(tmp_path: Path, *options: str, database_url: str | None = None) -> list[str]:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "cronlock"),
            "--app",
            "testapps.crontabapp",
            "crontab",
            "--log",
            str(tmp_path / "cron.log"),
            "--cron-timezone",
            "UTC",
            *options,
        ],
        cwd=SUPPORT,
        env={k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
        | ({} if database_url is None else {"CRONLOCK_DATABASE_URL": database_url}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize("source", ["env-file", "crontab-variable"])
async def test_printed_lines_run_under_crons_environment(
    database: Database, database_url: str, tmp_path: Path, source: str
) -> None:
    if source == "env-file":
        env_file = tmp_path / "cronlock.env"
        env_file.write_text(f"CRONLOCK_DATABASE_URL='{database_url}'\n")
        env_file.chmod(0o600)
        text = printed(tmp_path, "--env-file", str(env_file))
        crontab_env: dict[str, str] = {}
    else:
        text = printed(tmp_path, database_url=database_url)
        variables = [line for line in text if line.startswith("CRONLOCK_DATABASE_URL=")]
        assert variables == [f"CRONLOCK_DATABASE_URL={database_url}"]
        crontab_env = dict(v.split("=", 1) for v in variables)  # cron sets these
    jobs = [line for line in text if line and not line.startswith(("#", "CRONLOCK_"))]
    assert [j.split("  ", 1)[0] for j in jobs] == ["* * * * *", "* * * * *", "17 * * * *"]
    assert "run minutely;" in jobs[0] and "drain --max-seconds 55;" in jobs[1]
    assert jobs[2].split("  ", 1)[1].startswith("{ cd ") and " prune;" in jobs[2]
    for job in jobs:
        done = under_cron(cron_command(job), **crontab_env)
        assert done.returncode == 0, (job, done.stdout, done.stderr)
        assert done.stdout == done.stderr == ""  # all of it went to the log
    log = (tmp_path / "cron.log").read_text()
    assert "minutely: completed" in log, log
    assert "drain default:" in log, log
    assert "prune: removed 0 completed" in log, log
    assert [row["status"] for row in await runs_of(database, "minutely")] == ["completed"]
