"""The ledger's script: ``python -m examples.sync_sqlalchemy.transfers init | send A B AMOUNT``.

``transfer`` runs in one ``engine.begin()`` block, a Connection and its transaction: the
transfer's row, its ``notify_transfer`` job (``app.sync.enqueue_tx`` on that Connection) and
the two balances commit together when the block ends, or roll back together if it raises.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sqlalchemy import Engine, create_engine, insert, select, update
from sqlalchemy.engine import make_url

from . import jobs
from .models import accounts, metadata, transfers


class InsufficientFunds(Exception):
    pass


def engine_for(url: str) -> Engine:
    """An engine on the psycopg driver for a ``postgresql://`` URL (the one the worker takes)."""
    return create_engine(make_url(url).set(drivername="postgresql+psycopg"))


def init(engine: Engine) -> None:
    """The tables, and accounts 1 and 2 with 100 each."""
    metadata.create_all(engine)
    with engine.begin() as conn:
        if conn.scalar(select(accounts.c.id).limit(1)) is None:
            conn.execute(insert(accounts), [{"id": 1, "balance": 100}, {"id": 2, "balance": 100}])


def transfer(engine: Engine, source: int, target: int, amount: int) -> int:
    """Move ``amount`` from ``source`` to ``target``; the new transfer's id."""
    with engine.begin() as conn:
        transfer_id: int = conn.execute(
            insert(transfers)
            .values(source_id=source, target_id=target, amount=amount)
            .returning(transfers.c.id)
        ).scalar_one()
        jobs.app.sync.enqueue_tx(conn, "notify_transfer", {"transfer_id": transfer_id})
        debited = conn.execute(
            update(accounts)
            .where(accounts.c.id == source, accounts.c.balance >= amount)
            .values(balance=accounts.c.balance - amount)
        )
        if debited.rowcount != 1:
            # Raised in the block: the transfer and its job roll back with it.
            raise InsufficientFunds(f"account {source} cannot pay {amount}")
        conn.execute(
            update(accounts)
            .where(accounts.c.id == target)
            .values(balance=accounts.c.balance + amount)
        )
    return transfer_id


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.sync_sqlalchemy.transfers")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init", help="create the tables and accounts 1 and 2")
    send = commands.add_parser("send", help="transfer AMOUNT from account A to account B")
    for name in ("source", "target", "amount"):
        send.add_argument(name, type=int)
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("set DATABASE_URL or give --database-url")
    engine = engine_for(args.database_url)
    try:
        if args.command == "init":
            init(engine)
            print("accounts 1 and 2 are ready")
        else:
            print(transfer(engine, args.source, args.target, args.amount))
    except InsufficientFunds as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
