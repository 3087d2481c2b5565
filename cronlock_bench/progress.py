"""How ``cronlock bench`` shows where it is: a bar on a terminal, one line per step otherwise.

Both write to stderr, so ``--json`` keeps stdout to its one JSON object.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol

import click

__all__ = ["Bar", "Lines", "Progress", "Silent"]


class Progress(Protocol):
    def start(self, weights: Sequence[int]) -> None:
        """The steps to come, each with its expected share of the time."""

    def begin(self, label: str) -> None:
        """A step starts."""

    def note(self, text: str) -> None:
        """News within the step (jobs drained so far)."""

    def end(self) -> None:
        """The step is done."""

    def finish(self) -> None: ...


class Silent:
    def start(self, weights: Sequence[int]) -> None:
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

    def start(self, weights: Sequence[int]) -> None:
        self._steps = len(weights)

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
        self._weights: list[int] = []

    def start(self, weights: Sequence[int]) -> None:
        self._weights = list(weights)
        self._bar = click.progressbar(
            length=max(sum(weights), 1),
            label="cronlock bench",
            file=sys.stderr,
            show_eta=False,
            item_show_func=_shown,
        )
        self._bar.__enter__()

    def begin(self, label: str) -> None:
        self._label = label
        self._show(label)

    def note(self, text: str) -> None:
        self._show(f"{self._label}: {text}")

    def _show(self, item: str) -> None:
        # update(0, …) does not redraw (below update_min_steps): set the item and redraw.
        self._bar.current_item = item
        self._bar.render_progress()

    def end(self) -> None:
        self._bar.update(self._weights.pop(0), self._label)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
