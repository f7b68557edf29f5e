"""Schema 9: transcoder sets registered for attribution graphs (where each set's files lie)."""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the transcoder sets' table."""
    op.create_table(
        "millm_transcoder_sets",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
