"""PostgreSQL: the acquire function decides the token's right where it grants.

A grant that may start a tenure locks its API token's row before the statement
that grants: ``FOR NO KEY UPDATE`` when the token has a lock quota, so two
parallel new grants of one token count one after the other and the quota is
exact; ``FOR SHARE`` otherwise, which no other grant waits for. The statement
then refuses a token that was revoked (a revocation that committed first; one
that comes later waits for this grant) or has expired by the deciding clock, and
answers ``token_ended``. A re-acquire of a valid lock and a refusal by a valid
holder lock nothing more than before.

The answer gains a column, so the function is dropped and created again
(``CREATE OR REPLACE`` cannot change a function's result type).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
oldest_code = "0009"

SIGNATURE = (
    "lockkeeper_acquire(varchar, varchar, varchar, double precision, varchar, "
    "integer, bigint, timestamptz)"
)


def upgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    install("0009", "lockkeeper_acquire")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    install("0007", "lockkeeper_acquire")
