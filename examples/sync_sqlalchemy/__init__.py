"""A script on sync SQLAlchemy (Core, psycopg driver) whose transfers enqueue their notice in
the transfer's own transaction, without a web framework.

- ``models``: its tables, accounts and transfers;
- ``transfers``: the script (``python -m examples.sync_sqlalchemy.transfers``): a transfer
  writes its row, enqueues ``notify_transfer`` and moves the money in one transaction, so a
  transfer that fails (insufficient funds) leaves neither row nor job;
- ``jobs``: the cronlock App and its plain ``def`` handler, which the worker runs.

::

    export DATABASE_URL=postgresql://localhost/ledger
    cronlock --database-url "$DATABASE_URL" migrate
    python -m examples.sync_sqlalchemy.transfers init
    python -m examples.sync_sqlalchemy.transfers send 1 2 30
    cronlock --app examples.sync_sqlalchemy.jobs --database-url "$DATABASE_URL" worker
"""
