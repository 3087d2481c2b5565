"""Typed payloads (issue 25, item 1) on every surface: a wrong field is refused before anything
is written, with the field named, from Python (async and sync enqueues), ``POST /jobs`` (422
with the field errors) and ``cronlock enqueue`` (one line, exit 2); the handler receives the
model and a typed result is checked; ``GET /job-types`` gives each type's JSON Schema.

Every mode's handling (the handler receives the model, a stale row fails its attempt) is the
feature matrix's (test_matrix.py); the checks themselves, without a database, test_payloads.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from cli import invoke, invoke_async, run_cli
from jobsupport import job_rows
from testapps import typed
from testapps.typed import Resize, SendEmail

from cronlock import App, Database, InvalidPayload, JobError
from cronlock.http import create_api

TOKEN = "typed-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APP = ("--app", "testapps.typed")


@pytest.fixture
async def app(database: Database) -> AsyncIterator[App]:
    app = typed.create_app()
    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


@pytest.fixture
async def client(app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_api(app, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://cronlock") as http:
        yield http


GOOD: dict[str, Any] = {"to": "a@b.c", "subject": "Welcome aboard", "user_id": 7}


# -- Python -----------------------------------------------------------------------------------


async def test_python_refuses_a_wrong_field_naming_it_and_writes_nothing(
    app: App, database: Database
) -> None:
    with pytest.raises(JobError) as refused:
        await app.enqueue("send_email", {**GOOD, "user_id": "seven"})
    assert isinstance(refused.value, InvalidPayload)
    assert str(refused.value).startswith("the payload does not fit SendEmail: user_id: ")
    assert [error["loc"] for error in refused.value.errors] == [["user_id"]]
    with pytest.raises(InvalidPayload, match=r"^payload 41 does not fit Resize: width: "):
        await app.enqueue_many(
            "resize", [Resize("u", 1)] * 41 + [{"url": "u", "width": "wide"}] + [Resize("u", 2)]
        )
    # A producer's declared type (no handler here) is checked the same way.
    with pytest.raises(InvalidPayload, match=r"does not fit Report: days: Input should be"):
        await app.enqueue("report", {"name": "weekly", "days": "7"})
    async with database.session() as session, session.begin():
        with pytest.raises(InvalidPayload, match="does not fit SendEmail: to: Field required"):
            await app.enqueue_tx(session, "send_email", {"subject": "s", "user_id": 1})
    assert await job_rows(database) == []


def test_a_sync_enqueue_refuses_a_wrong_field_and_writes_nothing(database_url: str) -> None:
    app = typed.create_app()
    with psycopg.connect(database_url) as conn:
        with pytest.raises(InvalidPayload, match="does not fit SendEmail: subject: String should"):
            app.sync.enqueue_tx(conn, "send_email", {**GOOD, "subject": ""})
        [answer] = app.sync.enqueue_many_tx(conn, "send_email", [SendEmail(**GOOD)])
        conn.commit()
        count = conn.execute("SELECT count(*) FROM cronlock.jobs").fetchone()
    assert count == (1,) and answer.created


async def test_the_handler_receives_the_model_and_its_result_is_checked(
    app: App, database: Database
) -> None:
    sent = await app.enqueue("send_email", SendEmail(**GOOD))
    resized = await app.enqueue("resize", {"url": "u", "width": 3, "at": datetime.now(UTC)})
    wrong = await app.enqueue("miscount", GOOD)
    negative = await app.enqueue("resize", {"url": "u", "width": -1})  # __post_init__ refuses
    result = await app.drain()
    assert (result.stats["processed"], result.stats["failed"]) == (2, 2)
    [row] = await job_rows(database, id=sent.id)
    assert row["payload"] == {**GOOD, "tags": []}  # an instance is stored whole
    assert row["result"] == {"received": "SendEmail", "to": "a@b.c", "words": 2}
    [row] = await job_rows(database, id=resized.id)
    assert row["result"] == {"received": "Resize", "width": 3, "at": "datetime"}
    [row] = await job_rows(database, id=wrong.id)
    assert row["status"] == "failed"
    assert row["error_message"] == (
        "InvalidPayload: the handler's result does not fit Sent: received: Field required; "
        "words: Field required"
    )
    [row] = await job_rows(database, id=negative.id)
    assert (row["status"], row["error_message"]) == (
        "failed",
        "its payload could not be loaded as Resize: ValueError: width must not be negative",
    )


# -- HTTP -------------------------------------------------------------------------------------


async def test_post_jobs_answers_422_with_the_field_errors_and_writes_nothing(
    client: httpx.AsyncClient, database: Database
) -> None:
    answer = await client.post(
        "/jobs",
        json={"job_type": "send_email", "payload": {"to": "a@b.c", "user_id": "x"}},
        headers=AUTH,
    )
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["detail"] == (
        "the payload does not fit SendEmail: subject: Field required; user_id: Input should be "
        "a valid integer, unable to parse string as an integer"
    )
    assert [(e["loc"], e["type"]) for e in body["errors"]] == [
        (["body", "payload", "subject"], "missing"),
        (["body", "payload", "user_id"], "int_parsing"),
    ]
    dataclass_answer = await client.post(
        "/jobs", json={"job_type": "resize", "payload": {"url": "u", "size": 3}}, headers=AUTH
    )
    assert dataclass_answer.status_code == 422
    assert [e["loc"] for e in dataclass_answer.json()["errors"]] == [
        ["body", "payload", "width"],
        ["body", "payload", "size"],
    ]
    assert await job_rows(database) == []


async def test_post_jobs_enqueues_a_payload_that_fits(client: httpx.AsyncClient, app: App) -> None:
    answer = await client.post(
        "/jobs", json={"job_type": "send_email", "payload": GOOD}, headers=AUTH
    )
    assert answer.status_code == 201, answer.text
    assert (await app.drain()).stats["processed"] == 1
    job = (await client.get(f"/jobs/{answer.json()['id']}", headers=AUTH)).json()
    assert job["result"]["received"] == "SendEmail"


async def test_job_types_give_each_types_json_schema(client: httpx.AsyncClient) -> None:
    listed = await client.get("/job-types", headers=AUTH)
    assert listed.status_code == 200
    types = {entry["job_type"]: entry for entry in listed.json()}
    assert sorted(types) == ["miscount", "report", "resize", "send_email"]
    send = types["send_email"]
    assert send["payload_model"] == "SendEmail" and send["handled"] is True
    assert send["payload_schema"] == SendEmail.model_json_schema()
    assert send["result_model"] == "Sent" and send["result_schema"]["required"] == [
        "received",
        "to",
        "words",
    ]
    report = types["report"]
    assert (report["handled"], report["queue"], report["result_schema"]) == (False, "reports", None)
    assert report["payload_schema"] == {
        "title": "Report",
        "type": "object",
        "properties": {"name": {"type": "string"}, "days": {"type": "integer", "default": 7}},
        "required": ["name"],
        "additionalProperties": False,
    }
    one = await client.get("/job-types/resize", headers=AUTH)
    assert one.status_code == 200 and one.json() == types["resize"]
    missing = await client.get("/job-types/nope", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json() == {"detail": "no job type 'nope' in this app"}
    assert (await client.get("/job-types")).status_code == 401  # a read, behind the token


async def test_an_untyped_job_type_has_no_schema(database: Database) -> None:
    app = App()
    app.declare_job("plain")
    transport = httpx.ASGITransport(app=create_api(app, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        [entry] = (await http.get("/job-types", headers=AUTH)).json()
    assert (entry["payload_model"], entry["payload_schema"]) == (None, None)


# -- the command line -------------------------------------------------------------------------


def test_the_cli_refuses_a_wrong_field_in_one_line_exit_2(
    database_url: str, database: Database
) -> None:
    # A real process, as a shell runs it.
    done = run_cli(
        *APP,
        "enqueue",
        "send_email",
        json.dumps({**GOOD, "subject": ""}),
        database_url=database_url,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "the payload does not fit SendEmail: subject: String should have at least 1" in line
    assert done.stdout == ""


async def test_the_cli_checks_before_it_connects_and_writes_nothing(
    database: Database, database_url: str
) -> None:
    nowhere = "postgresql://nobody@127.0.0.1:9/nowhere"  # nothing listens: never reached
    done = await invoke_async(
        *APP, "enqueue", "resize", '{"url": "u", "width": "3"}', database_url=nowhere
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "the payload does not fit Resize: width: Input should be a valid integer" in line
    done = await invoke_async(*APP, "enqueue", "resize", '{"url": 1}', database_url=database_url)
    assert done.returncode == 2
    assert "url: Input should be a valid string (got int); width: Field required" in done.stderr
    assert await job_rows(database) == []


def test_the_cli_enqueues_a_payload_that_fits(database_url: str) -> None:
    done = invoke(
        *APP, "enqueue", "send_email", json.dumps(GOOD), "--json", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["created"] is True
    drained = invoke(*APP, "drain", "--json", database_url=database_url)
    assert json.loads(drained.stdout)["processed"] == 1, drained.stdout
