"""The ledger's background jobs: a cronlock App with one plain ``def`` handler.

``cronlock --app examples.sync_sqlalchemy.jobs --database-url "$DATABASE_URL" worker`` runs
it (or ``drain`` from cron); the script imports ``app`` only to enqueue (``transfers.py``). The
handler's sync ``Session`` is on the job's transaction: its write commits with the job.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, update
from sqlalchemy.orm import Session

import cronlock

from .models import transfers

app = cronlock.App()


@app.job("notify_transfer", max_retries=5)
def notify_transfer(session: Session, payload: dict[str, Any]) -> None:
    # Here both account holders would be told (a blocking call is fine: this is a thread).
    session.execute(
        update(transfers)
        .where(transfers.c.id == payload["transfer_id"])
        .values(notified_at=func.now())
    )
