"""Schema 16: a circuit's persistent dial (null: its document's authored intensity)."""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the dial; every circuit stored before keeps its authored intensity."""
    with op.batch_alter_table("millm_circuits") as batch:
        batch.add_column(sa.Column("intensity", sa.Float, nullable=True))


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
