"""Histogram buckets computed in SQL: Prometheus' cumulative ``le`` counts, read at scrape time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, literal
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["LATENCY_BUCKETS", "buckets"]

# Histogram buckets, in seconds, for job latency and run duration/lateness.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


def buckets(seconds: ColumnElement[Any], where: ColumnElement[bool]) -> list[Any]:
    """count(*) of rows at or under each bucket bound (Prometheus' cumulative ``le``)."""
    return [
        func.count().filter(where, seconds <= literal(bound)).label(f"le_{index}")
        for index, bound in enumerate(LATENCY_BUCKETS)
    ]
