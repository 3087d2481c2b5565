"""The shop's background jobs: a cronlock App with one plain ``def`` handler.

The worker runs beside the web app (``cronlock --app examples.flask_app.jobs --database-url
"$DATABASE_URL" worker``); the web app imports ``app`` only to enqueue (``web.py``). A ``def``
handler runs in the worker's thread pool with a sync ``Session`` on the job's transaction: what
it writes commits with the job's completion, or rolls back with its failure (and is retried).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

import cronlock

from .models import Order

app = cronlock.App()


@app.job("confirm_order", max_retries=5)
def confirm_order(session: Session, payload: dict[str, Any]) -> None:
    order = session.get_one(Order, payload["order_id"])
    # Here the confirmation would be mailed (a blocking call is fine: this is a thread).
    order.confirmed_at = datetime.now(UTC)
