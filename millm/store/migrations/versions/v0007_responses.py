"""Schema 7: stored Responses API answers (for GET /v1/responses/{id} and previous_response_id)."""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the responses' table, indexed by age for the retention sweep."""
    op.create_table(
        "millm_responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("items", sa.Text, nullable=False),
    )
    op.create_index("ix_millm_responses_created_at", "millm_responses", ["created_at"])


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
