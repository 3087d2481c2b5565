"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from alembic import context, op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}
# The oldest code that works against this schema (cronlock.online, rule 6).
oldest_code = ${repr(down_revision)}



def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
