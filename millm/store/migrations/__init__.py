"""Alembic's environment and one revision per schema version (versions/); Store.migrate runs
them."""
