"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against a real
``cronlock serve`` and a real ``cronlock worker`` on a database seeded with runs and jobs in
every state (tests/support/dashseed.py).

Marked ``browser``, left out of the default run, and a CI step of its own (which installs the
``chromium`` package; Playwright is pointed at /usr/bin/chromium and downloads nothing):

    CRONLOCK_TEST_DATABASE_URL=postgresql://root@127.0.0.1:5432/postgres \\
        pytest -n 0 -m browser tests/e2e/test_dashboard_browser.py

Screenshots of every page go to ``$CRONLOCK_SCREENSHOTS`` (default ``artifacts/browser`` in
the repository, which git ignores); docs/dashboard-overview.png in the README is one of them.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from cli import ROOT, finish, free_port, kill_all, start_cli
from dashseed import Seeded, beat, seed
from jobsupport import create_job_tables
from waiting import wait_for

from cronlock import Database

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-s3cret"
APP = "testapps.dashboard"
SHOTS = Path(os.environ.get("CRONLOCK_SCREENSHOTS", str(ROOT / "artifacts" / "browser")))


@dataclass
class Served:
    base: str  # the dashboard's URL, ending in /dashboard
    api: str


async def _seed(url: str) -> Seeded:
    database = Database(url)
    try:
        await create_job_tables(database)
        return await seed(database, datetime.now(UTC))
    finally:
        await database.dispose()


@pytest.fixture
def seeded(database_url: str) -> Seeded:
    # Its own loop and connections, closed before the test (a sync test: Playwright's sync
    # API refuses to run inside an event loop).
    return asyncio.run(_seed(database_url))


async def _beat_until(url: str, seeded: Seeded, stop: threading.Event) -> None:
    database = Database(url)
    try:
        while not stop.is_set():
            await beat(database, seeded)
            await asyncio.sleep(1)
    finally:
        await database.dispose()


@pytest.fixture
def beating(database_url: str, seeded: Seeded) -> Iterator[None]:
    """The seeded live drainers of ``emails`` beat every second, as drainers on another host
    would, in a thread with its own event loop (Playwright's runs in this one)."""
    stop = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(_beat_until(database_url, seeded, stop)), daemon=True
    )
    thread.start()
    yield
    stop.set()
    thread.join(timeout=10)


@pytest.fixture
def served(database_url: str, seeded: Seeded, beating: None) -> Iterator[Served]:
    """``cronlock serve`` with a token, and a worker draining the default queue."""
    port = free_port()
    server = start_cli(
        "--app", APP, "serve", "--port", str(port), database_url=database_url,
        CRONLOCK_API_TOKEN=TOKEN,
    )  # fmt: skip
    worker = start_cli("--app", APP, "worker", database_url=database_url)
    api = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{api}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return server.poll() is not None

    try:
        wait_for(healthy, timeout=30)
        assert server.poll() is None, server.communicate()
        yield Served(base=f"{api}/dashboard", api=api)
    finally:
        for process in (server, worker):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in (server, worker):
            try:
                finish(process, timeout=20)
            except subprocess.TimeoutExpired:
                kill_all(process)


