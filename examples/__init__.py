"""Examples for sync applications, each a small project of its own: a Flask app
(``flask_app``) and a script on sync SQLAlchemy (``sync_sqlalchemy``) that enqueue cronlock
jobs in their own transactions and run a worker beside them. Run from the repository's root
(the README's "Flask and sync SQLAlchemy"); tested by tests/integration/test_examples_sync.py.
Unlike ``tasks/`` they are not in the wheel: they need Flask and psycopg, which cronlock does
not."""
