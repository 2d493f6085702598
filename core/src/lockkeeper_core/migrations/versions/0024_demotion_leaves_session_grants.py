"""PostgreSQL: a plain demotion of one's own session-bound exclusive grant is
refused.

A demotion (exclusive to shared) is a re-acquire: without the session, it set
the shared grant's expiry to now + ttl and its session to none, so it cut a
session-bound grant loose from its session. Now it is refused as a plain
re-acquire of a bound grant is (0018 for the exclusive statement; 0021 for a
place): ``bound_session`` names the session and the service answers 409.
Acquiring through the session demotes it, still bound (that path is the
transaction, not this function). Same signature and answer as 0021: replaced
in place.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0024", "lockkeeper_acquire_place")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0021", "lockkeeper_acquire_place")
