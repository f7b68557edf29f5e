"""Schema 13: each batch's lines still to run, claimed a chunk at a time by any replica."""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the queue of lines to run (a batch made before it is queued by the runner)."""
    op.create_table(
        "millm_batch_pending",
        sa.Column("batch_id", sa.String(64), sa.ForeignKey("millm_batches.id"), primary_key=True),
        sa.Column("line", sa.Integer, primary_key=True),
        sa.Column("runner", sa.String(64)),
        sa.Column("until", sa.Float),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
