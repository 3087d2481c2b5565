"""Values written as SQL literals, for a prepared statement's ``EXECUTE name(…)``: how a plan
is explained as PostgreSQL runs it (an EXPLAIN sent with protocol parameters is planned for
their values whatever plan_cache_mode says, so it always shows a custom plan). Used by
``claim_plan`` and by the tests' plan checks (tests/support/plans.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

__all__ = ["literal"]


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def literal(value: Any) -> str:
    """``value`` as an SQL literal of unknown type (the prepared statement gives it one):
    NULL, a boolean, a number, a string, a UUID, a time, or a list of those as an array."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        text = "{" + ",".join(_element(item) for item in value) + "}"
    elif isinstance(value, str | uuid.UUID | datetime):
        text = str(value)
    else:
        raise TypeError(f"no literal for {value!r}")
    return "'" + text.replace("'", "''") + "'"
