"""The sync examples (examples/, issue 24 item 4) are code that runs: the Flask shop enqueues in
the request's transaction and a real worker process confirms its orders; the sync SQLAlchemy
script enqueues in its transfer's transaction and a cron-style ``cronlock drain`` runs the job.
A request or transfer that fails leaves neither its row nor its job."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest
from cli import finish, kill_all, run_cli, start_cli
from waiting import wait_for

from examples.flask_app import web
from examples.sync_sqlalchemy import transfers


def _rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def _jobs(url: str) -> list[tuple[Any, ...]]:
    return _rows(url, "SELECT job_type, payload, status FROM cronlock.jobs ORDER BY created_at")


def test_an_order_and_its_job_commit_in_the_request_and_a_worker_confirms_it(
    database_url: str,
) -> None:
    engine = web.engine_for(database_url)
    try:
        shop = web.create_app(engine)
        made = shop.test_cli_runner().invoke(args=["init-db", "--stock", "3"])
        assert made.exit_code == 0, made.output
        client = shop.test_client()

        placed = client.post("/orders", json={"product_id": 1, "quantity": 2})
        assert placed.status_code == 201, placed.text
        order_id = placed.json["order_id"] if placed.json else None
        # One widget left: this order is written and enqueued, then refused, and rolled back.
        refused = client.post("/orders", json={"product_id": 1, "quantity": 2})
        assert refused.status_code == 409
        assert client.post("/orders", json={"product_id": 7, "quantity": 1}).status_code == 404

        assert _rows(database_url, "SELECT id, quantity, confirmed_at FROM orders") == [
            (order_id, 2, None)
        ]
        assert _rows(database_url, "SELECT stock FROM products") == [(1,)]
        assert _jobs(database_url) == [("confirm_order", {"order_id": order_id}, "pending")]

        worker = start_cli("--app", "examples.flask_app.jobs", "worker", database_url=database_url)
        try:

            def confirmed() -> bool:
                shown = client.get(f"/orders/{order_id}").json
                return bool(shown and shown["confirmed"])

            wait_for(confirmed, timeout=30)
            worker.send_signal(signal.SIGTERM)
            code, _, stderr = finish(worker)
        finally:
            kill_all(worker)
        assert code == 0, stderr
        assert _jobs(database_url) == [("confirm_order", {"order_id": order_id}, "completed")]
    finally:
        engine.dispose()


def test_a_transfer_and_its_job_commit_together_and_a_drain_notifies_it(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = ["--database-url", database_url]
    assert transfers.main([*script, "init"]) == 0
    assert transfers.main([*script, "send", "1", "2", "30"]) == 0
    transfer_id = int(capsys.readouterr().out.split()[-1])
    # More than account 1 holds: its transfer row and job are written, then rolled back.
    assert transfers.main([*script, "send", "1", "2", "500"]) == 1
    assert capsys.readouterr().err.strip() == "account 1 cannot pay 500"

    assert _rows(database_url, "SELECT id, amount, notified_at FROM transfers") == [
        (transfer_id, 30, None)
    ]
    assert _rows(database_url, "SELECT id, balance FROM accounts ORDER BY id") == [
        (1, 70),
        (2, 130),
    ]
    assert _jobs(database_url) == [("notify_transfer", {"transfer_id": transfer_id}, "pending")]

    drained = run_cli("--app", "examples.sync_sqlalchemy.jobs", "drain", database_url=database_url)
    assert drained.returncode == 0, drained.stderr
    [(notified,)] = _rows(database_url, "SELECT notified_at IS NOT NULL FROM transfers")
    assert notified
    assert _jobs(database_url) == [("notify_transfer", {"transfer_id": transfer_id}, "completed")]
