"""Periodic tasks declared in a Django app: ``@periodic(name, cron=...)`` in one of its task
modules (``config``), registered on the project's App (``worker.project_app``), so that
``manage.py cronlock crontab``, ``run``, ``list`` and ``scheduler`` know them.

A body is a plain ``def body(run)`` and runs as any cronlock ``def`` body does: in a thread of
its own, under the task's advisory lock, for its slot (``cronlock.Run``). It uses the ORM on
Django's connection, which is not the run's: its writes commit as Django's do (autocommit, or
the ``transaction.atomic()`` it opens), not with the run. ``with run.item(key):`` still records
an item's failure and lets the others go on; put the item's writes in ``transaction.atomic()``
for them to roll back with it. Around the body the connections are looked after as Django's
request cycle does (``worker.connected``). An ``async def`` body is refused: Django's ORM is
sync.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ...app import App
from ...errors import ConfigurationError
from ...queue.threads import is_async

__all__ = ["Declared", "declared", "periodic"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Declared:
    """A periodic task as declared: ``App.periodic``'s arguments and its body."""

    name: str
    options: dict[str, Any]
    body: Callable[..., Any]


# Every declaration checks its options on this App when its module is imported (a bad cron
# expression, a name taken, colliding lock keys are errors then, as with App.periodic).
_checked = App(retention=False)
_declared: dict[str, Declared] = {}


def periodic(name: str, *, cron: str, **options: Any) -> Callable[[F], F]:
    """Declare a periodic task of the project: ``App.periodic``'s name, cron expression and
    options (``namespace``, ``timezone``, ``grace``, ``misfire``, ``commit_every``, …)."""
    register = _checked.periodic(name, cron=cron, **options)

    def declare(body: F) -> F:
        if is_async(body):
            raise ConfigurationError(
                f"periodic task {name!r}: a Django periodic task is a plain def (the ORM is sync)"
            )
        register(body)
        _declared[name] = Declared(name, {"cron": cron, **options}, body)
        return body

    return declare


def declared() -> list[Declared]:
    """Every periodic task declared so far, in the order declared."""
    return list(_declared.values())
