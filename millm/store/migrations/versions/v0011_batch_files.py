"""Schema 11: files for the Batch API, their bytes in chunks beside each record."""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the files' table and their chunks' (nothing existing is touched)."""
    op.create_table(
        "millm_batch_files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("bytes", sa.Integer, nullable=False),
        sa.Column("lines", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False, index=True),
        sa.Column("expires_at", sa.Integer, nullable=False),
    )
    op.create_table(
        "millm_batch_file_chunks",
        sa.Column(
            "file_id", sa.String(64), sa.ForeignKey("millm_batch_files.id"), primary_key=True
        ),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
