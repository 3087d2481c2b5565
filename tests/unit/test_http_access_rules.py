"""The HTTP API's access policy as pure rules: which header opens what, which host is loopback."""

from __future__ import annotations

import pytest

from cronlock.http import PUBLIC_ENV, READ_TOKEN_ENV, TOKEN_ENV, Access, is_loopback


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.7", False),
        ("api.example.com", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "granted"),
    [
        ("Bearer w", "writes"),
        ("bearer w", "writes"),
        ("Bearer  w ", "writes"),
        ("Bearer r", "reads"),
        ("Bearer wr", None),
        ("Bearer ", None),
        ("Basic w", None),
        ("w", None),
        ("", None),
        (None, None),
        ("Bearer \u00e9", None),  # not ASCII: compared as bytes, never an error
    ],
)
def test_what_a_header_opens(header: str | None, granted: str | None) -> None:
    assert Access.configure(token="w", read_token="r").grant(header) == granted


def test_the_environment_fills_what_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Access.configure().open
    assert Access.configure().public == {"healthz"}
    monkeypatch.setenv(TOKEN_ENV, "w")
    monkeypatch.setenv(PUBLIC_ENV, " reads ,metrics,")
    access = Access.configure()
    assert (access.token, access.read_token, access.public) == (
        "w",
        None,
        frozenset({"reads", "metrics"}),
    )
    assert Access.configure(token="given", public=[]).token == "given"
    assert Access.configure(public="none").public == frozenset()
    monkeypatch.setenv(TOKEN_ENV, "")  # an empty variable is an unset one
    assert Access.configure().open


def test_public_surfaces_and_the_open_api() -> None:
    closed = Access.configure(token="w", public="none")
    assert all(closed.needs_token(s) for s in ("writes", "reads", "metrics", "healthz"))
    default = Access.configure(token="w")
    assert [default.needs_token(s) for s in ("writes", "reads", "metrics", "healthz")] == [
        True,
        True,
        True,
        False,
    ]
    wide_open = Access.configure(public="none")
    assert wide_open.open and not any(
        wide_open.needs_token(s) for s in ("writes", "reads", "metrics", "healthz")
    )
