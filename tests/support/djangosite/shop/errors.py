"""An exception of the app's own, for the failing task's error path."""

from __future__ import annotations


class OutOfStock(Exception):
    pass
