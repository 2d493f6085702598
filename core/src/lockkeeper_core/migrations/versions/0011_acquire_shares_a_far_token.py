"""PostgreSQL: a token far from its lock quota shares its row lock at a grant.

Migration 0009 made every new grant under a quota lock its token's row alone,
so the quota is exact, and so every new grant of a token many workers share
took turns, with the default quota (10000) too. Now the lock is shared while the
token's live locks plus ``max_connections`` stay below its quota (no set of
grants in flight, one per server connection at most, can then pass it) and is
taken alone only nearer than that. A shared grant counts again after its lock
and is refused (the service tries again, alone) if it finds itself that near.
Same signature and answer as 0009: replaced in place.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
oldest_code = "0009"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0011", "lockkeeper_acquire")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0009", "lockkeeper_acquire")
