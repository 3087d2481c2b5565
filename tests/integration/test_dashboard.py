"""The dashboard over HTTP, no browser: every page renders from a seeded history, bad input
gets a 4xx page, reads follow the API's tokens, and a form post needs the token, this
server's origin and the session's CSRF token (tests/e2e/test_dashboard_browser.py drives the
same pages in Chromium)."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from html import unescape

import httpx
import pytest
from dashseed import Seeded, beat, seed
from fastapi import FastAPI
from jobsupport import create_job_tables, job_rows
from testapps import dashboard as dashapp

from cronlock import App, Database
from cronlock.http import (
    PUBLIC_ENV,
    READ_TOKEN_ENV,
    TOKEN_ENV,
    create_api,
    create_dashboard,
)
from cronlock.http.dashboard import COOKIE
from cronlock.http.dashboard.auth import csrf_token

TOKEN = "s3cret-token"
READ = "read-only-token"
BASE = "https://cronlock.test"  # https: the login cookie is Secure
ORIGIN = {"Origin": BASE}


@pytest.fixture(autouse=True)
def _no_api_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, READ_TOKEN_ENV, PUBLIC_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def app(database: Database) -> AsyncIterator[App]:
    await create_job_tables(database)
    app = dashapp.create_app()
    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


@pytest.fixture
async def seeded(app: App) -> Seeded:
    return await seed(app.database, datetime.now(UTC))


def _client(api: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url=BASE)


@pytest.fixture
async def client(app: App) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(create_api(app, token=TOKEN, read_token=READ)) as http:
        yield http


async def _login(client: httpx.AsyncClient, token: str = TOKEN) -> None:
    answer = await client.post(
        "/dashboard/login", data={"token": token, "next": "/dashboard/"}, headers=ORIGIN
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/dashboard/"


def _text(html: str) -> str:
    """The page's text, tags removed and spaces collapsed, for assertions on what it says."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


async def test_overview_shows_every_task_and_queue(
    app: App, client: httpx.AsyncClient, seeded: Seeded
) -> None:
    await _login(client, READ)
    await beat(app.database, seeded)
    answer = await client.get("/dashboard/")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    text = _text(answer.text)
    for task in ("every-minute", "hourly-report", "retired-task"):
        assert f'id="task-{task}"' in answer.text, task
    assert "not registered in this app" in text  # retired-task
    assert "5 * * * * Europe/Madrid" in text
    for queue in ("default", "emails", "reports"):
        assert f'id="queue-{queue}"' in answer.text, queue
    reports = answer.text.split('id="queue-reports"')[1].split("</tr>")[0]
    assert "paused" in _text(reports)
    default = _text(answer.text.split('id="queue-default"')[1].split("</tr>")[0])
    assert "failed 1" in default
    emails = _text(answer.text.split('id="queue-emails"')[1].split("</tr>")[0])
    assert "1 active, 1 standby, 1 gone" in emails  # the gone one is not active
    # Read with the read token: read-only, and it says so; no form posts anything.
    assert "Read-only: log in with the token" in text
    assert 'method="post" action="/dashboard/queues' not in answer.text
    # Every time carries UTC for a reader without JavaScript, and the instant for the script.
    assert re.search(
        r'<time datetime="[^"]+\+00:00" title="[^"]+ UTC">[^<]+ UTC</time>', answer.text
    )


