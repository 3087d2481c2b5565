"""Who may call which endpoint of the HTTP API, decided before a request's body is read.

Every endpoint belongs to a surface: ``writes`` (``POST /jobs``, the operator's retry, cancel,
delete, pause and resume of queues and tasks, a task's run-now), ``reads`` (``GET /jobs``,
``GET /jobs/{id}``, ``GET /job-types``, ``GET /queues``, ``GET /runs``,
``GET /tasks/{name}/parked``, and the dashboard to come), ``metrics`` and ``healthz``.
``Access`` is the policy: the token (``CRONLOCK_API_TOKEN``) opens every surface, the read token
(``CRONLOCK_API_READ_TOKEN``) every surface but writes, and the surfaces named public
(``CRONLOCK_API_PUBLIC``, by default ``healthz``, which a load balancer probes without a token)
need none. With no token configured at all, every surface is open to anyone: fine on a laptop,
so the router says so in a WARNING and ``cronlock serve`` keeps to a loopback address unless
told otherwise (``is_loopback``).

FastAPI reads and validates a body before any dependency runs, so a dependency cannot refuse a
request before its body is in memory. ``GuardedRoute``, the router's route class, checks first:
the Authorization header, then the Content-Length, and it counts what is read of a body sent
without one (chunked), stopping at the limit. A route class travels with the router into any
FastAPI app that includes it, which an app middleware would not, and its refusals are built
here in the API's one error shape for the same reason. ``Guard``, the dependency that marks a
route as needing a token, is also what puts the bearer scheme in the OpenAPI document, and it
checks again if a route was somehow built without ``GuardedRoute``: late, but never open.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.exc import DBAPIError

from .. import pg, schema
from ..errors import ConfigurationError, CronlockError, DatabaseUnavailable
from ..outcome import error_line

try:
    from fastapi import HTTPException, Request, Response
    from fastapi.responses import JSONResponse
    from fastapi.routing import APIRoute
    from fastapi.security import HTTPBearer
    from starlette.requests import HTTPConnection
    from starlette.types import Message, Receive
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the HTTP API needs the 'http' extra: pip install 'cronlock[http]'"
    ) from exc

__all__ = [
    "DEFAULT_PUBLIC",
    "MAX_BODY_BYTES",
    "PUBLIC_ENV",
    "READ_TOKEN_ENV",
    "TOKEN_ENV",
    "Access",
    "Guard",
    "GuardedRoute",
    "Surface",
    "is_loopback",
]

logger = logging.getLogger("cronlock.http")

TOKEN_ENV = "CRONLOCK_API_TOKEN"
READ_TOKEN_ENV = "CRONLOCK_API_READ_TOKEN"
PUBLIC_ENV = "CRONLOCK_API_PUBLIC"
MAX_BODY_BYTES = 256 * 1024

Surface = Literal["writes", "reads", "metrics", "healthz"]
# Writes are never public while a token is set: an API open to writes is one with no token.
OPENABLE: tuple[Surface, ...] = ("reads", "metrics", "healthz")
DEFAULT_PUBLIC: frozenset[Surface] = frozenset({"healthz"})
_CHECKED = "cronlock.access_checked"  # scope key: GuardedRoute checked this request already


def _token(given: str | None, env: str) -> str | None:
    if given is None:
        return os.environ.get(env) or None  # an empty variable is an unset one, as in a shell
    if not given:
        raise ConfigurationError(f"an empty API token is no token: leave it unset ({env})")
    return given


def _surfaces(public: Iterable[str] | str) -> frozenset[Surface]:
    names = public.split(",") if isinstance(public, str) else list(public)
    chosen: set[Surface] = set()
    for raw in names:
        name = raw.strip()
        if not name or name == "none":
            continue
        surface = next((s for s in OPENABLE if s == name), None)
        if surface is None:
            raise ConfigurationError(
                f"{name!r} cannot be public: choose from {', '.join(OPENABLE)} (or none)"
            )
        chosen.add(surface)
    return frozenset(chosen)


@dataclass(frozen=True)
class Refusal:
    """A request answered before its body is read: a status, one line, its headers."""

    status: int
    detail: str
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.detail}, self.status, headers=self.headers)

    def exception(self) -> HTTPException:
        return HTTPException(self.status, self.detail, self.headers or None)


UNAUTHENTICATED = Refusal(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
READ_ONLY = Refusal(
    403, "this token may only read", {"WWW-Authenticate": 'Bearer error="insufficient_scope"'}
)


def _too_large(limit: int) -> Refusal:
    return Refusal(413, f"the request body is over {limit} bytes")


@dataclass(frozen=True)
class Access:
    """The tokens and the public surfaces; ``configure`` fills what is not given from the
    environment. The tokens never appear in its repr."""

    token: str | None = field(default=None, repr=False)
    read_token: str | None = field(default=None, repr=False)
    public: frozenset[Surface] = DEFAULT_PUBLIC

    @classmethod
    def configure(
        cls,
        *,
        token: str | None = None,
        read_token: str | None = None,
        public: Iterable[str] | str | None = None,
    ) -> Access:
        """``token`` defaults to ``$CRONLOCK_API_TOKEN``, ``read_token`` to
        ``$CRONLOCK_API_READ_TOKEN``, ``public`` (names, or one comma-separated string; empty
        or ``none`` for no public surface) to ``$CRONLOCK_API_PUBLIC``, then ``healthz``."""
        token = _token(token, TOKEN_ENV)
        read_token = _token(read_token, READ_TOKEN_ENV)
        if token is not None and token == read_token:
            raise ConfigurationError(
                f"the read token must differ from the token ({READ_TOKEN_ENV}, {TOKEN_ENV})"
            )
        if public is None:
            public = os.environ.get(PUBLIC_ENV)
        surfaces = DEFAULT_PUBLIC if public is None else _surfaces(public)
        return cls(token=token, read_token=read_token, public=surfaces)

    @property
    def open(self) -> bool:
        """No token configured: every surface, writes included, answers anyone."""
        return self.token is None and self.read_token is None

    def needs_token(self, surface: Surface) -> bool:
        return not self.open and surface not in self.public

    def grant(self, authorization: str | None) -> Literal["writes", "reads"] | None:
        """What the bearer token in an Authorization header opens, if anything. Both tokens
        are compared, in constant time, whatever the first comparison gave."""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        given = credentials.strip().encode()
        writes = self.token is not None and hmac.compare_digest(given, self.token.encode())
        reads = self.read_token is not None and hmac.compare_digest(given, self.read_token.encode())
        return "writes" if writes else "reads" if reads else None

    def refusal(self, surface: Surface, authorization: str | None) -> Refusal | None:
        """Why a request for ``surface`` with this Authorization header is refused, if it is."""
        if not self.needs_token(surface):
            return None
        granted = self.grant(authorization)
        if granted is None:
            return UNAUTHENTICATED
        if surface == "writes" and granted == "reads":
            return READ_ONLY
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost).
    Any other name counts as reachable from elsewhere: it may resolve anywhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard(HTTPBearer):
    """The dependency that marks a route of ``surface`` as needing a token. ``GuardedRoute``
    checks it before the body is read; this checks again, after, only if it did not."""

    def __init__(self, access: Access, surface: Surface) -> None:
        super().__init__(
            scheme_name="bearer",
            description=(
                f"{TOKEN_ENV} for every endpoint; {READ_TOKEN_ENV}, when set, for every "
                "endpoint but writes."
            ),
            auto_error=False,
        )
        self.access = access
        self.surface = surface

    async def __call__(self, request: HTTPConnection) -> None:
        if request.scope.get(_CHECKED) is self:
            return
        refusal = self.access.refusal(self.surface, request.headers.get("authorization"))
        if refusal is not None:
            raise refusal.exception()


class BodyTooLarge(HTTPException):
    """Raised from inside the body read; an HTTPException so that FastAPI lets it through
    unchanged (anything else it turns into a 400) to ``GuardedRoute``, which answers it."""


def _bounded(receive: Receive, limit: int) -> Receive:
    """``receive``, refusing to hand over more than ``limit`` bytes of body in all."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(413)
        return message

    return bounded


