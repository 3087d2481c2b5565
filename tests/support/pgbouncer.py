"""A PgBouncer in transaction mode in front of the test server, started by the tests.

PgBouncer refuses to run as root, so as root it drops to the user that can reach the server
(the owner of the embedded server's socket directory, or ``nobody`` for TCP).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli import free_port
from sqlalchemy import URL
from waiting import wait_for


def require_pgbouncer() -> str:
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if binary is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: its absence there is a broken CI
        pytest.skip(message)
    return binary


@contextmanager
def running_pgbouncer(server: URL, *, pool_size: int = 2) -> Iterator[URL]:
    """Start PgBouncer for ``server`` and yield the URL of ``server``'s database through it."""
    binary = require_pgbouncer()
    socket_dir = server.query.get("host")
    host = str(socket_dir) if socket_dir else (server.host or "127.0.0.1")
    port = server.port or 5432
    user = server.username or "postgres"
    work = Path(tempfile.mkdtemp(prefix="cronlock-pgbouncer-"))
    work.chmod(0o777)
    listen = free_port()
    (work / "users.txt").write_text(f'"{user}" ""\n')
    (work / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {listen}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {work / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 200\n"
        f"logfile = {work / 'pgbouncer.log'}\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    for path in work.iterdir():
        path.chmod(0o644)
    command = [binary]
    if os.geteuid() == 0:
        owner = os.stat(host).st_uid if socket_dir else pwd.getpwnam("nobody").pw_uid
        command += ["-u", pwd.getpwuid(owner).pw_name]
    process = subprocess.Popen(
        [*command, str(work / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _accepts(listen) or process.poll() is not None, timeout=15)
        if process.poll() is not None:
            log = work / "pgbouncer.log"
            raise RuntimeError(f"pgbouncer exited: {log.read_text() if log.exists() else 'no log'}")
        yield URL.create(
            "postgresql+asyncpg",
            username=user,
            host="127.0.0.1",
            port=listen,
            database=server.database,
        )
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
