"""The examples a user copies: periodic tasks on the reference's blog schema.

``cronlock --app tasks ...`` finds ``app`` here. ``cronlock demo`` creates the demo tables
(``posts``, ``post_stats``) with ``setup_demo`` and runs the story end to end.
"""

from __future__ import annotations

import cronlock

app = cronlock.App()

from . import reindex, stats  # noqa: E402  (they register their tasks on `app`)
from .models import setup_demo  # noqa: E402

__all__ = ["app", "reindex", "setup_demo", "stats"]
