"""The shop's Flask app: an order and its confirmation job in the request's transaction.

Plain SQLAlchemy, no Flask-SQLAlchemy: a ``sessionmaker`` on a psycopg engine, and in each view
``with sessions.begin() as session:``, one Session and one transaction, committed when the
block ends and rolled back if it raises, ``abort`` included. The job is written on that
Session, so it exists if and only if the order does. (Flask-SQLAlchemy's ``db.session`` is a
sync Session as well and works the same: ``app.sync.enqueue_tx(db.session, ...)`` before
``db.session.commit()``.)
"""

from __future__ import annotations

import os
from typing import Any

import click
from flask import Flask, abort, request
from sqlalchemy import Engine, create_engine, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from . import jobs
from .models import Base, Order, Product


def engine_for(url: str) -> Engine:
    """An engine on the psycopg driver for a ``postgresql://`` URL (the one the worker takes)."""
    return create_engine(make_url(url).set(drivername="postgresql+psycopg"))


def create_app(engine: Engine | None = None) -> Flask:
    """The app on ``engine``, by default on ``$DATABASE_URL`` (``flask --app … run``)."""
    web = Flask(__name__)
    engine = engine or engine_for(os.environ["DATABASE_URL"])
    sessions = sessionmaker(engine)

    @web.post("/orders")
    def place_order() -> tuple[dict[str, Any], int]:
        body = request.get_json()
        product_id, quantity = int(body["product_id"]), int(body["quantity"])
        with sessions.begin() as session:
            if session.get(Product, product_id) is None:
                abort(404, description="no such product")
            order = Order(product_id=product_id, quantity=quantity)
            session.add(order)
            session.flush()  # INSERT: the order's id, for the job
            order_id = order.id
            jobs.app.sync.enqueue_tx(session, "confirm_order", {"order_id": order_id})
            left = session.scalar(
                update(Product)
                .where(Product.id == product_id, Product.stock >= quantity)
                .values(stock=Product.stock - quantity)
                .returning(Product.stock)
            )
            if left is None:
                # Raised in the block: the order and its job roll back with it.
                abort(409, description="out of stock")
        return {"order_id": order_id}, 201

    @web.get("/orders/<int:order_id>")
    def show_order(order_id: int) -> dict[str, Any]:
        with sessions() as session:
            order = session.get(Order, order_id) or abort(404)
            return {"order_id": order_id, "confirmed": order.confirmed_at is not None}

    @web.cli.command("init-db")
    @click.option("--stock", default=10, show_default=True, help="the widget's stock")
    def init_db(stock: int) -> None:
        """Create the shop's tables and its one product, a widget."""
        Base.metadata.create_all(engine)
        with sessions.begin() as session:
            if session.scalar(select(func.count()).select_from(Product)) == 0:
                session.add(Product(name="widget", stock=stock))
        click.echo("the shop's tables are ready; product 1 is a widget")

    return web
