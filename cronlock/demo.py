"""``cronlock demo``: the product's story end to end on the embedded default, with a summary.

Migrates, creates the examples' demo data (posts, a few of which cannot be indexed), fires the
reindex twice at the same moment — one run does the work, the other is skipped by the advisory
lock — and says what ran, what was skipped, which items failed and why, and where the data is.

The examples are the repository's ``tasks/``, shipped inside the wheel as ``cronlock/_examples``
(as the migrations are); without ``--app`` the demo runs whichever of the two this installation
has, imported as ``cronlock._examples``, so it works from any directory, whatever ``tasks``
means there.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

from sqlalchemy.ext.asyncio import AsyncSession

from . import schema, sql
from .app import App
from .database import Database
from .errors import AppNotFound
from .loader import load_app
from .outcome import RunResult, RunStatus
from .periodic import PeriodicTask

__all__ = ["DemoSetup", "demo_app", "run_demo"]

DemoSetup = Callable[[AsyncSession], Awaitable[str]]
REINDEX = "reindex-fts"
SUMMARY_TASK = "refresh-post-stats"
EXAMPLES = "cronlock._examples"
_PACKAGE = Path(__file__).resolve().parent


def demo_app(app_spec: str | None) -> tuple[App, DemoSetup, str]:
    """The app the demo runs, its ``setup_demo`` and the ``--app`` that finds it again:
    cronlock's examples, or ``app_spec``'s (an app of the examples' shape: a ``setup_demo``
    beside it and a ``reindex-fts`` task)."""
    if app_spec is None:
        module = _examples()
        app = module.app
        # The wheel's copy is importable by that name; a checkout's is the default, tasks.
        found_as = EXAMPLES if (_PACKAGE / "_examples").is_dir() else "tasks"
    else:
        app = load_app(app_spec)
        module = sys.modules[app_spec.partition(":")[0]]
        found_as = app_spec
    setup = getattr(module, "setup_demo", None)
    if not isinstance(app, App) or setup is None or REINDEX not in app.tasks:
        raise AppNotFound(
            f"the demo runs cronlock's examples, and {app_spec!r} is not one of them: "
            "run `cronlock demo` without --app (and CRONLOCK_APP unset)"
        )
    return app, setup, found_as


def _examples() -> ModuleType:
    if EXAMPLES in sys.modules:
        return sys.modules[EXAMPLES]
    for candidate in (_PACKAGE / "_examples", _PACKAGE.parent / "tasks"):  # wheel, checkout
        init = candidate / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            EXAMPLES, init, submodule_search_locations=[str(candidate)]
        )
        if not init.is_file() or spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[EXAMPLES] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[EXAMPLES]
            raise
        return module
    raise AppNotFound("cronlock's examples are missing from this installation")


async def lock_holders(database: Database, task: PeriodicTask) -> list[int]:
    """The backend pids holding ``task``'s advisory lock right now."""
    async with database.connect() as conn:
        result = await conn.execute(
            sql.LOCK_HOLDERS,
            {
                "namespace_oid": task.lock_namespace & 0xFFFFFFFF,
                "key_oid": task.lock_key & 0xFFFFFFFF,
            },
        )
        return list(result.scalars())


async def _wait_until_locked(database: Database, task: PeriodicTask, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if await lock_holders(database, task):
            return True
        await asyncio.sleep(0.002)
    return False


def _outcome(result: RunResult) -> str:
    if result.status is RunStatus.SKIPPED:
        return "skipped — another run held the advisory lock, so this one did nothing"
    text = f"{result.status.value} — {result.items_ok} posts indexed, {result.items_failed} failed"
    if result.items_failed:
        text += " (each rolled back to its own savepoint; the rest committed)"
    return text


async def run_demo(
    app: App, database: Database, setup: DemoSetup, where: str, app_spec: str = "tasks"
) -> list[str]:
    await schema.upgrade(database)
    lines = [f"cronlock demo on {where}", ""]
    lines.append(f"1. migrated schema {database.schema!r} to revision {schema.head_revision()}")

    async with database.session() as session:
        lines.append(f"2. created demo data: {await setup(session)}")

    reindex = app.task(REINDEX)
    # By hand, as a person trying it would (`cronlock run reindex-fts --manual`): the demo
    # runs at any time, not at a fire time, and the lock is what it shows.
    first = asyncio.create_task(app.run(REINDEX, manual=True))
    await _wait_until_locked(database, reindex, time.monotonic() + 10)
    second = await app.run(REINDEX, manual=True)
    first_result = await first
    lines.append(f"3. fired {REINDEX!r} twice at the same moment:")
    lines.append(f"     run 1: {_outcome(first_result)}")
    lines.append(f"     run 2: {_outcome(second)}")
    if first_result.failures:
        lines.append("   failed items and why:")
        lines.extend(
            f"     post {f.item}: {f.error_type}: {f.message}" for f in first_result.failures
        )
    if SUMMARY_TASK in app.tasks:
        stats = await app.run(SUMMARY_TASK, manual=True)
        lines.append(
            f"4. ran {SUMMARY_TASK!r} (one transaction, all or nothing): {stats.status.value}"
        )
    command = "cronlock" if app_spec == "tasks" else f"cronlock --app {app_spec}"
    lines += [
        "",
        f"the data lives in {database.display_url}",
        f"  every run is a row of {database.schema}.runs; the posts are in public.posts",
        f"next: {command} status · {command} list · {command} crontab",
    ]
    return lines
