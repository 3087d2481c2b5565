"""Typed job types for tests: a pydantic model with a typed result, a dataclass with a plain
``def`` handler, and a type only declared (a producer's), for every surface's tests.

Each handler returns what it received, by its class's name and fields, so that a test (or a
command's) reads from the stored result that the handler got the model, not a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import cronlock


class SendEmail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str
    subject: str = Field(min_length=1)
    user_id: int
    tags: list[str] = []


class Sent(BaseModel):
    received: str
    to: str
    words: int


@dataclass
class Resize:
    url: str
    width: int
    height: int | None = None
    at: datetime | None = None

    def __post_init__(self) -> None:  # runs on the worker, not at enqueue
        if self.width < 0:
            raise ValueError("width must not be negative")


@dataclass
class Report:
    name: str
    days: int = 7


async def send_email(session: AsyncSession, payload: SendEmail) -> Sent:
    return Sent(received=type(payload).__name__, to=payload.to, words=len(payload.subject.split()))


def resize(session: Session, payload: Resize) -> dict[str, Any]:
    return {
        "received": type(payload).__name__,
        "width": payload.width,
        "at": None if payload.at is None else type(payload.at).__name__,
    }


async def miscount(session: AsyncSession, payload: SendEmail) -> dict[str, Any]:
    """Returns what its result model does not take: a failed attempt."""
    return {"to": payload.to}


def create_app() -> cronlock.App:
    """A new App with these job types (each test builds its own)."""
    app = cronlock.App()
    app.job("send_email", max_retries=0, payload=SendEmail, result=Sent)(send_email)
    app.job("miscount", max_retries=0, payload=SendEmail, result=Sent)(miscount)
    app.job("resize", max_retries=0, payload=Resize)(resize)
    app.declare_job("report", queue="reports", payload=Report)
    return app


app = create_app()
