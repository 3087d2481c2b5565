"""Running the real ``cronlock`` command: in a subprocess, exactly as cron would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent


def cli_env(database_url: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT)])
    if database_url is not None:
        env["CRONLOCK_DATABASE_URL"] = database_url
    env.update(extra)
    return env


def cronlock_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cronlock", *args]


def run_cli(
    *args: str, database_url: str | None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cronlock_command(*args),
        cwd=ROOT,
        env=cli_env(database_url, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_cli(*args: str, database_url: str | None, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cronlock_command(*args),
        cwd=ROOT,
        env=cli_env(database_url, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def finish(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    """Wait for a started command to exit: its exit code, stdout and stderr. One that does not
    exit in time is killed and reaped (its pipes closed) and the test fails."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"process did not exit: {stderr}") from None
    return process.returncode, stdout, stderr


def kill_all(*processes: subprocess.Popen[str]) -> None:
    """Kill what is still running and close every pipe: a failed test leaves nothing behind
    (an unclosed pipe would be reported as a ResourceWarning in whichever test runs next)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None and not stream.closed:
                stream.close()
