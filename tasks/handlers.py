"""The reference's three job handlers: an email, a report and a payment.

Each receives the session of its job's transaction and the payload; what it returns is stored
as the job's result. ``process_payment`` writes to ``users.balance`` in that transaction, so the
credit commits together with the job's completion, or not at all: a payment that fails (an
unknown user, a balance that would go negative) rolls back to its savepoint and is retried,
and no retry ever credits twice.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from . import app
from .models import User

logger = logging.getLogger("tasks.handlers")


@app.job("send_email", max_retries=5)
async def send_email(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Send a notification (here: log it; in production, call the email service)."""
    to = payload["to"]
    subject = payload.get("subject", "Notification")
    logger.info("email to %s: %s", to, subject, extra={"action": "send_email", "to": to})
    return {"sent_to": to}


@app.job("generate_report", timeout=300)
async def generate_report(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Produce a report and return where it is."""
    report_id = payload["report_id"]
    return {"report_id": report_id, "url": f"/reports/{report_id}.pdf"}


@app.job("process_payment", max_retries=3)
async def process_payment(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Credit (or debit) a user's balance in the job's own transaction."""
    user_id, amount = int(payload["user_id"]), int(payload["amount"])
    balance = await session.scalar(
        update(User)
        .where(User.id == user_id)
        .values(balance=User.balance + amount)
        .returning(User.balance)
    )
    if balance is None:
        raise LookupError(f"no user {user_id}")
    return {"user_id": user_id, "amount": amount, "new_balance": balance}
