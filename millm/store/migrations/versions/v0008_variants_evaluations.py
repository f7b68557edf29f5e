"""Schema 8: steered variants (names clients use as models: a base model and its steering) and
steering evaluations (each run's result)."""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the variants' table (names unique: a client names a variant as it names a model)
    and the evaluations' table."""
    op.create_table(
        "millm_variants",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("base", sa.String(400), nullable=False),
        sa.Column("document", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "millm_evaluations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("concept", sa.String(400), nullable=False),
        sa.Column("result", sa.Text, nullable=False),
    )
    op.create_index("ix_millm_evaluations_created_at", "millm_evaluations", ["created_at"])


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
