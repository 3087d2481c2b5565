"""The monitoring kit against the real thing: promtool checks and unit-tests the alert rules,
and a real Prometheus (Debian's ``prometheus`` package) scrapes a real ``cronlock serve`` and
a worker's ``--metrics-port`` while workers drain and periodic tasks run; then every query of
the Grafana dashboard and every alert expression is evaluated through its HTTP API.

Marked ``prometheus``, left out of the default run, and a CI step of its own (which installs
the package; this test installs nothing, and fails in one line without it):

    CRONLOCK_TEST_DATABASE_URL=postgresql://root@127.0.0.1:5432/postgres \\
        pytest -n 0 -m prometheus tests/e2e/test_prometheus.py

The dashboard's variables stand for every queue and task, and Grafana's windows for five
minutes (SUBSTITUTIONS). The scenario is made so that every panel has a number and all seven
alerts hold (each is pending or firing in Prometheus's own evaluation): a task with a poison
item (parked), one that fails, one nobody ran for ten minutes (overdue); a queue with due jobs
and no drainer (unserved, and growing: the test adds to it while Prometheus watches); a queue
whose only worker the test stops (no active drainer); a queue whose one lane is held by a job
that never returns while an older job waits (stuck); a paused queue; the default queue's jobs
completing, retried and failing, drained by an active worker with a standby beside it.

Beyond the whole expressions, each condition of an alert and each side of a panel's
``or vector(0)`` must have series of its own: the expression split at its top-level ``and``,
``or`` and ``unless``, each part without its comparison with a number (``> 0``, ``== 0``;
``monitoringkit.operands``). So a condition that only keeps an alert quiet (``unless`` a
paused queue) is evaluated too, and each condition reads series as it would in a healthy
system, where the alert itself returns none.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cli import finish, free_port, invoke, kill_all, start_cli
from monitoringkit import (
    RULE_TESTS,
    RULES,
    Query,
    alert_queries,
    alert_rules,
    exported_metrics,
    operands,
    panel_queries,
    variable_queries,
)
from sqlalchemy import insert
from waiting import wait_for

from cronlock import Database
from cronlock.sql.tables import runs

pytestmark = pytest.mark.prometheus

APP = "testapps.monitored"
TOKEN = "monitoring-s3cret"
READ_TOKEN = "monitoring-read"
# What the dashboard's variables and Grafana's window macros stand for here: every queue and
# task, and a window of five minutes, longer than the test (Grafana makes $__rate_interval at
# least four scrape intervals, $__range the time picker's range): rate() and increase() see
# every sample since Prometheus's first scrape, however long the checks take to pass.
SUBSTITUTIONS = {"$queue": ".*", "$task": ".*", "$__rate_interval": "5m", "$__range": "5m"}


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"no {name} on PATH: apt-get install -y prometheus (CI's prometheus step does)",
            pytrace=False,
        )
    return found


def test_promtool_checks_the_rules() -> None:
    checked = subprocess.run(
        [_tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_promtool_runs_the_rule_tests() -> None:
    tested = subprocess.run(
        [_tool("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    # Every alert of the rules is tested, firing at least once.
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in alert_rules()}


# -- the scenario -------------------------------------------------------------------------


async def _seed_stale(url: str, now: datetime) -> None:
    """``stale`` ran its slot ten minutes ago, and nobody has run it since."""
    slot = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    database = Database(url)
    try:
        async with database.engine.begin() as conn:
            await conn.execute(
                insert(runs).values(
                    task="stale",
                    slot=slot,
                    status="completed",
                    started_at=slot + timedelta(seconds=1),
                    finished_at=slot + timedelta(seconds=2),
                    lateness_ms=1000.0,
                    trigger="cron",
                    host="host-a",
                    pid=4242,
                    items_ok=1,
                    items_failed=0,
                    failures=[],
                )
            )
    finally:
        await database.dispose()


def _cli(url: str, *args: str, exit_code: int = 0) -> str:
    """``cronlock --app testapps.monitored ARGS`` in this process; its stdout."""
    done = invoke("--app", APP, *args, database_url=url)
    assert done.returncode == exit_code, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


def _status(url: str, job: str) -> str:
    status: str = json.loads(_cli(url, "jobs", "show", job, "--json"))["status"]
    return status


def _ago(minutes: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).isoformat()


@dataclass
class Prometheus:
    api: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now; an error of Prometheus fails."""
        answer = httpx.get(f"{self.api}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (expr, body)
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return result

    def get(self, path: str, **params: str) -> Any:
        answer = httpx.get(f"{self.api}{path}", params=params, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (path, body)
        return body["data"]


@dataclass
class Running:
    serve: subprocess.Popen[str]
    workers: dict[str, subprocess.Popen[str]]
    ports: dict[str, int]  # serve, worker (--metrics-port)
    hang_marker: Path


def _stop(*processes: subprocess.Popen[str]) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            finish(process, timeout=20)
        except AssertionError:
            kill_all(process)


@pytest.fixture
def cronlock_running(database_url: str, tmp_path: Path) -> Iterator[Running]:
    """The scenario's database, and ``cronlock serve`` with four workers on it: two on
    ``default`` (one with --metrics-port), one on ``batch``, one on ``nightly``."""
    asyncio.run(_seed_stale(database_url, datetime.now(UTC)))
    # A run by hand of each task: report is partial (its poison item failed, and is parked
    # after this one run), broken fails.
    _cli(database_url, "run", "report", "--manual", exit_code=3)
    _cli(database_url, "run", "broken", "--manual", exit_code=1)
    _cli(database_url, "queue", "pause", "reports", "--create")
    _cli(database_url, "enqueue", "ok", "--queue", "reports")
    _cli(database_url, "enqueue", "ok", "--queue", "emails", "--run-at", _ago(10))

    ports = {"serve": free_port(), "worker": free_port()}
    marker = tmp_path / "hang-started"
    started: list[subprocess.Popen[str]] = []

    def command(*args: str, **env: str) -> subprocess.Popen[str]:
        started.append(start_cli("--app", APP, *args, database_url=database_url, **env))
        return started[-1]

    try:
        serve = command(
            "serve", "--port", str(ports["serve"]),
            CRONLOCK_API_TOKEN=TOKEN, CRONLOCK_API_READ_TOKEN=READ_TOKEN,
        )  # fmt: skip
        workers = {
            "default": command("worker", "--metrics-port", str(ports["worker"])),
            "standby": command("worker"),
            "batch": command(
                "worker", "--queue", "batch", "--grace-period", "0", HANG_MARKER=str(marker)
            ),
            "nightly": command("worker", "--queue", "nightly"),
        }

        def answers(url: str) -> bool:
            for process in (serve, *workers.values()):
                assert process.poll() is None, process.communicate()
            try:
                return httpx.get(url, timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(lambda: answers(f"http://127.0.0.1:{ports['serve']}/healthz"), timeout=30)
        wait_for(lambda: answers(f"http://127.0.0.1:{ports['worker']}/metrics"), timeout=30)
        # A job of default completed, so that its queue's series exist from the first scrape.
        job = json.loads(_cli(database_url, "enqueue", "ok", "--json"))["id"]
        wait_for(lambda: _status(database_url, job) == "completed", timeout=30, interval=0.2)
        yield Running(serve, workers, ports, marker)
    finally:
        _stop(*started)


@pytest.fixture
def prometheus_binary() -> str:
    """Asked for first: without the package the test fails before it starts anything."""
    return _tool("prometheus")


@pytest.fixture
def prometheus(
    prometheus_binary: str, cronlock_running: Running, tmp_path: Path
) -> Iterator[Prometheus]:
    """Prometheus on a port of its own, with a config and data directory in ``tmp_path``:
    the README's scrape config (one job, the read token) at one-second scrapes, and the
    rules loaded."""
    token = tmp_path / "read-token"
    token.write_text(READ_TOKEN)
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "cronlock",
                "authorization": {"credentials_file": str(token)},
                "static_configs": [
                    {
                        "targets": [
                            f"127.0.0.1:{cronlock_running.ports['serve']}",
                            f"127.0.0.1:{cronlock_running.ports['worker']}",
                        ]
                    }
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                return httpx.get(f"{api}/-/ready", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=30, interval=0.1)
        yield Prometheus(api)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _substituted(query: Query) -> str:
    expr = query.expr
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"{query.where}: a variable this test does not know: {expr}"
    return expr


def _finite(series: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(one["value"][1])) for one in series)


def _until(check: Callable[[], list[str]], timeout: float) -> None:
    """Poll ``check`` (what is still missing) until it returns nothing; at the deadline fail
    with what it last said."""
    deadline = time.monotonic() + timeout
    while missing := check():
        if time.monotonic() > deadline:
            raise AssertionError("after {:.0f} s:\n  {}".format(timeout, "\n  ".join(missing)))
        time.sleep(0.5)


def test_every_panel_and_alert_of_the_kit_on_a_real_prometheus(
    prometheus_binary: str, database_url: str, cronlock_running: Running, prometheus: Prometheus
) -> None:
    started = time.monotonic()

    # Both targets scraped, through the read token.
    def targets_down() -> list[str]:
        active = prometheus.get("/api/v1/targets")["activeTargets"]
        return [
            f"target {t['scrapeUrl']}: {t['health']} {t['lastError']}"
            for t in active
            if t["health"] != "up"
        ] or ([] if len(active) == 2 else [f"{len(active)} targets"])

    _until(targets_down, timeout=30)

    # nightly's worker is seen active, then stops: its queue has no active drainer.
    nightly = 'cronlock_drainers{queue="nightly", state="active"}'
    wait_for(lambda: prometheus.query(nightly), timeout=30, interval=0.5)
    _stop(cronlock_running.workers["nightly"])
    wait_for(lambda: not prometheus.query(nightly), timeout=30, interval=0.5)

    # batch's one lane is held by a job that never returns; an older job waits behind it.
    _cli(database_url, "enqueue", "hang")
    wait_for(cronlock_running.hang_marker.exists, timeout=30)
    _cli(database_url, "enqueue", "ok", "--queue", "batch", "--run-at", _ago(11))

    # What the counters and histograms count, now that Prometheus has their series (a
    # series' first sample is no increase: rate() sees only what grows after it). This
    # minute's slot of each task: report completes with its poison item left out (parked),
    # broken fails again; slot runs have a lateness, the runs by hand before had none.
    for n in range(5):
        _cli(database_url, "enqueue", "ok", f'{{"n": {n}}}')
    _cli(database_url, "enqueue", "fails")
    _cli(database_url, "run", "report")
    _cli(database_url, "run", "broken", exit_code=1)
    # emails, which nobody drains, grows while Prometheus watches.
    _cli(database_url, "enqueue", "ok", "--queue", "emails", "--run-at", _ago(5))

    # Every exported metric is scraped (the kit's reading of the exporter is the truth).
    def unscraped() -> list[str]:
        names = set(prometheus.get("/api/v1/label/__name__/values"))
        return [
            f"metric {name}: never scraped"
            for name in sorted(exported_metrics())
            if name not in names
        ]

    _until(unscraped, timeout=30)

    panels = panel_queries()
    alerts = alert_queries()
    names = {rule["alert"] for rule in alert_rules()}

    def empty(parts: list[str]) -> list[str]:
        return [part for part in parts if not prometheus.query(part)]

    def missing() -> list[str]:
        gaps = []
        for query in panels:
            # Each panel's query has a number, and so has each side of an `or vector(0)`: a
            # typo must not hide behind the zero.
            expr = _substituted(query)
            series = prometheus.query(expr)
            if not _finite(series):
                gaps.append(f"{query.where}: {expr} -> {series}")
            gaps += [f"{query.where}: no series for {part}" for part in empty(operands(expr))]
        for query in alerts:
            # Each alert holds, and each of its conditions has series of its own: the side of
            # an `unless`, which can only keep an alert quiet, reads real series too.
            if not prometheus.query(query.expr):
                gaps.append(f"{query.where} does not hold")
            gaps += [f"{query.where}: no series for {part}" for part in empty(operands(query.expr))]
        for variable, metric, label in variable_queries():
            if not prometheus.get(f"/api/v1/label/{label}/values", **{"match[]": metric}):
                gaps.append(f"variable {variable}: no {label} of {metric}")
        held = {a["labels"]["alertname"] for a in prometheus.get("/api/v1/alerts")["alerts"]}
        gaps += [f"alert {name}: not pending or firing in Prometheus" for name in names - held]
        return gaps

    _until(missing, timeout=60)

    # Prometheus evaluated every rule of the file without an error.
    groups = prometheus.get("/api/v1/rules")["groups"]
    evaluated = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(evaluated) == names
    assert all(rule["health"] == "ok" for rule in evaluated.values()), evaluated
    print(f"\nthe kit on a real Prometheus: {time.monotonic() - started:.1f} s after the start")