@pytest.fixture
def browser(served: Served) -> Iterator[Browser]:
    """Chromium, started after the database and the servers: Playwright's sync API keeps an
    event loop running in this thread while it is up, where the test database fixtures (and
    the seeding) cannot run theirs."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no {CHROMIUM}: apt-get install -y chromium (CI's browser step does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _row_text(page: Page, row_id: str) -> str:
    return " ".join(page.locator(f"#{row_id}").inner_text().split())


def test_the_dashboard_in_chromium(served: Served, seeded: Seeded, browser: Browser) -> None:
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, timezone_id="America/New_York", locale="en-US"
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    # Without the token: the login page, and a write is refused, from the page or the API.
    page.goto(f"{served.base}/")
    assert page.url.startswith(f"{served.base}/login")
    _shot(page, "login")
    refused = context.request.post(f"{served.base}/jobs/{seeded.failed_job}/retry", form={})
    assert refused.status == 403
    assert httpx.post(f"{served.api}/jobs/{seeded.failed_job}/retry").status_code == 401
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    assert "not a token of this server" in page.inner_text("main")

    # Log in: the overview renders every task and queue; the paused queue says paused.
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{served.base}/")
    for task in ("every-minute", "hourly-report", "retired-task"):
        assert page.locator(f"#task-{task}").is_visible(), task
    for queue in ("default", "emails", "reports"):
        assert page.locator(f"#queue-{queue}").is_visible(), queue
    assert "paused" in _row_text(page, "queue-reports")
    assert "Resume" in _row_text(page, "queue-reports")
    assert "1 active, 1 standby, 1 gone" in _row_text(page, "queue-emails")
    # Times in the viewer's zone (New York here), UTC on hover.
    first_time = page.locator("time").first
    assert "UTC" not in first_time.inner_text()
    assert re.search(r"(EST|EDT|GMT-5|GMT-4)", first_time.inner_text())
    assert (first_time.get_attribute("title") or "").endswith("UTC")
    # Auto-refresh is on and pausable.
    toggle = page.locator("#refresh-toggle")
    assert toggle.is_visible() and toggle.get_attribute("aria-pressed") == "false"
    toggle.click()
    assert toggle.get_attribute("aria-pressed") == "true"
    toggle.click()
    _shot(page, "overview")

    # The slot picture shows a missed slot, with its text.
    page.click("#task-every-minute a")
    page.wait_for_url(re.compile(r".*/tasks/every-minute$"))
    missed = page.locator(f'.cell-missed[data-slot="{seeded.missed_slot.isoformat()}"]')
    assert missed.count() == 1
    assert "missed: nobody ran it" in (missed.get_attribute("title") or "")
    unrecorded = page.locator(f'.cell-missed[data-slot="{seeded.unrecorded_slot.isoformat()}"]')
    assert "not recorded yet" in (unrecorded.get_attribute("title") or "")
    assert page.locator(".legend").inner_text().count("missed") >= 1
    _shot(page, "task")

    # A failed job, retried from its page, drains (the worker runs it) and shows completed.
    page.goto(f"{served.base}/jobs?status=failed")
    _shot(page, "jobs")
    page.click(f'a[href$="/jobs/{seeded.failed_job}"]')
    assert "ConnectionError: smtp refused" in page.inner_text("main")
    page.click("text=Retry now")
    assert "Done: retried" in page.inner_text("main")

    def drained() -> bool:
        page.reload()
        return page.locator("h1 .badge-completed").count() == 1

    wait_for(drained, timeout=30, interval=0.5)
    _shot(page, "job")

    # Keyboard: g j goes to the jobs page, / focuses its filter; the skip link comes first.
    page.goto(f"{served.base}/")
    page.keyboard.press("g")
    page.keyboard.press("j")
    page.wait_for_url(f"{served.base}/jobs")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "f-queue"
    page.goto(f"{served.base}/jobs")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    assert errors == []
    context.close()


def test_the_overview_reads_at_a_phones_width(
    served: Served, seeded: Seeded, browser: Browser
) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 800}, is_mobile=True)
    page = context.new_page()
    page.goto(f"{served.base}/login")
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{served.base}/")
    # Nothing wider than the screen: each table row is a card of labelled lines.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    assert (
        page.locator(".queues thead").is_hidden()
        or page.evaluate("document.querySelector('.queues thead').getBoundingClientRect().height")
        <= 1
    )
    label = page.locator("#queue-default td").first.evaluate(
        "cell => getComputedStyle(cell, '::before').content"
    )
    assert label == '"State: "'

    _shot(page, "overview-phone")
    page.goto(f"{served.base}/tasks/every-minute")
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    _shot(page, "task-phone")
    context.close()
