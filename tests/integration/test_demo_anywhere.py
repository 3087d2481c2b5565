"""``cronlock demo`` from any directory after any install (issue 16): the examples ship inside
the wheel as ``cronlock/_examples``, and the demo runs cronlock's own examples whatever
``tasks`` means in the directory it is run from."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from cli import ROOT, cli_env


def installed_wheel(tmp_path: Path) -> Path:
    """A virtualenv with cronlock's wheel pip-installed in it; its dependencies are borrowed
    from this one (a .pth line, which does not carry this one's editable install)."""
    quiet = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        env=quiet,
        timeout=300,
    )
    [wheel] = wheels.glob("cronlock-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        env=quiet,
        timeout=300,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_demo_from_a_wheel_outside_the_repository(database_url: str, tmp_path: Path) -> None:
    venv = installed_wheel(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRONLOCK_", "PYTHON"))}
    env["CRONLOCK_DATABASE_URL"] = database_url
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import cronlock; print(cronlock.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(venv)), where.stdout  # the wheel's, not the checkout's

    done = subprocess.run(
        [str(venv / "bin" / "cronlock"), "demo"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "run 1: partial — 997 posts indexed, 3 failed" in done.stdout
    assert "run 2: skipped" in done.stdout
    command = "cronlock --app cronlock._examples"
    assert f"next: {command} status · {command} list · {command} crontab" in done.stdout

    status = subprocess.run(
        [str(venv / "bin" / "cronlock"), "--app", "cronlock._examples", "status"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert "reindex-fts: last success " in status.stdout
    assert "STARTED" in status.stdout and " completed " in status.stdout


def test_demo_runs_the_examples_whatever_tasks_is_here(database_url: str, tmp_path: Path) -> None:
    # A project of the user's own, with a tasks package that is not cronlock's examples.
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "__init__.py").write_text("import cronlock\n\napp = cronlock.App()\n")
    env = cli_env(database_url)
    env["PYTHONPATH"] = ""  # as installed: only the editable install's path to the checkout
    done = subprocess.run(
        [sys.executable, "-m", "cronlock", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "run 1: partial — 997 posts indexed, 3 failed" in done.stdout

    theirs = subprocess.run(
        [sys.executable, "-m", "cronlock", "--app", "tasks", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert theirs.returncode == 2
    assert theirs.stderr.splitlines() == [
        "Error: the demo runs cronlock's examples, and 'tasks' is not one of them: run "
        "`cronlock demo` without --app (and CRONLOCK_APP unset)"
    ]
