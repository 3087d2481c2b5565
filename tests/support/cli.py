"""Running the real ``cronlock`` command: in a subprocess, exactly as cron would, or in this
process, as that subprocess would have run it.

A subprocess costs a Python start-up and cronlock's imports, about 0.6 s a command: tests
keep it where the process is the point (signals, kills, processes that overlap, cron's own
environment). Exit codes and output are tested in process, with ``invoke``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from isolation import APP_PACKAGES, fresh_modules, process_state

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


def invoke(*args: str, database_url: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    """``cronlock ARGS`` in this process (click's runner on ``cronlock.cli.cli``): its exit
    code, stdout and stderr, as ``run_cli`` would give them.

    The command's process is imitated: it runs from the repository with no CRONLOCK_*
    variable but those given, imports its app modules afresh (``isolation.fresh_modules``:
    an App it gives a database is not the one other tests see), starts with logging
    unconfigured, and what it changes process-wide is put back. An exception other than an
    exit is raised here, where the process would have printed a traceback.

    The command runs its own event loop (``asyncio.run``): call this from a synchronous test,
    or ``await invoke_async(...)`` from an asynchronous one. A command that installs signal
    handlers (drain, worker, scheduler, bench) can only run in the main thread: its test is
    synchronous.
    """
    from cronlock.cli import cli

    environment: dict[str, str | None] = {
        name: None for name in os.environ if name.startswith("CRONLOCK_")
    }
    if database_url is not None:
        environment["CRONLOCK_DATABASE_URL"] = database_url
    environment.update(env)
    with contextlib.chdir(ROOT), process_state(), fresh_modules(*APP_PACKAGES):
        result = CliRunner().invoke(
            cli, list(args), env=environment, prog_name="cronlock", catch_exceptions=False
        )
    return subprocess.CompletedProcess(
        ["cronlock", *args], result.exit_code, result.stdout, result.stderr
    )


async def invoke_async(
    *args: str, database_url: str | None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``invoke`` from an asynchronous test: in a thread, while the test's loop goes on (its
    connections keep their transactions and locks). Not for commands that install signal
    handlers (see ``invoke``)."""
    return await asyncio.to_thread(invoke, *args, database_url=database_url, **env)


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
