"""Who is looking at the dashboard, and whether a form post may change anything.

The dashboard reads with the API's rules (``access.Access``): its pages are the ``reads``
surface, open to the read token or the token, or to anyone when ``reads`` is public or no token
is configured. A browser sends no Authorization header, so the login form takes the token and
keeps it in a cookie (``COOKIE``: Secure, HttpOnly, SameSite=Strict, scoped to the
dashboard's path): the same token as the API, no second secret.

Writes (retry, cancel, delete, pause, resume) need the token itself, always: a dashboard with
no token configured is read-only and says so, unlike the API, which is then open to anyone,
because a page reached by a browser is one a cross-site form can reach too. A form post is
refused unless (1) its ``csrf`` field is the HMAC of the session's token (``csrf_token``),
which a page of another site cannot read, (2) its Origin (or, without one, its Referer) is
this server's own, a post with neither refused, and (3) the cookie came with it, which
SameSite=Strict already keeps from cross-site requests.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from starlette.requests import Request

from ..access import TOKEN_ENV, Access

__all__ = ["COOKIE", "Viewer", "csrf_token", "same_origin", "viewer"]

COOKIE = "cronlock_dashboard"
_CSRF_CONTEXT = b"cronlock dashboard form v1"


def csrf_token(token: str) -> str:
    """The forms' CSRF token for a session with ``token``: derived, so nothing is stored."""
    return hmac.new(token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Viewer:
    """What the request may do: read the pages, write (the token), and why not, in a line."""

    can_read: bool
    can_write: bool
    grant: Literal["writes", "reads"] | None  # what its token opens (None: no valid token)
    token: str | None  # the session's token, when it has a valid one
    read_only_note: str | None

    @property
    def logged_in(self) -> bool:
        return self.grant is not None

    @property
    def csrf(self) -> str:
        return "" if self.token is None else csrf_token(self.token)

    def csrf_ok(self, given: str | None) -> bool:
        expected = self.csrf.encode()
        return self.token is not None and hmac.compare_digest((given or "").encode(), expected)


def _credentials(request: Request) -> str | None:
    header = request.headers.get("authorization")
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE) or None


def viewer(access: Access, request: Request) -> Viewer:
    token = _credentials(request)
    grant = None if token is None else access.grant(f"Bearer {token}")
    can_read = not access.needs_token("reads") or grant is not None
    can_write = access.token is not None and grant == "writes"
    if access.token is None:
        note = f"Read-only: no token is configured ({TOKEN_ENV}), so nothing can be changed here."
    elif not can_write:
        note = "Read-only: log in with the token to retry, cancel, delete, pause or resume."
    else:
        note = None
    return Viewer(
        can_read=can_read,
        can_write=can_write,
        grant=grant,
        token=token if grant is not None else None,
        read_only_note=note,
    )


def same_origin(request: Request) -> bool:
    """Whether a post's Origin (or, without one, its Referer) is this server. A browser sends
    Origin with every form post; a post with neither header is refused too, as the README
    says: whatever sent it (a script, a privacy proxy that strips both), it is not a form of
    the dashboard's own origin that can be told apart from one of another."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed or claimed == "null":
        return False
    # The host and port only: behind a proxy that ends TLS the server sees http while the
    # browser says https; another site cannot have this host and port.
    return urlsplit(claimed).netloc == request.url.netloc
