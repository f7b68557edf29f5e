"""Schema 5: steering vectors, probes, and an op (with its value) for each live steering value."""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the vectors' and probes' tables; give the live values their op."""
    op.create_table(
        "millm_vectors",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("d_model", sa.Integer, nullable=False),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("hook_point", sa.String(32), nullable=False),
        sa.Column("method", sa.String(32), nullable=False),
        sa.Column("pairs", sa.Integer, nullable=False),
        sa.Column("norm", sa.Float, nullable=False),
        sa.Column("agreement", sa.Float, nullable=True),
        sa.Column("unit", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "millm_probes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("document", sa.Text, nullable=False),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    # Every value stored before ops existed was an add, so the default makes them mean what they
    # meant. `strength` stays NOT NULL: SQLite cannot drop that in place.
    with op.batch_alter_table("millm_strengths") as batch:
        batch.add_column(sa.Column("op", sa.String(16), nullable=False, server_default="add"))
        batch.add_column(sa.Column("value", sa.Float, nullable=True))


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
