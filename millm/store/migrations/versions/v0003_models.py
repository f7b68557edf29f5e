"""Schema 3: registered models."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the registered models' table."""
    op.create_table(
        "millm_models",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("reference", sa.Text, nullable=False),
        sa.Column("info", sa.Text, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
