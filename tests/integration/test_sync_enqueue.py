"""Enqueueing from sync code in the caller's transaction (issue 24, item 2): ``app.sync`` on a
psycopg 3 connection, a psycopg2 connection, and sync SQLAlchemy Sessions and Connections on
both drivers. The job exists if and only if the caller commits; the checks, options and errors
are ``App.enqueue``'s; nothing is sent on bad input. (Django's connection: test_django.py.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import psycopg2
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from cronlock import (
    App,
    Database,
    DatabaseUnavailable,
    InvalidJobOption,
    InvalidPayload,
    UnknownJobType,
)

# A client of each kind, on a URL, whose transaction the test ends: (client, commit, rollback).
Client = tuple[Any, Callable[[], None], Callable[[], None]]


@contextmanager
def _psycopg(url: str) -> Iterator[Client]:
    with psycopg.connect(url) as conn:
        yield conn, conn.commit, conn.rollback


@contextmanager
def _psycopg_client_cursor(url: str) -> Iterator[Client]:
    # Cursors that bind client-side: sent the text every driver takes, not psycopg's binary.
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        yield conn, conn.commit, conn.rollback


@contextmanager
def _psycopg2(url: str) -> Iterator[Client]:
    conn = psycopg2.connect(url)
    try:
        yield conn, conn.commit, conn.rollback
    finally:
        conn.close()


def _session(driver: str) -> Callable[[str], AbstractContextManager[Client]]:
    @contextmanager
    def client(url: str) -> Iterator[Client]:
        engine = create_engine(url.replace("postgresql:", f"postgresql+{driver}:", 1))
        try:
            with Session(engine) as session:
                yield session, session.commit, session.rollback
        finally:
            engine.dispose()

    return client


def _connection(driver: str) -> Callable[[str], AbstractContextManager[Client]]:
    @contextmanager
    def client(url: str) -> Iterator[Client]:
        engine = create_engine(url.replace("postgresql:", f"postgresql+{driver}:", 1))
        try:
            with engine.connect() as conn:
                yield conn, conn.commit, conn.rollback
        finally:
            engine.dispose()

    return client


CLIENTS = {
    "psycopg": _psycopg,
    "psycopg-client-cursor": _psycopg_client_cursor,
    "psycopg2": _psycopg2,
    "session-psycopg": _session("psycopg"),
    "session-psycopg2": _session("psycopg2"),
    "connection-psycopg": _connection("psycopg"),
    "connection-psycopg2": _connection("psycopg2"),
}


def _app() -> App:
    app = App()

    @app.job("send", max_retries=2, timeout=30)
    async def send(session: Any, payload: Any) -> None:
        pass

    return app


def _jobs(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT id, job_type, payload, queue, priority, max_retries, dedup_key, "
            "concurrency_key, concurrency_limit, timeout, run_at - created_at AS delay, "
            "trace_context FROM cronlock.jobs ORDER BY created_at, payload::text"
        )
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.fixture(params=sorted(CLIENTS))
def client_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def test_the_job_commits_with_the_callers_work_and_rolls_back_with_it(
    database_url: str, client_kind: str
) -> None:
    app = _app()
    with CLIENTS[client_kind](database_url) as (client, commit, rollback):
        app.sync.enqueue_tx(client, "send", {"to": "gone"})
        rollback()
        assert _jobs(database_url) == []
        answer = app.sync.enqueue_tx(
            client,
            "send",
            {"to": "a@example.com"},
            priority=5,
            queue="mail",
            delay=60,
            concurrency_key="a",
            concurrency_limit=2,
            timeout=4.5,
        )
        assert _jobs(database_url) == []  # not before the caller commits
        commit()
    [job] = _jobs(database_url)
    assert answer.created and job["id"] == answer.id
    assert job["payload"] == {"to": "a@example.com"} and job["job_type"] == "send"
    assert (job["queue"], job["priority"], job["max_retries"]) == ("mail", 5, 2)
    assert (job["concurrency_key"], job["concurrency_limit"], job["timeout"]) == ("a", 2, 4.5)
    assert timedelta(seconds=59) < job["delay"] <= timedelta(seconds=61)
    assert job["trace_context"] is None


def test_many_jobs_in_one_call_with_and_without_concurrency_keys(
    database_url: str, client_kind: str
) -> None:
    app = _app()
    keys = ["a", None, "b", None]
    with CLIENTS[client_kind](database_url) as (client, commit, _):
        answers = app.sync.enqueue_many_tx(
            client, "send", [{"n": i} for i in range(4)], concurrency_keys=keys
        )
        plain = app.sync.enqueue_many_tx(client, "send", [{"n": 4}, {"n": 5}], priority=3)
        commit()
    jobs = {job["id"]: job for job in _jobs(database_url)}
    assert len(jobs) == 6 and {a.id for a in answers + plain} == set(jobs)
    stored = [(jobs[a.id]["concurrency_key"], jobs[a.id]["concurrency_limit"]) for a in answers]
    assert stored == [("a", 1), (None, None), ("b", 1), (None, None)]  # the default limit, 1
    assert [(jobs[a.id]["payload"], jobs[a.id]["priority"]) for a in plain] == [
        ({"n": 4}, 3),
        ({"n": 5}, 3),
    ]
    assert all(jobs[a.id]["dedup_key"] is None for a in answers + plain)


def test_many_jobs_in_one_call_with_dedup_keys(database_url: str, client_kind: str) -> None:
    app = _app()
    with CLIENTS[client_kind](database_url) as (client, commit, _):
        first = app.sync.enqueue_many_tx(
            client, "send", [{"n": i} for i in range(500)], dedup_keys=["k", *[None] * 499]
        )
        # The key is held by a waiting job of this same transaction: no second job.
        again = app.sync.enqueue_tx(client, "send", {"n": "again"}, dedup_key="k")
        commit()
    assert len(first) == 500 and all(a.created for a in first)
    assert len({a.id for a in first}) == 500
    assert not again.created and again.id == first[0].id
    jobs = _jobs(database_url)
    [held] = [j for j in jobs if j["dedup_key"] == "k"]
    assert len(jobs) == 500 and held["id"] == first[0].id
    # And from another transaction, after the commit.
    with CLIENTS[client_kind](database_url) as (client, commit, _):
        later = app.sync.enqueue_tx(client, "send", {}, dedup_key="k")
        commit()
    assert not later.created and later.id == first[0].id


@pytest.mark.parametrize(
    ("call", "error", "line"),
    [
        (lambda a, c: a.sync.enqueue_tx(c, "nosuch", {}), UnknownJobType, "nosuch"),
        (lambda a, c: a.sync.enqueue_tx(c, "send", [1]), InvalidPayload, "JSON object"),
        (lambda a, c: a.sync.enqueue_tx(c, "send", {}, priority=2**40), InvalidJobOption, "32"),
        (
            lambda a, c: a.sync.enqueue_many_tx(c, "send", [{}, {"x": object()}]),
            InvalidPayload,
            "payload 1",
        ),
        (
            lambda a, c: a.sync.enqueue_many_tx(c, "send", [{}, {}], dedup_keys=["a"]),
            InvalidJobOption,
            "dedup",
        ),
        (
            lambda a, c: a.sync.enqueue_tx(c, "send", {}, run_at=datetime(2030, 1, 1)),
            InvalidJobOption,
            "timezone",
        ),
    ],
)
def test_bad_input_is_one_error_and_sends_nothing(
    database_url: str,
    call: Callable[[App, Any], object],
    error: type[Exception],
    line: str,
) -> None:
    app = _app()
    with _psycopg(database_url) as (client, commit, _):
        client.execute("CREATE TEMPORARY TABLE mine (x int)")
        client.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(error) as raised:
            call(app, client)
        assert line in str(raised.value) and "\n" not in str(raised.value)
        # Nothing was sent: the caller's transaction goes on as if nothing happened.
        assert client.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        commit()
    assert _jobs(database_url) == []


def test_an_unknown_type_is_enqueued_when_allowed(database_url: str) -> None:
    app = _app()
    with _psycopg(database_url) as (client, commit, _):
        answer = app.sync.enqueue_tx(client, "elsewhere", {}, allow_unknown=True)
        commit()
    [job] = _jobs(database_url)
    assert job["id"] == answer.id and job["job_type"] == "elsewhere"


@pytest.mark.parametrize("kind", ["async", "other"])
def test_a_client_it_cannot_use_is_refused_in_one_line(database_url: str, kind: str) -> None:
    app = _app()
    if kind == "async":
        database = Database(database_url)
        client: Any = database.session()
        match = "is async: use `await app.enqueue_tx"
    else:
        client = object()
        match = "cannot enqueue on a builtins.object"
    with pytest.raises(InvalidJobOption, match=match):
        app.sync.enqueue_tx(client, "send", {})


def test_a_database_without_the_schema_says_migrate(empty_database: Database) -> None:
    url = str(empty_database.url.set(drivername="postgresql").render_as_string(False))
    app = _app()
    with _psycopg(url) as (client, _, rollback):
        with pytest.raises(DatabaseUnavailable, match="run `cronlock migrate`"):
            app.sync.enqueue_tx(client, "send", {})
        rollback()


def test_a_sync_enqueued_job_is_run_by_a_drainer(database_url: str) -> None:
    app = App()
    seen: list[Any] = []

    @app.job("record")
    def record(session: Session, payload: Any) -> None:
        seen.append(payload)
        session.execute(text("CREATE TABLE IF NOT EXISTS done (n int)"))
        session.execute(text("INSERT INTO done VALUES (:n)"), {"n": payload["n"]})

    with _psycopg(database_url) as (client, commit, _):
        app.sync.enqueue_many_tx(client, "record", [{"n": 1}, {"n": 2}])
        commit()
    app.use_database(database_url)
    result = asyncio.run(_drain(app))
    assert (result.stats["processed"], result.stats["failed"]) == (2, 0)
    assert sorted(p["n"] for p in seen) == [1, 2]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM done").fetchone() == (2,)
        assert conn.execute(
            "SELECT count(*) FROM cronlock.jobs WHERE status = 'completed'"
        ).fetchone() == (2,)


async def _drain(app: App) -> Any:
    try:
        return await app.drain(max_seconds=30)
    finally:
        await app.aclose()


def test_ids_are_the_rows_ids(database_url: str) -> None:
    app = _app()
    with _psycopg2(database_url) as (client, commit, _):
        answers = app.sync.enqueue_many_tx(client, "send", [{}, {}, {}])
        commit()
    assert all(isinstance(a.id, uuid.UUID) for a in answers)
    assert {a.id for a in answers} == {j["id"] for j in _jobs(database_url)}