class GuardedRoute(APIRoute):
    """An ``APIRoute`` that answers 401/403 (no valid token), 400 (a Content-Length that is not
    a number) or 413 (a body over ``max_body_bytes``) before FastAPI reads the body; and, after
    it, 422 for input a route let through that cronlock or PostgreSQL refuses, 503 for a
    database without cronlock's schema: never a 500 for input."""

    max_body_bytes = MAX_BODY_BYTES

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        guard = next(
            (d.dependency for d in self.dependencies if isinstance(d.dependency, Guard)), None
        )
        limit = self.max_body_bytes

        async def guarded(request: Request) -> Response:
            if guard is not None:
                refusal = guard.access.refusal(guard.surface, request.headers.get("authorization"))
                if refusal is not None:
                    return refusal.response()
                request.scope[_CHECKED] = guard
            length = request.headers.get("content-length")
            if length is not None:
                if not (length.isascii() and length.strip().isdigit()):
                    return Refusal(400, "the Content-Length header is not a number").response()
                if int(length) > limit:
                    return _too_large(limit).response()
            try:
                return await handler(Request(request.scope, _bounded(request.receive, limit)))
            except BodyTooLarge:
                return _too_large(limit).response()
            except CronlockError as exc:
                return _refusal_of(exc, told=guard is not None).response()
            except DBAPIError as exc:
                refusal = _refusal_of_database(exc)
                if refusal is None:
                    if not pg.connection_lost(exc):
                        raise
                    refusal = _database_lost(exc)
                return refusal.response()
            except OSError as exc:  # the driver's connect, refused or reset, unwrapped
                if not pg.connection_lost(exc):
                    raise
                return _database_lost(exc).response()

        return guarded


