"""Schema 4: feature labels and calibrations."""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the feature labels' and calibrations' tables."""
    op.create_table(
        "millm_feature_labels",
        sa.Column("sae_id", sa.String(64), primary_key=True),
        sa.Column("feature", sa.Integer, primary_key=True),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "millm_calibrations",
        sa.Column("sae_id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("figures", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
