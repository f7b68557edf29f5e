"""Schema 12: batches, and each line's result as it is recorded."""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the batches' table and their results' (nothing existing is touched)."""
    op.create_table(
        "millm_batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("created_at", sa.Float, nullable=False, index=True),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("batch", sa.Text, nullable=False),
        sa.Column("runner", sa.String(64)),
        sa.Column("beat", sa.Float),
    )
    op.create_table(
        "millm_batch_results",
        sa.Column("batch_id", sa.String(64), sa.ForeignKey("millm_batches.id"), primary_key=True),
        sa.Column("line", sa.Integer, primary_key=True),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
