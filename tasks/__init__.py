"""The examples a user copies: periodic tasks on the reference's blog schema, and the
reference's job handlers (``handlers``).

``cronlock --app tasks ...`` finds ``app`` here. ``cronlock demo`` creates the demo tables
(``posts``, ``post_stats``, ``users``) with ``setup_demo`` and runs the story end to end.
"""

from __future__ import annotations

import cronlock

app = cronlock.App()

from . import handlers, reindex, stats  # noqa: E402  (they register on `app`)
from .models import setup_demo  # noqa: E402

__all__ = ["app", "handlers", "reindex", "setup_demo", "stats"]
