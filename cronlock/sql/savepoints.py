"""The savepoint verbs of a run's items, as the text the driver sends (see periodic/items.py)."""

from __future__ import annotations

__all__ = ["ITEM_RELEASE", "ITEM_RELEASE_AND_SAVEPOINT", "ITEM_ROLLBACK", "ITEM_SAVEPOINT"]

# Core has no SAVEPOINT statement of its own to execute, and these go to the driver as text
# anyway: on the simple query protocol, so no prepare round trip, and two in one message when
# an item's RELEASE rides with the next item's SAVEPOINT. One fixed name: savepoints of the
# same name stack, RELEASE and ROLLBACK TO reach the innermost, so items nest.
ITEM_SAVEPOINT = "SAVEPOINT cronlock_item"
ITEM_RELEASE = "RELEASE SAVEPOINT cronlock_item"
ITEM_RELEASE_AND_SAVEPOINT = "RELEASE SAVEPOINT cronlock_item; SAVEPOINT cronlock_item"
# ROLLBACK TO keeps the savepoint (empty); the RELEASE closes it.
ITEM_ROLLBACK = "ROLLBACK TO SAVEPOINT cronlock_item; RELEASE SAVEPOINT cronlock_item"
