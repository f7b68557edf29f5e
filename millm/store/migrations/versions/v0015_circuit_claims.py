"""Schema 15: circuits' claims on the layers they steer, one live exclusive claim per layer."""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the claims table and the index that keeps one live, uncomposed claim per layer."""
    claims = op.create_table(
        "millm_circuit_claims",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("circuit_id", sa.String(64), nullable=False, index=True),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("claimed_at", sa.Float, nullable=False),
        sa.Column("released_at", sa.Float),
        sa.Column("composed", sa.Boolean, nullable=False),
        sa.Column("steering_keys", sa.Text, nullable=False),
    )
    live = claims.c.released_at.is_(None) & ~claims.c.composed
    op.create_index(
        "millm_one_live_claim_per_layer",
        "millm_circuit_claims",
        ["layer"],
        unique=True,
        sqlite_where=live,
        postgresql_where=live,
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
