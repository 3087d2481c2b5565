"""Running code of another process's in this one, as if that process were fresh.

A command started in its own process imports its ``--app`` module anew, configures logging
once and may change signal handlers and ``sys.path``; run in the test process instead, the
same things would leak from one test into the next (an App given a database, a handler on the
root logger). ``fresh_modules`` gives the code its own copy of the app modules and puts the
test process's copies back afterwards; ``process_state`` puts back what a command may change
process-wide.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, ModuleType
from typing import Any

SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# The packages that hold apps a command loads with --app: the test apps and the examples.
APP_PACKAGES = ("testapps", "tasks")


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


@contextmanager
def fresh_modules(*packages: str) -> Iterator[None]:
    """Inside, importing a module of ``packages`` executes it anew (a new App, new module
    state); afterwards this process's own modules are back, untouched. The packages are
    replaced whole, so that ``from package import module`` cannot mix the two copies."""
    saved = {name: module for name, module in sys.modules.items() if _under(name, packages)}
    for name in saved:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [name for name in sys.modules if _under(name, packages)]:
            del sys.modules[name]
        sys.modules.update(saved)


@contextmanager
def fresh_module(name: str) -> Iterator[ModuleType]:
    """A new copy of module ``name`` (and of its package), for the duration of the block."""
    with fresh_modules(name.partition(".")[0]):
        yield importlib.import_module(name)


@contextmanager
def process_state() -> Iterator[None]:
    """Put back, afterwards, what a command changes for the whole process: the root logger's
    handlers and every logger's level (``logging.basicConfig``, ``-v``, the demo's quieter
    periodic logger), ``sys.path``, and the SIGINT and SIGTERM handlers.

    Inside, the root logger starts as in a new process (no handlers, level WARNING), so that
    ``basicConfig`` writes the command's log lines to its own stderr, as it would there."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    path = list(sys.path)
    main = threading.current_thread() is threading.main_thread()
    signals: dict[int, SignalHandler] = {
        signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, logger in logging.root.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))
        sys.path[:] = path
        if main:
            for signum, previous in signals.items():
                if previous is not None:  # None: not installed from Python, nothing to put back
                    signal.signal(signum, previous)
