"""SIGTERM while a long-running command starts up (issue 11, point 7): it stops as cleanly as it
would once serving, with its result line and its exit code, and claims nothing.

Two moments of start-up, each held open by the test rather than hit by timing: the import of
the app (``testapps.slowstart`` waits for a file) and the first connection (a server that
accepts the TCP connection and never answers).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest
from cli import finish, kill_all, start_cli
from jobsupport import job_app
from sqlalchemy import select
from waiting import eventually, wait_for

from cronlock import Database
from cronlock.sql.tables import jobs

EXPECTED = {
    # command: (exit code, the line it prints, on stdout or stderr)
    "worker": (0, "worker default: skipped (stopped by SIGTERM during start-up"),
    "drain": (143, "drain default: skipped (stopped by SIGTERM during start-up"),
    "scheduler": (0, "scheduler: stopped by SIGTERM during start-up"),
}


async def _pending(database: Database) -> list[tuple[str, int]]:
    async with database.connect() as conn:
        rows = await conn.execute(select(jobs.c.status, jobs.c.attempt))
        return [(row.status, row.attempt) for row in rows]


@pytest.mark.parametrize("command", sorted(EXPECTED))
async def test_sigterm_while_the_app_is_imported(
    database: Database, database_url: str, tmp_path: Path, command: str
) -> None:
    async with job_app(database) as app:
        await app.enqueue("noop", {})
    starting, go = tmp_path / "starting", tmp_path / "go"
    process = start_cli(
        "--app", "testapps.slowstart", command,
        database_url=database_url, STARTING=str(starting), GO=str(go),
    )  # fmt: skip
    try:
        await eventually(lambda: _exists(starting), timeout=30)
        process.send_signal(signal.SIGTERM)
        go.write_text("go")
        code, stdout, stderr = finish(process)
    finally:
        kill_all(process)

    expected_code, line = EXPECTED[command]
    assert code == expected_code, stderr
    assert line in stdout + stderr
    assert "Traceback" not in stderr
    assert await _pending(database) == [("pending", 0)]  # nothing claimed


async def _exists(path: Path) -> bool:
    return path.exists()


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_sigterm_while_the_database_does_not_answer(command: str) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        process = start_cli(
            "--app", "testapps.jobs", command,
            database_url=f"postgresql://nobody@127.0.0.1:{port}/nothing",
        )  # fmt: skip
        try:
            silent.settimeout(30)
            accepted, _ = silent.accept()  # start-up is connecting: it waits for an answer
            with accepted:
                wait_for(lambda: accepted.recv(1, socket.MSG_PEEK), timeout=30)
                process.send_signal(signal.SIGTERM)
                code, stdout, stderr = finish(process)
        finally:
            kill_all(process)

    expected_code, line = EXPECTED[command]
    assert code == expected_code, stderr
    assert line in stdout + stderr
    assert "Traceback" not in stderr
