"""Alembic's environment: online only, on the Connection Store.migrate opened (and its
transaction)."""

from alembic import context

# Store.migrate holds the connection, its transaction and (on PostgreSQL) the advisory lock; a
# second engine here would migrate outside all three.
connection = context.config.attributes["connection"]
# On SQLite, Store.migrate opened the transaction with BEGIN IMMEDIATE, so DDL is transactional
# there too (pysqlite alone would commit each statement by itself).
transactional = True if connection.dialect.name == "sqlite" else None
context.configure(connection=connection, target_metadata=None, transactional_ddl=transactional)
with context.begin_transaction():
    context.run_migrations()
