"""The demo's own tables: the reference's blog posts, a one-row summary of them, and the users
whose balance ``process_payment`` changes."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, Integer, Text, delete, insert, text
from sqlalchemy.dialects.postgresql import TSVECTOR
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Post(Base):
    __tablename__ = "posts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    title: Mapped[str] = mapped_column(Text)
    content: Mapped[str] = mapped_column(Text)
    # A text search configuration name; an unknown one makes to_tsvector fail for this post.
    language: Mapped[str] = mapped_column(Text, server_default="english")
    search_vector: Mapped[str | None] = mapped_column(TSVECTOR, nullable=True)


class PostStats(Base):
    __tablename__ = "post_stats"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    posts: Mapped[int] = mapped_column(Integer)
    indexed: Mapped[int] = mapped_column(Integer)
    refreshed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class User(Base):
    __tablename__ = "users"
    # A payment that would overdraw fails, in its savepoint, and is retried.
    __table_args__ = (CheckConstraint("balance >= 0", name="users_balance_not_negative"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(Text)
    balance: Mapped[int] = mapped_column(Integer, server_default="0")


DEMO_POSTS = 1000
DEMO_USERS = 10
BAD_POSTS = {17: "klingon", 404: "elvish", 777: "dothraki"}


async def setup_demo(session: AsyncSession, posts: int = DEMO_POSTS) -> str:
    """Create the demo tables if needed and fill ``posts`` with posts to index.

    Three posts name a text search configuration PostgreSQL does not have, so indexing them
    fails: each fails alone, in its own savepoint.
    """
    connection = await session.connection()
    await connection.run_sync(Base.metadata.create_all)
    await session.execute(delete(PostStats))
    await session.execute(text("TRUNCATE posts, users"))
    await session.execute(
        insert(User),
        [
            {"id": i, "email": f"user-{i}@example.com", "balance": 0}
            for i in range(1, DEMO_USERS + 1)
        ],
    )
    await session.execute(
        insert(Post),
        [
            {
                "id": i,
                "title": f"Post {i}",
                "content": f"Advisory locks and savepoints, part {i}: skipping overlapping runs.",
                "language": BAD_POSTS.get(i, "english"),
            }
            for i in range(1, posts + 1)
        ],
    )
    await session.commit()
    bad = sum(1 for i in BAD_POSTS if i <= posts)
    return (
        f"{posts} posts without a search vector, {bad} of them in a language "
        "PostgreSQL has no text search configuration for"
    )
