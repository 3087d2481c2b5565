"""Bodies are refused unread: the token first, then the size, before FastAPI reads a byte.

A counting ``receive`` between the client and the app measures what the app read of each body
(``httpx.ASGITransport`` hands the body over chunk by chunk, as a server does). The same checks
hold for the router mounted under a prefix in someone else's FastAPI app, which has neither
cronlock's middleware nor its exception handlers: they travel with the router's route class.
The real server's memory under a 128 MiB body is test_http_serve.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from itemsupport import count
from jobsupport import job_app
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cronlock import Database
from cronlock.http import (
    MAX_BODY_BYTES,
    PUBLIC_ENV,
    READ_TOKEN_ENV,
    TOKEN_ENV,
    create_api,
    create_router,
)
from cronlock.sql.tables import jobs

TOKEN = "s3cret-token"
AUTH: dict[str, str | bytes] = {"Authorization": f"Bearer {TOKEN}"}
CHUNK = 64 * 1024
HUGE = 128 * 1024 * 1024


@dataclass
class Counting:
    """An ASGI app in front of another, counting the body bytes the inner app received."""

    app: ASGIApp
    read: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            self.read += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


async def chunks(total: int) -> AsyncIterator[bytes]:
    """``total`` bytes of a JSON-looking body that never ends well, sent chunked."""
    block = b"x" * CHUNK
    yield b'{"job_type": "echo", "payload": {"blob": "'
    for _ in range(total // CHUNK):
        yield block


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


@dataclass
class Served:
    counting: Counting
    jobs_path: str

    @property
    def read(self) -> int:
        return self.counting.read


@pytest.fixture(params=["create_api", "mounted"])
async def served(request: pytest.FixtureRequest, database: Database) -> AsyncIterator[Served]:
    """cronlock's own app, or the router under /cronlock in a user's plain FastAPI app."""
    async with job_app(database) as app:
        if request.param == "create_api":
            yield Served(Counting(create_api(app, token=TOKEN)), "/jobs")
        else:
            user_api = FastAPI()
            user_api.include_router(create_router(app, token=TOKEN), prefix="/cronlock")
            yield Served(Counting(user_api), "/cronlock/jobs")


async def _post(
    served: Served, headers: dict[str, str | bytes], content: bytes | AsyncIterator[bytes]
) -> httpx.Response:
    # As bytes, the way httpx sends them (a value may be bytes that are no ASCII text).
    raw = [
        (name.encode(), value if isinstance(value, bytes) else value.encode("ascii"))
        for name, value in headers.items()
    ]
    transport = httpx.ASGITransport(app=served.counting)
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        return await http.post(served.jobs_path, headers=raw, content=content)


def _refused(answer: httpx.Response, status: int, detail: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json() == {"detail": detail}


async def test_a_huge_body_without_a_token_is_not_read(served: Served, database: Database) -> None:
    sized = await _post(served, {"Content-Length": str(HUGE)}, content=chunks(HUGE - CHUNK))
    _refused(sized, 401, "a valid bearer token is required")
    assert sized.headers["www-authenticate"] == "Bearer"
    chunked = await _post(served, {}, content=chunks(HUGE))
    _refused(chunked, 401, "a valid bearer token is required")
    assert served.read == 0
    assert await count(database, jobs) == 0


async def test_a_malformed_body_without_a_token_is_a_401(served: Served) -> None:
    answer = await _post(served, {"Content-Type": "application/json"}, content=b"{not json")
    _refused(answer, 401, "a valid bearer token is required")
    assert served.read == 0


async def test_over_the_limit_with_the_token_is_a_413(served: Served, database: Database) -> None:
    too_large = f"the request body is over {MAX_BODY_BYTES} bytes"
    sized = await _post(
        served,
        {**AUTH, "Content-Length": str(MAX_BODY_BYTES + 1)},
        content=b"x" * (MAX_BODY_BYTES + 1),
    )
    _refused(sized, 413, too_large)
    assert served.read == 0  # the Content-Length said enough

    chunked = await _post(served, AUTH, content=chunks(HUGE))
    _refused(chunked, 413, too_large)
    assert 0 < served.read <= MAX_BODY_BYTES + CHUNK  # read up to the limit, then stopped
    assert await count(database, jobs) == 0


async def test_at_the_limit_a_body_is_read(served: Served, database: Database) -> None:
    head = b'{"job_type": "echo", "payload": {"blob": "'
    tail = b'"}}'
    body = head + b"x" * (MAX_BODY_BYTES - len(head) - len(tail)) + tail
    assert len(body) == MAX_BODY_BYTES

    async def streamed() -> AsyncIterator[bytes]:
        for start in range(0, len(body), CHUNK):
            yield body[start : start + CHUNK]

    sized = await _post(served, {**AUTH, "Content-Type": "application/json"}, content=body)
    chunked = await _post(served, {**AUTH, "Content-Type": "application/json"}, content=streamed())
    assert (sized.status_code, chunked.status_code) == (201, 201), chunked.text
    assert served.read == 2 * MAX_BODY_BYTES
    assert await count(database, jobs) == 2


async def test_a_content_length_that_is_not_a_number(served: Served) -> None:
    for length in ("12x", "-1", b"\xb2"):  # the last is latin-1 for a superscript two
        answer = await _post(served, {**AUTH, "Content-Length": length}, content=b"{}")
        _refused(answer, 400, "the Content-Length header is not a number")
    assert served.read == 0
