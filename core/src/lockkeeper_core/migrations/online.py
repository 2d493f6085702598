"""Index changes a migration makes while the lock traffic goes on.

A plain ``CREATE INDEX`` holds a lock that blocks every write to the table while
it builds, and ``DROP INDEX`` waits for every transaction on the table and blocks
all others meanwhile: two such steps in one transaction deadlocked against the
lock traffic's row locks (0026 under a rolling upgrade). So:

- PostgreSQL: ``CREATE INDEX CONCURRENTLY`` / ``DROP INDEX CONCURRENTLY``, which
  take no lock that writers wait on. They cannot run inside a transaction, so
  they run in Alembic's autocommit block. A concurrent build that fails (a lock
  timeout) leaves an invalid index behind: it is dropped before the next try.
- MariaDB: ``ALTER TABLE … ALGORITHM=INPLACE, LOCK=NONE``: the table takes writes
  while the index builds, and a change that cannot be made so fails at once
  instead of locking the table. Its DDL is not transactional, so each step says
  ``IF [NOT] EXISTS`` and a retried migration goes on where it stopped.
- SQLite: plain statements in the migration's transaction (one writer at a time
  there anyway).

``columns`` are SQL: column names or expressions, rendered as given.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text


def _dialect() -> str:
    return op.get_bind().dialect.name


def create_index(
    name: str, table: str, columns: list[str], *, where: str | None = None
) -> None:
    listed = ", ".join(columns)
    dialect = _dialect()
    if dialect == "postgresql":
        condition = f" WHERE {where}" if where else ""
        with op.get_context().autocommit_block():
            if _invalid_postgresql_index(name):
                op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}"
                f" ON {table} ({listed}){condition}"
            )
    elif dialect in ("mysql", "mariadb"):
        if where:
            raise ValueError("MariaDB has no partial indexes")
        op.execute(
            f"ALTER TABLE {table} ADD INDEX IF NOT EXISTS {name} ({listed}),"
            " ALGORITHM=INPLACE, LOCK=NONE"
        )
    else:
        condition = f" WHERE {where}" if where else ""
        op.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({listed}){condition}"
        )


def drop_index(name: str, table: str) -> None:
    dialect = _dialect()
    if dialect == "postgresql":
        with op.get_context().autocommit_block():
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    elif dialect in ("mysql", "mariadb"):
        op.execute(
            f"ALTER TABLE {table} DROP INDEX IF EXISTS {name},"
            " ALGORITHM=INPLACE, LOCK=NONE"
        )
    else:
        op.execute(f"DROP INDEX IF EXISTS {name}")


def _invalid_postgresql_index(name: str) -> bool:
    return bool(
        op.get_bind()
        .execute(
            text(
                "SELECT NOT i.indisvalid FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = :name AND pg_table_is_visible(c.oid)"
            ),
            {"name": name},
        )
        .scalar()
    )
