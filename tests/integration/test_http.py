"""The HTTP API against the real app and a real database: enqueue, read back, refuse bad input.

Who may call what is test_http_access.py's; bodies refused unread, test_http_bodies.py's;
`cronlock serve` itself, test_http_serve.py's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from itemsupport import count, items_app
from jobsupport import job_app
from sqlalchemy import select

from cronlock import App, Database
from cronlock.http import MAX_BODY_BYTES, PUBLIC_ENV, READ_TOKEN_ENV, TOKEN_ENV, create_api
from cronlock.sql.tables import jobs

TOKEN = "s3cret-token"


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def jobs_app(database: Database) -> AsyncIterator[App]:
    """This test's app of the test handlers, on its database."""
    async with job_app(database) as app:
        yield app


@pytest.fixture
async def client(jobs_app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_api(jobs_app, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://cronlock") as http:
        yield http


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_enqueue_drain_read_back(client: httpx.AsyncClient, jobs_app: App) -> None:
    answer = await client.post(
        "/jobs", json={"job_type": "echo", "payload": {"to": "a@b.c"}}, headers=AUTH
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["created"] is True
    job_id = body["id"]

    pending = (await client.get(f"/jobs/{job_id}", headers=AUTH)).json()
    assert pending["status"] == "pending"

    result = await jobs_app.drain()
    assert result.stats["processed"] == 1

    done = await client.get(f"/jobs/{job_id}", headers=AUTH)
    assert done.status_code == 200
    view = done.json()
    assert view["status"] == "completed"
    assert view["result"] == {"echo": {"to": "a@b.c"}}
    assert view["completed_at"] is not None and view["started_at"] is not None


async def test_failing_job_shows_retries_and_history(
    client: httpx.AsyncClient, jobs_app: App
) -> None:
    answer = await client.post("/jobs", json={"job_type": "always_fail"}, headers=AUTH)
    job_id = answer.json()["id"]
    later = datetime.now(UTC)
    for _ in range(3):  # max_retries=2: three attempts, each due when the clock jumps
        later += timedelta(hours=2)

        def clock(moment: datetime = later) -> datetime:
            return moment

        await jobs_app.drainer(clock=clock).drain()
    view = (await client.get(f"/jobs/{job_id}", headers=AUTH)).json()
    assert view["status"] == "failed"
    assert (view["retry_count"], view["max_retries"]) == (2, 2)
    assert [entry["attempt"] for entry in view["error_history"]] == [1, 2, 3]
    assert view["error_message"] == "ValueError: permanent error"


async def test_dedup_hit_returns_the_existing_id(client: httpx.AsyncClient) -> None:
    request = {"job_type": "echo", "payload": {}, "dedup_key": "nightly"}
    first = await client.post("/jobs", json=request, headers=AUTH)
    second = await client.post("/jobs", json=request, headers=AUTH)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"]
    assert second.json()["created"] is False
    assert "dedup_key" in second.json()["detail"]


async def test_a_concurrency_key_is_stored_with_its_limit(
    client: httpx.AsyncClient, database: Database
) -> None:
    request = {"job_type": "echo", "concurrency_key": "acct-3", "concurrency_limit": 4}
    answer = await client.post("/jobs", json=request, headers=AUTH)
    assert answer.status_code == 201, answer.text
    async with database.connect() as conn:
        stored = (
            await conn.execute(select(jobs.c.concurrency_key, jobs.c.concurrency_limit))
        ).one()
    assert tuple(stored) == ("acct-3", 4)


@pytest.mark.parametrize(
    ("request_body", "status", "message"),
    [
        ({"job_type": "nope"}, 422, "no handler registered for job type 'nope'"),
        ({"job_type": "echo", "payload": [1, 2]}, 422, "payload: Input should be a valid dict"),
        ({"job_type": "echo", "payload": "x"}, 422, "payload"),
        ({"job_type": 7}, 422, "job_type: Input should be a valid string"),
        ({"job_type": "echo", "max_retries": "3"}, 422, "max_retries"),
        ({"job_type": "echo", "max_retries": 1000}, 422, "max_retries"),
        ({"job_type": "echo", "delay": -1}, 422, "delay"),
        ({"job_type": "echo", "delay": 1, "run_at": "2030-01-01T00:00:00Z"}, 422, "not both"),
        ({"job_type": "echo", "run_at": "2030-01-01T00:00:00"}, 422, "timezone"),
        ({"job_type": "echo", "colour": "red"}, 422, "colour: Extra inputs are not permitted"),
        ({"payload": {}}, 422, "job_type: Field required"),
        ({"job_type": "echo", "concurrency_limit": 2}, 422, "needs a concurrency_key"),
        ({"job_type": "echo", "concurrency_key": "k", "concurrency_limit": 0}, 422, "limit"),
    ],
)
async def test_bad_requests_write_nothing(
    client: httpx.AsyncClient,
    database: Database,
    request_body: dict[str, object],
    status: int,
    message: str,
) -> None:
    answer = await client.post("/jobs", json=request_body, headers=AUTH)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["detail"]
    assert await count(database, jobs) == 0


async def test_oversized_and_malformed_bodies(
    client: httpx.AsyncClient, database: Database
) -> None:
    big = {"job_type": "echo", "payload": {"blob": "x" * (MAX_BODY_BYTES + 1)}}
    assert (await client.post("/jobs", json=big, headers=AUTH)).status_code == 413
    broken = await client.post(
        "/jobs", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert broken.status_code == 422
    assert "JSON" in broken.json()["detail"]
    assert await count(database, jobs) == 0


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
)
async def test_writes_need_the_token(
    client: httpx.AsyncClient, database: Database, headers: dict[str, str]
) -> None:
    answer = await client.post("/jobs", json={"job_type": "echo"}, headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.json()["detail"] == "a valid bearer token is required"
    assert await count(database, jobs) == 0


async def test_job_ids_are_checked(client: httpx.AsyncClient) -> None:
    assert (await client.get(f"/jobs/{uuid.uuid4()}", headers=AUTH)).status_code == 404
    malformed = await client.get("/jobs/not-a-uuid", headers=AUTH)
    assert malformed.status_code == 422
    assert "job_id" in malformed.json()["detail"]


async def test_runs_and_health(database: Database) -> None:
    async with items_app(database) as app:
        await app.run("explode", manual=True)
        await app.run("thousand", manual=True)
        transport = httpx.ASGITransport(app=create_api(app, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            runs = (await http.get("/runs", headers=AUTH)).json()
            only = (await http.get("/runs", params={"task": "explode"}, headers=AUTH)).json()
            health = await http.get("/healthz")
    assert [r["task"] for r in runs] == ["thousand", "explode"]
    # Issue 16, point 12: what status and `run --json` say of a run, /runs says too.
    assert {(r["trigger"], r["lateness_ms"]) for r in runs} == {("manual", None)}
    assert [r["status"] for r in only] == ["failed"]
    assert only[0]["error"] == "RuntimeError: the body blew up"
    assert health.status_code == 200 and health.json()["status"] == "ok"


async def test_health_reports_an_unmigrated_database(empty_database: Database) -> None:
    app = App()
    app.use_database(str(empty_database.url))
    transport = httpx.ASGITransport(app=create_api(app))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            answer = await http.get("/healthz")
    finally:
        await app.aclose()
    assert answer.status_code == 503
    assert "cronlock migrate" in answer.json()["detail"]


def test_openapi_is_complete() -> None:
    spec = create_api(App(), token=TOKEN).openapi()
    paths = spec["paths"]
    assert set(paths) == {
        "/jobs",
        "/jobs/{job_id}",
        "/jobs/{job_id}/retry",
        "/jobs/{job_id}/cancel",
        "/job-types",
        "/job-types/{job_type}",
        "/queues",
        "/queues/{name}",
        "/queues/{name}/pause",
        "/queues/{name}/resume",
        "/tasks/{name}/pause",
        "/tasks/{name}/resume",
        "/tasks/{name}/run",
        "/tasks/{name}/parked",
        "/runs",
        "/healthz",
        "/metrics",
    }
    post = paths["/jobs"]["post"]
    assert {"201", "200", "401", "403", "413", "422"} <= set(post["responses"])
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorBody"
    )
    assert paths["/jobs/{job_id}"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ]["$ref"].endswith("/JobView")


def test_openapi_describes_the_bearer_scheme() -> None:
    spec = create_api(App(), token=TOKEN).openapi()
    scheme = spec["components"]["securitySchemes"]
    assert list(scheme) == ["bearer"]
    assert (scheme["bearer"]["type"], scheme["bearer"]["scheme"]) == ("http", "bearer")
    operations = _operations(spec)
    secured = {name for name, op in operations.items() if op.get("security")}
    assert secured == {
        "POST /jobs",
        "GET /jobs",
        "GET /jobs/{job_id}",
        "POST /jobs/{job_id}/retry",
        "POST /jobs/{job_id}/cancel",
        "DELETE /jobs/{job_id}",
        "GET /job-types",
        "GET /job-types/{job_type}",
        "GET /queues",
        "POST /queues/{name}/pause",
        "POST /queues/{name}/resume",
        "POST /tasks/{name}/pause",
        "POST /tasks/{name}/resume",
        "POST /tasks/{name}/run",
        "GET /tasks/{name}/parked",
        "DELETE /queues/{name}",
        "GET /runs",
        "GET /metrics",
    }
    assert all(operations[name]["security"] == [{"bearer": []}] for name in secured)
    assert all("401" in operations[name]["responses"] for name in secured)
    assert "401" not in operations["GET /healthz"]["responses"]  # public by default

    # What is public is documented as such: no scheme at all on an API with no token.
    open_spec = create_api(App(), public="reads,metrics,healthz", token=TOKEN).openapi()
    assert {op for op, o in _operations(open_spec).items() if o.get("security")} == {
        "POST /jobs",
        "POST /jobs/{job_id}/retry",
        "POST /jobs/{job_id}/cancel",
        "DELETE /jobs/{job_id}",
        "POST /queues/{name}/pause",
        "POST /queues/{name}/resume",
        "POST /tasks/{name}/pause",
        "POST /tasks/{name}/resume",
        "POST /tasks/{name}/run",
        "DELETE /queues/{name}",
    }  # every write needs the token, whatever is public
    assert "securitySchemes" not in create_api(App()).openapi().get("components", {})


def _operations(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{method.upper()} {path}": operation
        for path, methods in spec["paths"].items()
        for method, operation in methods.items()
    }


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/jobs", {"job_type": "noop"}),
        ("GET", "/jobs", None),
        ("GET", f"/jobs/{uuid.UUID(int=1)}", None),
        ("GET", "/runs", None),
        ("GET", "/queues", None),
        ("POST", "/queues/default/pause", None),
        ("GET", "/metrics", None),
    ],
)
async def test_an_unmigrated_database_is_a_503_with_the_reason(
    empty_database: Database, method: str, path: str, body: dict[str, Any] | None
) -> None:
    # Issue 16, point 7: a router in someone's app on an unmigrated database answered 500.
    app = App()
    app.declare_job("noop")
    app.use_database(str(empty_database.url))
    transport = httpx.ASGITransport(app=create_api(app, token=TOKEN))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            answer = await http.request(method, path, json=body, headers=AUTH)
    finally:
        await app.aclose()
    assert answer.status_code == 503, answer.text
    assert "run `cronlock migrate`" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/jobs", {"job_type": "echo", "queue": "a\u0000b"}),
        ("POST", "/jobs", {"job_type": "nope", "allow_unknown": True, "dedup_key": "k\u0000"}),
        ("POST", "/jobs", {"job_type": "no\u0000pe", "allow_unknown": True}),
        ("GET", "/jobs?job_type=%00", None),
        ("GET", "/jobs?queue=%00", None),
        ("GET", "/runs?task=%00", None),
        ("POST", "/queues/%00/pause", None),
        ("POST", "/queues/%00/resume", None),
    ],
)
async def test_a_nul_anywhere_in_the_request_is_a_422_not_a_500(
    client: httpx.AsyncClient, database: Database, method: str, path: str, body: Any
) -> None:
    # Issue 16, point 6: the HTTP server never answers 500 to input.
    answer = await client.request(method, path, json=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]
    async with database.connect() as conn:
        assert (await conn.execute(jobs.select())).all() == []
