"""A PostgreSQL cluster of the test's own, on another port, for the faults that restart or stop
a server: the machine's server (5432) is never restarted by a test.

The cluster is ``initdb``'d with the machine's PostgreSQL binaries in a temporary directory and
run as an unprivileged account (``nobody`` as root; PostgreSQL refuses to run as root), listening
on 127.0.0.1 only, trust auth; ``remove`` stops it and deletes the directory.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cli import free_port

__all__ = ["Cluster", "private_cluster"]


def _bin_dir() -> Path:
    """The newest of the machine's PostgreSQL installations (Debian: /usr/lib/postgresql/N)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_major)
    if not found:
        raise AssertionError(
            "no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)"
        )
    return Path(found[-1]).parent


def _major(path: str) -> int:
    return int(Path(path).parent.parent.name.split(".")[0])


@dataclass
class Cluster:
    bin_dir: Path
    directory: Path
    port: int
    user: str | None  # the account the server runs as; None: ours

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        return subprocess.run(
            [*prefix, *command], capture_output=True, text=True, check=True, timeout=120
        )

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args)

    def start(self) -> None:
        self._pg_ctl("-l", str(self.directory / "server.log"), "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-l", str(self.directory / "server.log"), "restart")

    def running(self) -> bool:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        status = subprocess.run(
            [*prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "status"],
            capture_output=True,
            text=True,
        )
        return status.returncode == 0

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A started cluster of the test's own; stopped (immediately) and removed afterwards."""
    bin_dir = _bin_dir()
    directory = Path(tempfile.mkdtemp(prefix="cronlock-cluster-"))
    user = "nobody" if os.geteuid() == 0 else None
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    cluster = Cluster(bin_dir, directory, free_port(), user)
    try:
        cluster._run(
            str(bin_dir / "initdb"),
            "-D",
            str(cluster.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {cluster.port}\n"
                "listen_addresses = '127.0.0.1'\n"
                "unix_socket_directories = ''\n"
                "fsync = off\n"
                "max_connections = 100\n"
            )
        cluster.start()
        yield cluster
    finally:
        if cluster.running():
            subprocess.run(
                [
                    *(["runuser", "-u", user, "--"] if user else []),
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(cluster.data),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                check=False,
            )
        shutil.rmtree(directory, ignore_errors=True)
