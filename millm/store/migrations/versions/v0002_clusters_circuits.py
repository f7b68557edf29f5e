"""Schema 2: clusters (with their intensity dial) and circuits."""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the clusters' and circuits' tables."""
    op.create_table(
        "millm_clusters",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("raw", sa.Text, nullable=False),
        sa.Column("intensity", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "millm_circuits",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("raw", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
