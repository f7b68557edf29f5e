"""Schema 14: which clusters and circuits are sensed, and their sensing events."""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the sensing settings and events tables."""
    op.create_table(
        "millm_sensing",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("base_id", sa.String(64), primary_key=True),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
    )
    op.create_table(
        "millm_sensing_events",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("base_id", sa.String(64), nullable=False, index=True),
        sa.Column("created_at", sa.Float, nullable=False, index=True),
        sa.Column("record", sa.Text, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