async def test_pages_need_a_token_unless_reads_are_public(app: App, seeded: Seeded) -> None:
    async with _client(create_api(app, token=TOKEN)) as http:
        for path in ("/dashboard/", "/dashboard/jobs", "/dashboard/tasks/every-minute"):
            answer = await http.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/dashboard/login?next=")
        bad = await http.post(
            "/dashboard/login", data={"token": "guess", "next": "/dashboard/"}, headers=ORIGIN
        )
        assert bad.status_code == 401
        assert "not a token of this server" in bad.text
        assert COOKIE not in bad.headers.get("set-cookie", "")
        # The bearer header works too (scripts, curl).
        header = await http.get("/dashboard/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert header.status_code == 200
    async with _client(create_api(app, token=TOKEN, public="reads")) as http:
        answer = await http.get("/dashboard/")
        assert answer.status_code == 200
        assert "Read-only: log in with the token" in _text(answer.text)


async def test_login_cookie_is_secure_http_only_strict_and_scoped(
    client: httpx.AsyncClient, seeded: Seeded
) -> None:
    answer = await client.post(
        "/dashboard/login",
        data={"token": TOKEN, "next": "https://evil.example/"},
        headers=ORIGIN,
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == "/dashboard/"  # never a redirect elsewhere
    cookie = answer.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"secure", "httponly", "samesite", "path"} <= attributes
    assert "samesite=strict" in cookie.lower()
    assert "path=/dashboard/" in cookie.lower()
    page = await client.get("/dashboard/")
    assert page.status_code == 200
    assert "token: can change" in page.text
    assert "Read-only" not in page.text
    out = await client.post("/dashboard/logout", headers=ORIGIN)
    assert out.status_code == 303
    assert (await client.get("/dashboard/")).status_code == 303


async def test_task_page_pictures_every_outcome(client: httpx.AsyncClient, seeded: Seeded) -> None:
    await _login(client)
    answer = await client.get("/dashboard/tasks/every-minute", params={"days": 1})
    assert answer.status_code == 200, answer.text
    cells = re.findall(r'class="cell cell-(\w+)" title="([^"]+)" data-slot="([^"]+)"', answer.text)
    by_slot = {datetime.fromisoformat(slot): (outcome, title) for outcome, title, slot in cells}
    assert by_slot[seeded.missed_slot][0] == "missed"
    assert by_slot[seeded.unrecorded_slot] == (
        "missed",
        f"{seeded.unrecorded_slot:%Y-%m-%d %H:%M} UTC: missed: nobody ran it (not recorded yet)",
    )
    assert by_slot[seeded.failed_run_slot][0] == "failed"
    outcomes = {outcome for outcome, _ in by_slot.values()}
    assert {"completed", "partial", "failed", "skipped", "missed", "interrupted"} <= outcomes
    # The day before the task's first row is left out, and the page says where it begins.
    assert min(by_slot) == seeded.first_slot
    assert "Its history begins at" in answer.text
    # Colour is never the only signal: a legend, a letter and a text in every cell.
    text = _text(answer.text)
    for words in ("completed", "partial: some items failed", "missed: nobody ran it"):
        assert words in text
    assert text.count("UTC: ") >= len(cells)
    # The runs: duration, lateness, items, and each failed item's error.
    assert "post-17 : ValueError: bad encoding" in text
    assert "RuntimeError: the report server is down" in text
    assert "250 ms" in text and "1.0 s" in text
    run_link = re.search(r'href="/dashboard/runs/(\d+)"', answer.text)
    assert run_link is not None
    run = await client.get(f"/dashboard/runs/{run_link.group(1)}")
    assert run.status_code == 200
    for path, status in (
        ("/dashboard/tasks/no-such-task", 404),
        ("/dashboard/tasks/every-minute?days=0", 422),
        ("/dashboard/tasks/every-minute?days=x", 422),
        ("/dashboard/tasks/every-minute?before=nope", 422),
        ("/dashboard/runs/999999", 404),
        ("/dashboard/runs/abc", 422),
    ):
        bad = await client.get(path)
        assert bad.status_code == status, (path, bad.text)
        assert 'role="alert"' in bad.text


async def test_runs_are_paged_newest_first(client: httpx.AsyncClient, seeded: Seeded) -> None:
    await _login(client)
    first = await client.get("/dashboard/tasks/every-minute")
    ids = [
        int(n)
        for n in re.findall(
            r'<th scope="row" data-label="Run"><a href="/dashboard/runs/(\d+)"', first.text
        )
    ]
    assert len(ids) == 30  # 29 slots with a row + the skip beside a completed run
    assert ids == sorted(ids, reverse=True)
    assert "Older runs" not in first.text


async def test_jobs_filter_page_and_show(client: httpx.AsyncClient, seeded: Seeded) -> None:
    await _login(client, READ)
    every = await client.get("/dashboard/jobs")
    assert every.status_code == 200
    listed = re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', every.text)
    # Every job but the completed one, newest first.
    assert listed == [
        str(job)
        for job in (
            seeded.retrying_job,
            seeded.cancelled_job,
            seeded.pending_job,
            seeded.failed_job,
        )
    ]
    completed = await client.get("/dashboard/jobs", params={"status": "completed"})
    assert re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', completed.text) == [
        str(seeded.completed_job)
    ]
    assert "Most recently completed first." in completed.text
    elsewhere = await client.get(
        "/dashboard/jobs", params={"status": "completed", "queue": "reports"}
    )
    assert "No job matches." in elsewhere.text
    failed = await client.get("/dashboard/jobs", params={"status": "failed"})
    assert re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', failed.text) == [
        str(seeded.failed_job)
    ]
    emails = await client.get(
        "/dashboard/jobs", params={"queue": "emails", "status": "completed", "job_type": "echo"}
    )
    assert re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', emails.text) == [
        str(seeded.completed_job)
    ]
    window = await client.get(
        "/dashboard/jobs",
        params={"created_after": "2000-01-01T00:00", "created_before": "2000-01-02T00:00"},
    )
    assert "No job matches." in window.text
    for params, fragment in (
        ({"status": "lost"}, "unknown job status"),
        ({"created_after": "yesterday"}, "not a date and time"),
        ({"cursor": "nope"}, "not a cursor"),
    ):
        bad = await client.get("/dashboard/jobs", params=params)
        assert bad.status_code == 422, params
        assert fragment in bad.text
    job = await client.get(f"/dashboard/jobs/{seeded.failed_job}")
    assert job.status_code == 200
    text = _text(job.text)
    for words in (
        "ana@example.com",
        "ConnectionError: smtp refused",
        "attempt 1",
        "Error history (1)",
    ):
        assert words in text, words
    # A failed job's end is labelled as what it was, not "Completed".
    assert "<dt>Failed</dt>" in job.text and "<dt>Completed</dt>" not in job.text
    done_page = await client.get(f"/dashboard/jobs/{seeded.completed_job}")
    done = _text(done_page.text)
    assert '"echo": {' in done
    assert "<dt>Completed</dt>" in done_page.text
    assert (await client.get(f"/dashboard/jobs/{uuid.uuid4()}")).status_code == 404
    assert (await client.get("/dashboard/jobs/not-a-uuid")).status_code == 422


