"""Schema 6: the model an attachment belongs to, a version on each profile, and a
steering_version row."""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

settings = sa.table("millm_settings", sa.column("key", sa.String), sa.column("value", sa.Text))


def upgrade() -> None:
    """Add attachments.model and profiles.version; make sure steering_version has a row."""
    # NULL: an older attachment attaches on whichever model loads, as it did before.
    with op.batch_alter_table("millm_attachments") as batch:
        batch.add_column(sa.Column("model", sa.String(200), nullable=True))
    # Existing profiles start at version 1, as a newly made one does.
    with op.batch_alter_table("millm_profiles") as batch:
        batch.add_column(sa.Column("version", sa.Integer, nullable=False, server_default="1"))
    # Bumping the version is an UPDATE ... SET value = value + 1, which needs the row to be there.
    present = (
        op.get_bind()
        .execute(sa.select(settings.c.key).where(settings.c.key == "steering_version"))
        .first()
    )
    if present is None:
        op.execute(settings.insert().values(key="steering_version", value="0"))


def downgrade() -> None:
    """Not supported: millm's schema only moves forward, and going back would drop a user's rows."""
    raise NotImplementedError("millm does not downgrade its schema")
