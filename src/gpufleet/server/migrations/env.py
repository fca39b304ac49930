"""Alembic environment. Runs on the connection the server hands in (see db/migrate.py)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from gpufleet.server.db.tables import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies tables
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    # `alembic -x url=sqlite:///... revision --autogenerate` during development.
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///dev.db")
    with create_engine(url).connect() as conn:
        _run(conn)
