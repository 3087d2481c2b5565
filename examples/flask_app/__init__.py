"""A Flask shop whose orders enqueue their confirmation in the request's transaction.

- ``models``: its two tables, products and orders (plain SQLAlchemy ORM);
- ``web``: the Flask app (``create_app``): ``POST /orders`` writes the order and enqueues
  ``confirm_order`` in one transaction, so an order that fails (out of stock) leaves neither;
- ``jobs``: the cronlock App and its plain ``def`` handler, which the worker runs.

::

    export DATABASE_URL=postgresql://localhost/shop
    cronlock --database-url "$DATABASE_URL" migrate
    flask --app examples.flask_app.web init-db
    flask --app examples.flask_app.web run &
    cronlock --app examples.flask_app.jobs --database-url "$DATABASE_URL" worker &
    curl -X POST localhost:5000/orders -H 'content-type: application/json' \\
        -d '{"product_id": 1, "quantity": 2}'
"""
