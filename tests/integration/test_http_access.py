"""Who may call which endpoint: the README's matrix, row by row, against a real database.

Each configuration is asked every endpoint with no token, the token, the read token and a
wrong one; the answers must be the README's table, every refusal in the API's one error shape,
and nothing written by a refused write.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import httpx
import pytest
from itemsupport import count
from jobsupport import job_app

from cronlock import App, Database
from cronlock.errors import ConfigurationError
from cronlock.http import PUBLIC_ENV, READ_TOKEN_ENV, TOKEN_ENV, Access, create_api, create_router
from cronlock.sql.tables import jobs

TOKEN = "the-write-token"
READ = "the-read-token"
CREDENTIALS = {
    "no token": {},
    "token": {"Authorization": f"Bearer {TOKEN}"},
    "read token": {"Authorization": f"Bearer {READ}"},
    "wrong token": {"Authorization": "Bearer nope"},
}
ENDPOINTS = ["POST /jobs", "GET /jobs/{id}", "GET /runs", "GET /metrics", "GET /healthz"]

# The README's table. Columns: no token, the token, the read token, a wrong token. An allowed
# GET /jobs/{id} of an unknown id is 404, an allowed POST /jobs 201.
MATRIX: dict[str, tuple[dict[str, Any], dict[str, tuple[int, int, int, int]]]] = {
    "token and read token (the default)": (
        {"token": TOKEN, "read_token": READ},
        {
            "POST /jobs": (401, 201, 403, 401),
            "GET /jobs/{id}": (401, 404, 404, 401),
            "GET /runs": (401, 200, 200, 401),
            "GET /metrics": (401, 200, 200, 401),
            "GET /healthz": (200, 200, 200, 200),
        },
    ),
    "token, reads and metrics public": (
        {"token": TOKEN, "public": "reads,metrics,healthz"},
        {
            "POST /jobs": (401, 201, 401, 401),
            "GET /jobs/{id}": (404, 404, 404, 404),
            "GET /runs": (200, 200, 200, 200),
            "GET /metrics": (200, 200, 200, 200),
            "GET /healthz": (200, 200, 200, 200),
        },
    ),
    "token, nothing public": (
        {"token": TOKEN, "public": ""},
        {
            "POST /jobs": (401, 201, 401, 401),
            "GET /jobs/{id}": (401, 404, 401, 401),
            "GET /runs": (401, 200, 401, 401),
            "GET /metrics": (401, 200, 401, 401),
            "GET /healthz": (401, 200, 401, 401),
        },
    ),
    "read token only (a read-only API)": (
        {"read_token": READ},
        {
            "POST /jobs": (401, 401, 403, 401),
            "GET /jobs/{id}": (401, 401, 404, 401),
            "GET /runs": (401, 401, 200, 401),
            "GET /metrics": (401, 401, 200, 401),
            "GET /healthz": (200, 200, 200, 200),
        },
    ),
    "no token at all (open)": (
        {"public": ""},  # ignored: with no token, everything is open
        {
            "POST /jobs": (201, 201, 201, 201),
            "GET /jobs/{id}": (404, 404, 404, 404),
            "GET /runs": (200, 200, 200, 200),
            "GET /metrics": (200, 200, 200, 200),
            "GET /healthz": (200, 200, 200, 200),
        },
    ),
}


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


async def _ask(http: httpx.AsyncClient, endpoint: str, headers: dict[str, str]) -> httpx.Response:
    method, path = endpoint.split(" ")
    if method == "POST":
        return await http.post(path, json={"job_type": "echo"}, headers=headers)
    return await http.get(path.replace("{id}", str(uuid.uuid4())), headers=headers)


async def _answers(
    app: App, **config: Any
) -> tuple[dict[str, tuple[int, ...]], list[httpx.Response]]:
    transport = httpx.ASGITransport(app=create_api(app, **config))
    table: dict[str, tuple[int, ...]] = {}
    refused: list[httpx.Response] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://cronlock") as http:
        for endpoint in ENDPOINTS:
            answers = [await _ask(http, endpoint, h) for h in CREDENTIALS.values()]
            table[endpoint] = tuple(answer.status_code for answer in answers)
            refused += [answer for answer in answers if answer.status_code in (401, 403)]
    return table, refused


@pytest.mark.parametrize("row", list(MATRIX))
async def test_the_access_matrix(database: Database, row: str) -> None:
    config, expected = MATRIX[row]
    async with job_app(database) as app:
        table, refused = await _answers(app, **config)
    assert table == expected
    for answer in refused:
        assert set(answer.json()) == {"detail"}
        if answer.status_code == 401:
            assert answer.headers["www-authenticate"] == "Bearer"
            assert answer.json()["detail"] == "a valid bearer token is required"
        else:
            assert answer.headers["www-authenticate"] == 'Bearer error="insufficient_scope"'
            assert answer.json()["detail"] == "this token may only read"
    # Only the 201s wrote anything.
    created = sum(status == 201 for status in expected["POST /jobs"])
    assert await count(database, jobs) == created


async def test_the_environment_configures_it(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(READ_TOKEN_ENV, READ)
    monkeypatch.setenv(PUBLIC_ENV, "metrics, healthz")
    async with job_app(database) as app:
        table, _ = await _answers(app)
    assert table == {
        "POST /jobs": (401, 201, 403, 401),
        "GET /jobs/{id}": (401, 404, 404, 401),
        "GET /runs": (401, 200, 200, 401),
        "GET /metrics": (200, 200, 200, 200),
        "GET /healthz": (200, 200, 200, 200),
    }


async def test_a_read_shows_nothing_without_the_token(database: Database) -> None:
    """The issue's case: a failed job's payload and error (a card number, a password)."""
    async with job_app(database) as app:
        async with database.session() as session:
            answer = await app.enqueue_tx(session, "echo", {"card": "4111 1111 1111 1111"})
            await session.commit()
        transport = httpx.ASGITransport(app=create_api(app, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            denied = await http.get(f"/jobs/{answer.id}")
            allowed = await http.get(f"/jobs/{answer.id}", headers=CREDENTIALS["token"])
            runs = await http.get("/runs")
    assert (denied.status_code, runs.status_code, allowed.status_code) == (401, 401, 200)
    assert "4111" not in denied.text and "4111" in allowed.text


async def test_the_token_is_checked_before_the_path(database: Database) -> None:
    """A malformed id without a token is a 401: nothing about the request is looked at first."""
    async with job_app(database) as app:
        transport = httpx.ASGITransport(app=create_api(app, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            assert (await http.get("/jobs/not-a-uuid")).status_code == 401
            assert (await http.get("/runs", params={"limit": "many"})).status_code == 401
            tokened = await http.get("/jobs/not-a-uuid", headers=CREDENTIALS["token"])
    assert tokened.status_code == 422


async def test_a_public_healthz_keeps_the_reason_for_token_holders(
    empty_database: Database,
) -> None:
    """A load balancer needs the 503; the reason names the database, so it needs a token."""
    app = App()
    app.use_database(str(empty_database.url))
    transport = httpx.ASGITransport(app=create_api(app, token=TOKEN, read_token=READ))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            anonymous = await http.get("/healthz")
            reader = await http.get("/healthz", headers=CREDENTIALS["read token"])
    finally:
        await app.aclose()
    assert (anonymous.status_code, reader.status_code) == (503, 503)
    assert anonymous.json() == {"status": "unavailable", "revision": None, "detail": None}
    assert "cronlock migrate" in reader.json()["detail"]


async def test_a_router_without_its_route_class_still_refuses(database: Database) -> None:
    """The guard is also a dependency: copied onto plain APIRoutes (which check after reading
    the body), a route still refuses a request without the token, in FastAPI's own shape."""
    from fastapi import FastAPI
    from fastapi.routing import APIRoute

    api = FastAPI()
    async with job_app(database) as app:
        for route in create_router(app, token=TOKEN, read_token=READ).routes:
            assert isinstance(route, APIRoute)
            api.router.add_api_route(
                route.path,
                route.endpoint,
                methods=list(route.methods or ()),
                dependencies=route.dependencies,
                route_class_override=APIRoute,
            )
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            table = {
                endpoint: tuple(
                    [(await _ask(http, endpoint, h)).status_code for h in CREDENTIALS.values()]
                )
                for endpoint in ENDPOINTS
            }
            denied = await http.post("/jobs", json={"job_type": "echo"})
    assert table == MATRIX["token and read token (the default)"][1]
    assert denied.headers["www-authenticate"] == "Bearer"
    assert denied.json() == {"detail": "a valid bearer token is required"}


def test_no_token_is_said_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cronlock.http"):
        create_router(App())
        create_api(App())
        create_router(App(), token=TOKEN)
        create_router(App(), read_token=READ)
    warnings = [r for r in caplog.records if r.name == "cronlock.http"]
    assert [r.levelname for r in warnings] == ["WARNING", "WARNING"]
    assert warnings[0].getMessage() == (
        "the HTTP API has no token: every endpoint, POST /jobs included, answers anyone "
        "who can reach it (set CRONLOCK_API_TOKEN)"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"public": "reads,writes"}, "'writes' cannot be public"),
        ({"public": ["dashboard"]}, "'dashboard' cannot be public"),
        ({"token": ""}, "an empty API token is no token"),
        ({"token": TOKEN, "read_token": TOKEN}, "the read token must differ from the token"),
    ],
)
def test_bad_configurations_are_one_line(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        create_router(App(), **config)


def test_the_tokens_stay_out_of_reprs() -> None:
    access = Access.configure(token=TOKEN, read_token=READ, public=["reads"])
    assert TOKEN not in repr(access) and READ not in repr(access)
    assert access.public == {"reads"}