async def test_jobs_pages_with_a_cursor(app: App, client: httpx.AsyncClient) -> None:
    for n in range(55):
        await app.enqueue("noop", {"n": n})
    await _login(client, READ)
    first = await client.get("/dashboard/jobs", params={"job_type": "noop"})
    ids = re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', first.text)
    assert len(ids) == 50
    more = re.search(r'href="(\?[^"]+)" rel="next"', first.text)
    assert more is not None
    second = await client.get("/dashboard/jobs" + more.group(1).replace("&amp;", "&"))
    rest = re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', second.text)
    assert len(rest) == 5
    assert not set(ids) & set(rest)
    assert "Newest jobs" in second.text
    # Completed ones page the same way, most recently completed first.
    await app.drain(max_seconds=30)
    done = await client.get("/dashboard/jobs", params={"status": "completed"})
    first_done = re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', done.text)
    later = re.search(r'href="(\?[^"]+)" rel="next"', done.text)
    assert len(first_done) == 50 and later is not None
    rest_done = await client.get("/dashboard/jobs" + later.group(1).replace("&amp;", "&"))
    tail = re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', rest_done.text)
    assert len(tail) == 5
    assert set(first_done) | set(tail) == set(ids) | set(rest)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, "no form on the page"
    return found.group(1)


async def test_retry_cancel_delete_from_the_job_page(
    app: App, client: httpx.AsyncClient, seeded: Seeded
) -> None:
    await _login(client)
    page = await client.get(f"/dashboard/jobs/{seeded.failed_job}")
    assert "Retry now" in page.text and "Delete" in page.text and ">Cancel<" not in page.text
    csrf = _csrf(page.text)
    assert csrf == csrf_token(TOKEN)
    retried = await client.post(
        f"/dashboard/jobs/{seeded.failed_job}/retry", data={"csrf": csrf}, headers=ORIGIN
    )
    assert retried.status_code == 303, retried.text
    assert retried.headers["location"].startswith(f"/dashboard/jobs/{seeded.failed_job}?done=")
    (row,) = await job_rows(app.database, id=seeded.failed_job)
    assert row["status"] == "retrying"
    again = await client.post(
        f"/dashboard/jobs/{seeded.failed_job}/delete", data={"csrf": csrf}, headers=ORIGIN
    )
    assert again.status_code == 409  # a waiting job is not deleted: cancel it first
    assert "cancel it first" in again.text
    cancelled = await client.post(
        f"/dashboard/jobs/{seeded.pending_job}/cancel", data={"csrf": csrf}, headers=ORIGIN
    )
    assert cancelled.status_code == 303
    (row,) = await job_rows(app.database, id=seeded.pending_job)
    assert row["status"] == "cancelled"
    deleted = await client.post(
        f"/dashboard/jobs/{seeded.cancelled_job}/delete", data={"csrf": csrf}, headers=ORIGIN
    )
    assert deleted.status_code == 303
    assert deleted.headers["location"].startswith("/dashboard/jobs?deleted=")
    assert await job_rows(app.database, id=seeded.cancelled_job) == []
    missing = await client.post(
        f"/dashboard/jobs/{uuid.uuid4()}/retry", data={"csrf": csrf}, headers=ORIGIN
    )
    assert missing.status_code == 404


