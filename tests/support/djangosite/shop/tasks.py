"""The shop's tasks (``django.tasks``) and one periodic task (cronlock's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connection

from cronlock import Run
from cronlock.contrib.django import periodic

from .errors import OutOfStock
from .models import Order

if TYPE_CHECKING:
    from django_tasks import TaskContext, task
else:
    try:
        from django.tasks import TaskContext, task
    except ImportError:  # Django 5.2: the backport
        from django_tasks import TaskContext, task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=7, queue_name="reports")
def report(name: str, *, pages: int = 1) -> dict[str, Any]:
    return {"report": name, "pages": pages}


@task(takes_context=True)
def which_attempt(context: TaskContext) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id}


@task
def sell(item: str) -> None:
    raise OutOfStock(f"no {item} left")


@task
def record(note: str) -> int:
    """Writes with the ORM, in the worker's thread."""
    Order.objects.create(note=note)
    return Order.objects.filter(note=note).count()


@task
def second_time_lucky(note: str) -> str:
    """Fails on its first attempt, whose ORM write commits all the same (Django's own
    transaction); succeeds on the next."""
    if not Order.objects.filter(note=note).exists():
        Order.objects.create(note=note)
        raise RuntimeError("first attempt")
    return "second"


@task
def backend_pid() -> int:
    """The server process of this task's Django connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@task
async def add_later(a: int, b: int) -> int:
    return a + b


@periodic("shop-nightly", cron="0 3 * * *")
def nightly(run: Run) -> None:
    """Notes the night's run in an order."""
    Order.objects.create(note=f"nightly {run.slot:%Y-%m-%d}" if run.slot else "nightly")
