"""Every SQL statement cronlock issues, named, parameterised, in one place: this package.

Statements are SQLAlchemy Core built from the tables (``tables.py``), one module per table
(``jobs``, ``runs``, ``workers``, ``queues``, ``tasks``, ``waits``) plus the advisory locks
(``locks``),
the item savepoints' verbs (``savepoints``), alembic's version table (``migrations``) and
histogram buckets computed in SQL (``histograms``); ``cronlock bench``'s are
``cronlock_bench.sql``, held to the same rules. Values are bound parameters and the schema is
applied by ``schema_translate_map``, so nothing from input is ever formatted into SQL. Names
put the noun first so related statements sort together; every statement is re-exported here,
so code reads ``sql.JOB_CLAIM``. A statement whose shape follows an operator's filter is built
by a lower-case function (``sql.job_list(...)``) from the same tables, its values bound all
the same.
"""

from __future__ import annotations

from . import (
    cancels,
    jobs,
    locks,
    migrations,
    queues,
    rollups,
    runs,
    savepoints,
    tasks,
    waits,
    workers,
)
from .cancels import *  # noqa: F403
from .histograms import LATENCY_BUCKETS
from .jobs import *  # noqa: F403
from .locks import *  # noqa: F403
from .migrations import *  # noqa: F403
from .queues import *  # noqa: F403
from .rollups import *  # noqa: F403
from .runs import *  # noqa: F403
from .savepoints import *  # noqa: F403
from .tasks import *  # noqa: F403
from .waits import *  # noqa: F403
from .workers import *  # noqa: F403

# Each module's statements (its __all__), and the latency buckets.
__all__ = ["LATENCY_BUCKETS"]
__all__ += cancels.__all__
__all__ += jobs.__all__
__all__ += locks.__all__
__all__ += migrations.__all__
__all__ += queues.__all__
__all__ += rollups.__all__
__all__ += runs.__all__
__all__ += savepoints.__all__
__all__ += tasks.__all__
__all__ += waits.__all__
__all__ += workers.__all__