def _database_lost(exc: BaseException) -> Refusal:
    """A request the database's restart or outage cut short: a 503 to retry in a moment
    (the pool drops its dead connections, so the next request gets a fresh one)."""
    logger.warning(
        "the database is unreachable: %s",
        error_line(exc),
        extra={"action": "http_database_unavailable"},
    )
    return Refusal(503, "the database is unavailable, retry in a moment", {"Retry-After": "1"})


def _refusal_of(exc: CronlockError, *, told: bool) -> Refusal:
    """A cronlock error a route did not answer itself: input is a 422, a database that is not
    there or not migrated a 503 (its reason, which names the database, only to a caller who
    showed a token); never a 500."""
    if isinstance(exc, DatabaseUnavailable):
        logger.warning("%s", exc, extra={"action": "http_database_unavailable"})
        return Refusal(503, str(exc) if told else "the database is unavailable")
    return Refusal(422, str(exc))


def _refusal_of_database(exc: DBAPIError) -> Refusal | None:
    """The driver's errors that input or the schema cause, as 422 or 503; None for others."""
    if schema.is_schema_missing(exc):
        line = (
            "cronlock's schema is not installed or not migrated to this cronlock's revision: "
            "run `cronlock migrate`"
        )
        logger.warning("%s", line, extra={"action": "http_database_unavailable"})
        return Refusal(503, line)
    state = schema.sqlstate(exc) or ""
    if state.startswith("22"):  # a data exception: a value of the request PostgreSQL refuses
        original = getattr(exc, "orig", None) or exc
        detail = str(original).strip().splitlines()[0] if str(original).strip() else state
        return Refusal(422, f"a value of the request cannot be stored: {detail}")
    return None
