"""PostgreSQL: acquire, renew and release as server-side functions.

Each is the one data-modifying statement the hot path sends, kept in a PL/pgSQL
function so that PostgreSQL plans it once per server connection and reuses the
plan. Sent as a statement of its own, it is planned on every run unless the
client prepares it, and a transaction-pooling PgBouncer before 1.21 cannot carry
prepared statements: planning the acquire statement then cost about twice its
execution. A call of the function is cheap to plan; its statement is planned
inside the server whatever pooler sits in between.

``p_now`` NULL reads the server clock (``clock_timestamp()``) where the statement
decides; a timestamp stands in for it (tests' fake clock). The answer is one row:
``done``, and the lock as it now is, or the holder that refused (no row at all
when a renew or release finds no row for the resource).

Later schema changes that touch these tables replace the functions in their own
migration (``CREATE OR REPLACE FUNCTION``); ``core/src/lockkeeper_core/statements/postgresql.py`` calls
them by name.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
oldest_code = "0007"

SIGNATURES = (
    "lockkeeper_acquire(varchar, varchar, varchar, double precision, varchar, "
    "integer, bigint, timestamptz)",
    "lockkeeper_renew(varchar, varchar, varchar, double precision, varchar, "
    "timestamptz)",
    "lockkeeper_release(varchar, varchar, varchar, varchar, timestamptz)",
)


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0007", "lockkeeper_acquire", "lockkeeper_renew", "lockkeeper_release")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
