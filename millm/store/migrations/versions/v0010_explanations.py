"""Schema 10: explanations a model wrote for SAE features, with their scores and provenance."""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the explanations' table (beside the labels', which it never touches)."""
    op.create_table(
        "millm_explanations",
        sa.Column("sae_id", sa.String(64), primary_key=True),
        sa.Column("feature", sa.Integer, primary_key=True),
        sa.Column("explainer", sa.String(200), primary_key=True),
        sa.Column("explanation", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
