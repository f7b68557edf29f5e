"""Schema 17: dictionary trainings (resumable after a restart) and dictionaries' grades."""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the two tables; nothing stored before changes."""
    op.create_table(
        "millm_dictionary_trainings",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("work_dir", sa.Text, nullable=False),
        sa.Column("progress", sa.Text, nullable=False),
        sa.Column("result", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False, index=True),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float),
    )
    op.create_table(
        "millm_dictionary_grades",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("sae_id", sa.String(64), nullable=False, index=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("card", sa.Text, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
