"""The ledger's tables, in SQLAlchemy Core: accounts and the transfers between them."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, DateTime, ForeignKey, Integer, MetaData, Table

metadata = MetaData()

accounts = Table(
    "accounts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("balance", Integer, CheckConstraint("balance >= 0"), nullable=False),
)

transfers = Table(
    "transfers",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("source_id", ForeignKey(accounts.c.id), nullable=False),
    Column("target_id", ForeignKey(accounts.c.id), nullable=False),
    Column("amount", Integer, CheckConstraint("amount > 0"), nullable=False),
    # Set by the notify_transfer job, in the job's own transaction.
    Column("notified_at", DateTime(timezone=True)),
)
