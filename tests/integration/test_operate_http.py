"""Operating the queue over HTTP: GET /jobs, retry, cancel, delete, pause, resume, GET /queues;
every write needs the token, errors keep the API's one shape."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from jobsupport import job_app, job_rows
from sqlalchemy import insert
from waiting import eventually

from cronlock import App, Database
from cronlock.http import PUBLIC_ENV, READ_TOKEN_ENV, TOKEN_ENV, create_api
from cronlock.sql.tables import jobs

TOKEN = "s3cret-token"
READ = "read-only-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_AUTH = {"Authorization": f"Bearer {READ}"}


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def app(database: Database) -> AsyncIterator[App]:
    async with job_app(database) as app:
        yield app


@pytest.fixture
async def client(app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_api(app, token=TOKEN, read_token=READ))
    async with httpx.AsyncClient(transport=transport, base_url="http://cronlock") as http:
        yield http


async def _enqueue(client: httpx.AsyncClient, job_type: str = "noop", **body: object) -> str:
    answer = await client.post("/jobs", json={"job_type": job_type, **body}, headers=AUTH)
    assert answer.status_code == 201, answer.text
    view = answer.json()
    assert view["job_id"] == view["id"]  # the reference's name, and ours beside it
    return str(view["job_id"])


async def test_get_jobs_filters_and_pages(client: httpx.AsyncClient) -> None:
    ids = [await _enqueue(client) for _ in range(3)]
    other = await _enqueue(client, "echo", queue="other")
    first = await client.get("/jobs", params={"limit": 2}, headers=READ_AUTH)
    assert first.status_code == 200, first.text
    page = first.json()
    assert [j["id"] for j in page["jobs"]] == [other, ids[2]]
    rest = await client.get(
        "/jobs", params={"limit": 2, "cursor": page["next_cursor"]}, headers=READ_AUTH
    )
    assert [j["id"] for j in rest.json()["jobs"]] == [ids[1], ids[0]]
    assert rest.json()["next_cursor"] is None
    only = await client.get(
        "/jobs", params={"queue": "other", "status": ["pending", "retrying"]}, headers=READ_AUTH
    )
    assert [j["id"] for j in only.json()["jobs"]] == [other]
    for params, fragment in (
        ({"status": "lost"}, "status"),
        ({"cursor": "nope"}, "not a cursor"),
        ({"limit": 0}, "limit"),
        ({"created_after": "2026-01-01T00:00:00"}, "timezone-aware"),
    ):
        bad = await client.get("/jobs", params=params, headers=READ_AUTH)
        assert bad.status_code == 422, (params, bad.text)
        assert fragment in bad.json()["detail"]


async def test_retry_cancel_delete(client: httpx.AsyncClient, app: App, database: Database) -> None:
    job_id = await _enqueue(client)
    cancelled = await client.post(f"/jobs/{job_id}/cancel", headers=AUTH)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {
        "id": job_id,
        "outcome": "cancelled",
        "changed": True,
        "status": "cancelled",
        "detail": "cancelled",
    }
    conflict = await client.post(f"/jobs/{job_id}/cancel", headers=AUTH)
    assert conflict.status_code == 409 and conflict.json()["detail"].startswith("wrong_status")
    assert (await client.post(f"/jobs/{job_id}/retry", headers=AUTH)).status_code == 409
    deleted = await client.delete(f"/jobs/{job_id}", headers=AUTH)
    assert (deleted.status_code, deleted.json()["outcome"]) == (200, "deleted")
    missing = await client.delete(f"/jobs/{job_id}", headers=AUTH)
    assert missing.status_code == 404 and set(missing.json()) == {"detail"}
    assert (await client.post("/jobs/not-a-uuid/retry", headers=AUTH)).status_code == 422

    waiting = await _enqueue(client)
    refused = await client.delete(f"/jobs/{waiting}", headers=AUTH)
    assert refused.status_code == 409 and "cancel it first" in refused.json()["detail"]

    async with database.engine.begin() as conn:
        failed = (
            await conn.execute(
                insert(jobs)
                .values(
                    job_type="noop", payload={}, status="failed", completed_at=datetime.now(UTC)
                )
                .returning(jobs.c.id)
            )
        ).scalar_one()
    retried = await client.post(f"/jobs/{failed}/retry", headers=AUTH)
    assert retried.status_code == 200 and retried.json()["status"] == "retrying"
    await app.drain()
    assert {r["status"] for r in await job_rows(database)} == {"completed"}


async def test_cancel_of_a_running_job_stops_it(
    client: httpx.AsyncClient, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    monkeypatch.setenv("GATE_STARTED", str(started))
    monkeypatch.setenv("GATE_RELEASE", str(release))
    first = await _enqueue(client, "gated", payload={"n": 1})
    second = await _enqueue(client, "gated", payload={"n": 2})

    async def running(n: int) -> bool:
        return started.exists() and started.read_text() == str(n)

    drain = asyncio.create_task(app.drain())  # a one-off drain: its poll finds the requests
    try:
        await eventually(lambda: running(1))
        answer = await client.post(f"/jobs/{first}/cancel", headers=AUTH)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["outcome"], answer.json()["status"]) == ("cancelled", "cancelled")
        await eventually(lambda: running(2))
        asked = await client.post(f"/jobs/{second}/cancel", params={"wait": 0}, headers=AUTH)
        assert asked.status_code == 202, asked.text
        assert (asked.json()["outcome"], asked.json()["changed"]) == ("cancel_requested", False)
        too_long = await client.post(f"/jobs/{second}/cancel?wait=61", headers=AUTH)
        assert too_long.status_code == 422
        without = await client.post(f"/jobs/{second}/cancel", headers=READ_AUTH)
        assert without.status_code in (401, 403)
    except BaseException:
        release.write_text("go")  # let the drain end
        raise
    finally:
        result = await drain
    assert result.stats["cancelled"] == 2 and result.stats["processed"] == 0
    for job_id in (first, second):
        view = (await client.get(f"/jobs/{job_id}", headers=AUTH)).json()
        assert view["status"] == "cancelled"
        assert [e["outcome"] for e in view["error_history"]] == ["cancelled"]
    again = await client.post(f"/jobs/{first}/cancel", headers=AUTH)
    assert again.status_code == 409 and again.json()["detail"].startswith("wrong_status")
    assert not release.exists()  # both stopped, never let go


async def test_pause_resume_and_queues(client: httpx.AsyncClient, app: App) -> None:
    await _enqueue(client)
    paused = await client.post("/queues/default/pause", headers=AUTH)
    assert paused.status_code == 200, paused.text
    assert (paused.json()["paused"], paused.json()["changed"]) == (True, True)
    listed = (await client.get("/queues", headers=READ_AUTH)).json()
    [default] = [q for q in listed if q["queue"] == "default"]
    assert default["paused"] and default["due"] == 1 and not default["unserved"]
    assert (await app.drain()).stats["processed"] == 0
    resumed = await client.post("/queues/default/resume", headers=AUTH)
    assert resumed.json()["paused"] is False
    assert (await app.drain()).stats["processed"] == 1
    too_long = await client.post(f"/queues/{'q' * 201}/pause", headers=AUTH)
    assert too_long.status_code == 422


async def test_a_typod_queue_is_refused_and_an_empty_one_deleted(client: httpx.AsyncClient) -> None:
    await _enqueue(client)
    typo = await client.post("/queues/nosuchqueue/pause", headers=AUTH)
    assert typo.status_code == 422 and "no queue 'nosuchqueue'" in typo.json()["detail"]
    made = await client.post("/queues/later/pause?create=true", headers=AUTH)
    assert made.status_code == 200 and made.json()["paused"] is True
    assert (await client.delete("/queues/default", headers=AUTH)).status_code == 409  # a job
    gone = await client.delete("/queues/later", headers=AUTH)
    assert gone.status_code == 200 and gone.json()["was_paused"] is True
    assert (await client.delete("/queues/later", headers=AUTH)).status_code == 404
    assert (await client.delete("/queues/later", headers=READ_AUTH)).status_code == 403


async def test_every_write_needs_the_token(client: httpx.AsyncClient) -> None:
    job_id = await _enqueue(client)
    writes = [
        ("POST", f"/jobs/{job_id}/retry"),
        ("POST", f"/jobs/{job_id}/cancel"),
        ("DELETE", f"/jobs/{job_id}"),
        ("POST", "/queues/default/pause"),
        ("POST", "/queues/default/resume"),
    ]
    for method, path in writes:
        anonymous = await client.request(method, path)
        assert anonymous.status_code == 401, (method, path)
        read_only = await client.request(method, path, headers=READ_AUTH)
        assert read_only.status_code == 403, (method, path)
        assert set(read_only.json()) == {"detail"}
    for path in ("/jobs", "/queues"):
        assert (await client.get(path)).status_code == 401
    # Nothing was changed by the refused writes.
    view = (await client.get(f"/jobs/{job_id}", headers=AUTH)).json()
    assert view["status"] == "pending"
    assert not [q for q in (await client.get("/queues", headers=AUTH)).json() if q["paused"]]


async def test_enqueue_unknown_type_when_allowed(client: httpx.AsyncClient) -> None:
    refused = await client.post("/jobs", json={"job_type": "elsewhere"}, headers=AUTH)
    assert refused.status_code == 422
    allowed = await client.post(
        "/jobs", json={"job_type": "elsewhere", "allow_unknown": True}, headers=AUTH
    )
    assert allowed.status_code == 201, allowed.text
    assert "no handler or declaration" in allowed.json()["warning"]
    assert uuid.UUID(allowed.json()["job_id"])
