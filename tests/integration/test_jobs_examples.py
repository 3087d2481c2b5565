"""The reference's handlers in tasks/: they run, and a failing payment never double-credits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import ModuleType

from sqlalchemy import select

from cronlock import App, Database, RunStatus
from cronlock.sql.tables import jobs
from tasks.models import User


async def test_email_report_and_payments_with_one_failing(
    database: Database, examples: ModuleType
) -> None:
    app: App = examples.app
    app.use_database(str(database.url))
    try:
        async with database.session() as session:
            await examples.setup_demo(session, posts=1)
            await app.enqueue_tx(session, "send_email", {"to": "a@example.com"})
            await app.enqueue_tx(session, "generate_report", {"report_id": 42})
            # 100 payments to 10 users, one of them to a user who does not exist.
            payments = [{"user_id": 1 + i % 10, "amount": 1 + i % 7} for i in range(99)]
            payments.insert(50, {"user_id": 999, "amount": 5})
            await app.enqueue_many_tx(session, "process_payment", payments)
            await session.commit()

        result = await app.drain(commit_mode="batch", batch_size=20)
        later = datetime.now(UTC) + timedelta(hours=1)
        retry = await app.drain(clock=lambda: later)
    finally:
        await app.aclose()

    assert result.status is RunStatus.PARTIAL
    assert (result.stats["processed"], result.stats["retried"]) == (101, 1)
    assert retry.stats["retried"] == 1  # still no such user; retried again, never applied
    expected = {user: 0 for user in range(1, 11)}
    for payment in payments:
        if payment["user_id"] in expected:
            expected[payment["user_id"]] += payment["amount"]
    async with database.session() as session:
        balances = dict((await session.execute(select(User.id, User.balance))).all())
        assert balances == expected
        failing = (
            (await session.execute(select(jobs).where(jobs.c.status == "retrying")))
            .mappings()
            .one()
        )
        assert failing["error_message"] == "LookupError: no user 999"
        assert failing["retry_count"] == 2
        email = (
            await session.execute(select(jobs.c.result).where(jobs.c.job_type == "send_email"))
        ).scalar_one()
        assert email == {"sent_to": "a@example.com"}


async def test_process_payment_on_a_money_column(database: Database, examples: ModuleType) -> None:
    """Issue 11 point 6: on a ``numeric`` balance the handler's result holds a Decimal, which is
    stored as its exact string (the README's encoding), not a failed attempt."""
    from decimal import Decimal

    from sqlalchemy import text

    app: App = examples.app
    app.use_database(str(database.url))
    try:
        async with database.session() as session:
            await examples.setup_demo(session, posts=1)
            await session.execute(
                text("ALTER TABLE users ALTER COLUMN balance TYPE numeric(12, 2)")
            )
            await session.execute(text("UPDATE users SET balance = 10.25 WHERE id = 1"))
            await app.enqueue_tx(session, "process_payment", {"user_id": 1, "amount": 5})
            await session.commit()
        result = await app.drain()
    finally:
        await app.aclose()
    assert result.status is RunStatus.COMPLETED, result.error
    async with database.session() as session:
        row = (await session.execute(select(jobs.c.status, jobs.c.result))).one()
        balance = (await session.execute(text("SELECT balance FROM users WHERE id = 1"))).scalar()
    assert tuple(row) == ("completed", {"user_id": 1, "amount": 5, "new_balance": "15.25"})
    assert balance == Decimal("15.25")