async def test_pause_and_resume_a_queue(
    app: App, client: httpx.AsyncClient, seeded: Seeded
) -> None:
    await _login(client)
    page = await client.get("/dashboard/")
    csrf = _csrf(page.text)
    paused = await client.post(
        "/dashboard/queues/emails/pause", data={"csrf": csrf}, headers=ORIGIN
    )
    assert paused.status_code == 303
    assert [q.paused for q in await app.queues() if q.name == "emails"] == [True]
    shown = await client.get("/dashboard/")
    emails = _text(shown.text.split('id="queue-emails"')[1].split("</tr>")[0])
    assert "paused" in emails and "Resume" in emails
    resumed = await client.post(
        "/dashboard/queues/emails/resume", data={"csrf": csrf}, headers=ORIGIN
    )
    assert resumed.status_code == 303
    assert [q.paused for q in await app.queues() if q.name == "emails"] == [False]


async def test_writes_are_refused_without_token_csrf_or_origin(
    app: App, client: httpx.AsyncClient, seeded: Seeded
) -> None:
    target = f"/dashboard/jobs/{seeded.failed_job}/retry"
    good = {"csrf": csrf_token(TOKEN)}
    # No session at all.
    refused = await client.post(target, data=good, headers=ORIGIN)
    assert refused.status_code == 403
    assert "Refused" in refused.text
    # The read token may look, never change.
    await _login(client, READ)
    assert (
        await client.post(target, data={"csrf": csrf_token(READ)}, headers=ORIGIN)
    ).status_code == 403
    await _login(client)
    # The token, but no CSRF field, a wrong one, or a post from another site.
    assert (await client.post(target, data={}, headers=ORIGIN)).status_code == 403
    assert (await client.post(target, data={"csrf": "0" * 64}, headers=ORIGIN)).status_code == 403
    cross = await client.post(target, data=good, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert "another site" in cross.text
    null = await client.post(target, data=good, headers={"Origin": "null"})
    assert null.status_code == 403
    # Neither Origin nor Referer: refused, as the README says (only this origin's posts).
    nowhere = await client.post(target, data=good)
    assert nowhere.status_code == 403 and "another site" in nowhere.text
    referred = await client.post(target, data=good, headers={"Referer": "https://evil.example/"})
    assert referred.status_code == 403
    crowded = {**good, **{f"f{n}": "x" for n in range(30)}}
    assert (await client.post(target, data=crowded, headers=ORIGIN)).status_code == 403
    (row,) = await job_rows(app.database, id=seeded.failed_job)
    assert row["status"] == "failed"  # nothing was changed
    # ... and with all three, it is.
    assert (await client.post(target, data=good, headers=ORIGIN)).status_code == 303


async def test_no_token_configured_is_read_only_and_says_so(app: App, seeded: Seeded) -> None:
    async with _client(create_api(app)) as http:
        page = await http.get("/dashboard/")
        assert page.status_code == 200
        assert "Read-only: no token is configured (CRONLOCK_API_TOKEN)" in _text(page.text)
        assert 'name="csrf"' not in page.text
        job = await http.get(f"/dashboard/jobs/{seeded.failed_job}")
        assert "Retry now" not in job.text
        refused = await http.post(
            f"/dashboard/jobs/{seeded.failed_job}/retry", data={"csrf": ""}, headers=ORIGIN
        )
        assert refused.status_code == 403
        login = await http.get("/dashboard/login")
        assert "no token configured" in _text(login.text)
    (row,) = await job_rows(app.database, id=seeded.failed_job)
    assert row["status"] == "failed"


async def test_mounted_under_any_prefix(app: App, seeded: Seeded) -> None:
    api = FastAPI()
    api.include_router(create_dashboard(app, token=TOKEN, public="reads"), prefix="/ops/cronlock")
    async with _client(api) as http:
        page = await http.get("/ops/cronlock/")
        assert page.status_code == 200, page.text
        assert 'href="/ops/cronlock/static/dashboard.css"' in page.text
        assert 'href="/ops/cronlock/tasks/every-minute"' in page.text
        css = await http.get("/ops/cronlock/static/dashboard.css")
        assert css.status_code == 200
        assert css.headers["content-type"].startswith("text/css")
        script = await http.get("/ops/cronlock/static/dashboard.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert (await http.get("/ops/cronlock/static/../templates/base.html")).status_code == 404
        assert (await http.get("/ops/cronlock/static/nope.css")).status_code == 404
        login = await http.post(
            "/ops/cronlock/login",
            data={"token": TOKEN, "next": "/ops/cronlock/jobs"},
            headers=ORIGIN,
        )
        assert login.headers["location"] == "/ops/cronlock/jobs"
        assert "path=/ops/cronlock/" in login.headers["set-cookie"].lower()


async def test_serve_redirects_home_to_the_dashboard(app: App) -> None:
    async with _client(create_api(app, token=TOKEN)) as http:
        answer = await http.get("/")
        assert answer.status_code == 307
        assert answer.headers["location"] == "/dashboard/"
    async with _client(create_api(app, token=TOKEN, dashboard=False)) as http:
        assert (await http.get("/dashboard/")).status_code == 404
