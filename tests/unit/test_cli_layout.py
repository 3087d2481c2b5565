"""The command line is a thin edge: ``asyncio.run`` and click stay in ``cronlock/cli/``
(``asyncio.run`` also in ``queue/sync.py``, app.sync's wait: sync code's other edge);
signal handlers are installed by the serve entry points. (``cronlock bench``, with its own
progress output and SIGTERM handler, is ``cronlock_bench``, beside the package.)"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cronlock"


def _modules_matching(pattern: str) -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        if re.search(pattern, code, re.MULTILINE):
            found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_asyncio_run_is_only_in_the_command_line() -> None:
    assert _modules_matching(r"\basyncio\.run\(") == {"cli/context.py", "queue/sync.py"}


def test_click_is_only_in_the_command_line() -> None:
    users = _modules_matching(r"^\s*(import click|from click)")
    assert users and {m for m in users if not m.startswith("cli/")} == set()


def test_signal_handlers_are_the_serve_entry_points() -> None:
    assert _modules_matching(r"add_signal_handler\(") == {"service.py"}
