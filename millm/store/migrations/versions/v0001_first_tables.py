"""Schema 1: settings, registered SAEs, attachments, live strengths and profiles.

Each revision spells out its own tables instead of importing database.metadata: that describes
the newest schema, and a revision must go on creating what its version had.
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the first version's tables."""
    op.create_table(
        "millm_settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "millm_saes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("info", sa.Text, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
    )
    op.create_table(
        "millm_attachments",
        sa.Column("sae_id", sa.String(64), sa.ForeignKey("millm_saes.id"), primary_key=True),
        sa.Column("layer", sa.Integer, nullable=False),
    )
    op.create_table(
        "millm_strengths",
        sa.Column("sae_id", sa.String(64), primary_key=True),
        sa.Column("feature", sa.Integer, primary_key=True),
        sa.Column("strength", sa.Float, nullable=False),
    )
    op.create_table(
        "millm_profiles",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("document", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
