"""How ``cronlock bench`` shows where it is: a bar on a terminal, one line per step otherwise.

Both write to stderr, so ``--json`` keeps stdout to its one JSON object.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

import click

__all__ = ["Bar", "Lines", "Progress", "Silent"]


class Progress(Protocol):
    def start(self, steps: int) -> None: ...

    def begin(self, label: str) -> None:
        """A step starts."""

    def note(self, text: str) -> None:
        """News within the step (jobs drained so far)."""

    def end(self) -> None:
        """The step is done."""

    def finish(self) -> None: ...


class Silent:
    def start(self, steps: int) -> None:
        pass

    def begin(self, label: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def end(self) -> None:
        pass

    def finish(self) -> None:
        pass


class Lines:
    """One line per step on stderr (stderr is not a terminal, or ``--json``)."""

    def __init__(self) -> None:
        self._steps = 0
        self._done = 0

    def start(self, steps: int) -> None:
        self._steps = steps

    def begin(self, label: str) -> None:
        click.echo(f"cronlock bench: [{self._done + 1}/{self._steps}] {label}", err=True)

    def note(self, text: str) -> None:
        pass

    def end(self) -> None:
        self._done += 1

    def finish(self) -> None:
        pass


def _shown(item: str | None) -> str | None:
    return item


class Bar:
    """click's progress bar on stderr, the current step (and its news) beside it."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._label = ""

    def start(self, steps: int) -> None:
        self._bar = click.progressbar(
            length=steps,
            label="cronlock bench",
            file=sys.stderr,
            show_eta=False,
            item_show_func=_shown,
        )
        self._bar.__enter__()

    def begin(self, label: str) -> None:
        self._label = label
        self._bar.update(0, label)

    def note(self, text: str) -> None:
        self._bar.update(0, f"{self._label}: {text}")

    def end(self) -> None:
        self._bar.update(1, self._label)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
