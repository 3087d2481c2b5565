"""``cronlock serve`` itself, a real uvicorn in a subprocess: the token, the start-up warnings,
the refusal to listen on the network with no token, and the server's memory under a 128 MiB body.
The refusals, which start nothing, run in process (tests/support/cli.py).

The memory is read from /proc: VmHWM, the process's peak resident size, before and after, so a
body buffered for even a moment would show (reading and parsing 128 MiB took 84 → 519 MiB).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from cli import finish, free_port, invoke, kill_all, start_cli
from waiting import wait_for

from cronlock import Database
from cronlock.http import MAX_BODY_BYTES

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MiB = 1024 * 1024
WARNING = (
    " WARNING cronlock.http: the HTTP API has no token: every endpoint, POST /jobs included, "
    "answers anyone who can reach it (set CRONLOCK_API_TOKEN)"
)


@dataclass
class Served:
    process: subprocess.Popen[str]
    base: str
    stderr: str = field(default="")  # filled in when it has stopped

    def memory_kib(self, field_name: str) -> int:
        """A field of /proc/<pid>/status, in KiB (VmRSS now, VmHWM the peak so far)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field_name} in /proc/{self.process.pid}/status")


@contextmanager
def serving(*args: str, database_url: str, **env: str) -> Iterator[Served]:
    """``cronlock serve`` on a free port until it answers /healthz; SIGTERM at the end."""
    port = free_port()
    process = start_cli(
        "--app",
        "testapps.jobs",
        "serve",
        "--port",
        str(port),
        *args,
        database_url=database_url,
        **env,
    )
    served = Served(process, f"http://127.0.0.1:{port}")

    def healthy() -> bool:
        try:
            return httpx.get(f"{served.base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return process.poll() is not None  # stop waiting if it died

    try:
        wait_for(healthy, timeout=30)
        assert process.poll() is None, process.communicate()
        yield served
    except BaseException:
        kill_all(process)
        raise
    os.kill(process.pid, signal.SIGTERM)
    code, _, served.stderr = finish(process)
    # uvicorn shuts down gracefully; a stop asked for is a success, as for worker and
    # scheduler (issue 16, point 7: it died of its own re-raised SIGTERM, status 143).
    assert "Finished server process" in served.stderr
    assert code == 0, served.stderr


def test_cronlock_serve(database_url: str) -> None:
    with serving(database_url=database_url, CRONLOCK_API_TOKEN=TOKEN) as served:
        denied = httpx.post(f"{served.base}/jobs", json={"job_type": "echo"})
        made = httpx.post(f"{served.base}/jobs", json={"job_type": "echo"}, headers=AUTH)
        assert (denied.status_code, made.status_code) == (401, 201)
        job = f"{served.base}/jobs/{made.json()['id']}"
        assert httpx.get(job).status_code == 401
        assert httpx.get(job, headers=AUTH).json()["status"] == "pending"
    assert "no token" not in served.stderr


def _huge(total: int, head: bytes = b'{"job_type": "echo", "payload": "') -> Iterator[bytes]:
    """``total`` bytes sent in 1 MiB pieces, never held at once (by the client either)."""
    block = b"x" * MiB
    yield head
    sent = len(head)
    while sent < total:
        piece = block[: total - sent]
        sent += len(piece)
        yield piece


def test_a_huge_body_leaves_the_servers_memory_flat(database_url: str) -> None:
    huge = 128 * MiB
    with serving(database_url=database_url, CRONLOCK_API_TOKEN=TOKEN) as served:
        jobs = f"{served.base}/jobs"
        with httpx.Client(timeout=60) as http:
            # Warm up: a job enqueued and read, so what is imported and cached is in already.
            made = http.post(jobs, json={"job_type": "echo"}, headers=AUTH)
            assert http.get(f"{jobs}/{made.json()['id']}", headers=AUTH).status_code == 200
            peak_before = served.memory_kib("VmHWM")

            sized = {"Content-Length": str(huge), "Content-Type": "application/json"}
            answers = {
                "sized, no token": http.post(jobs, content=_huge(huge), headers=sized),
                "chunked, no token": http.post(jobs, content=_huge(huge)),
                "malformed, no token": http.post(
                    jobs, content=b"{not json", headers={"Content-Type": "application/json"}
                ),
                "sized, token": http.post(jobs, content=_huge(huge), headers={**AUTH, **sized}),
                "chunked, token": http.post(jobs, content=_huge(huge), headers=AUTH),
            }
            peak_after = served.memory_kib("VmHWM")
            still = http.post(jobs, json={"job_type": "echo"}, headers=AUTH)
    too_large = {"detail": f"the request body is over {MAX_BODY_BYTES} bytes"}
    unauthenticated = {"detail": "a valid bearer token is required"}
    assert {name: (a.status_code, a.json()) for name, a in answers.items()} == {
        "sized, no token": (401, unauthenticated),
        "chunked, no token": (401, unauthenticated),
        "malformed, no token": (401, unauthenticated),
        "sized, token": (413, too_large),
        "chunked, token": (413, too_large),
    }
    assert still.status_code == 201
    grown_mib = (peak_after - peak_before) / 1024
    print(f"server peak RSS {peak_before / 1024:.1f} -> {peak_after / 1024:.1f} MiB")
    assert grown_mib < 8, f"the server's peak memory grew by {grown_mib:.1f} MiB"


@pytest.fixture
def never_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, a command that went on to serve would serve here, for ever: it fails."""
    import uvicorn

    def served(*args: object, **kwargs: object) -> None:
        raise AssertionError("uvicorn.run was reached: the command serves instead of refusing")

    monkeypatch.setattr(uvicorn, "run", served)


@pytest.mark.usefixtures("never_served")
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "api.example.com"])
def test_no_token_refuses_a_network_address(host: str) -> None:
    # No database is reachable there: nothing is started or connected before the refusal.
    answer = invoke(
        "--app",
        "testapps.jobs",
        "serve",
        "--host",
        host,
        database_url="postgresql://nobody@127.0.0.1:1/nothing",
    )
    assert answer.returncode == 2
    assert answer.stdout == ""
    assert answer.stderr == (
        f"Error: refusing to listen on {host} with no API token: anyone who can reach it "
        "could enqueue jobs and read them; set CRONLOCK_API_TOKEN (or pass --insecure-open)\n"
    )


def test_a_read_token_alone_may_listen_on_the_network(database_url: str) -> None:
    """Not open (no write is possible at all), so not refused."""
    host = "0.0.0.0"
    with serving("--host", host, database_url=database_url, CRONLOCK_API_READ_TOKEN=TOKEN) as s:
        write = httpx.post(f"{s.base}/jobs", json={"job_type": "echo"}, headers=AUTH)
        read = httpx.get(f"{s.base}/runs", headers=AUTH)
    assert (write.status_code, read.status_code) == (403, 200)
    assert "no token" not in s.stderr


def test_no_token_on_loopback_serves_and_says_so(database_url: str) -> None:
    with serving(database_url=database_url) as served:
        made = httpx.post(f"{served.base}/jobs", json={"job_type": "echo"})
        assert made.status_code == 201  # open, as it said
    lines = served.stderr.splitlines()
    assert sum(line.endswith(WARNING) for line in lines) == 1
    said = [line for line in lines if line.startswith("cronlock serve:")]
    assert said == [
        f"cronlock serve: 127.0.0.1:{served.base.rsplit(':', 1)[1]} has no token: any process "
        "on this machine may enqueue jobs and read their payloads, results and errors "
        "(set CRONLOCK_API_TOKEN)"
    ]


def test_insecure_open_serves_the_network_and_says_so(database_url: str) -> None:
    with serving("--host", "0.0.0.0", "--insecure-open", database_url=database_url) as served:
        assert httpx.get(f"{served.base}/runs").status_code == 200
    lines = served.stderr.splitlines()
    assert sum(line.endswith(WARNING) for line in lines) == 1
    assert any(
        line.startswith("cronlock serve: 0.0.0.0:") and "anyone who can reach it" in line
        for line in lines
    ), served.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--public", "reads,writes"], {}, "'writes' cannot be public"),
        ([], {"CRONLOCK_API_PUBLIC": "everything"}, "'everything' cannot be public"),
        (
            [],
            {"CRONLOCK_API_TOKEN": TOKEN, "CRONLOCK_API_READ_TOKEN": TOKEN},
            "the read token must differ from the token",
        ),
    ],
)
@pytest.mark.usefixtures("never_served")
def test_bad_access_options_are_one_line(
    args: list[str], env: dict[str, str], message: str
) -> None:
    answer = invoke("serve", *args, database_url=None, **env)
    assert answer.returncode == 2
    assert answer.stderr.count("\n") == 1 and message in answer.stderr, answer.stderr


def test_serve_refuses_an_unmigrated_database_in_one_line(empty_database: Database) -> None:
    # Issue 16, point 7: it started, and answered POST /jobs and /metrics with a 500.
    url = empty_database.url.set(drivername="postgresql").render_as_string(hide_password=False)
    answer = invoke("--app", "testapps.jobs", "serve", "--port", "1", database_url=url)
    assert answer.returncode == 2
    [line] = answer.stderr.splitlines()
    assert line.startswith("Error: cronlock's schema 'cronlock' is not installed in ")
    assert line.endswith("run `cronlock migrate`")
