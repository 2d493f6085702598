"""PostgreSQL: a plain re-acquire of one's own session-bound grant is refused.

A grant bound to a session has the session's expiry, moved only by its
heartbeat (0014 made a plain renew refuse it). A re-acquire without the session
set its expiry to now + ttl and so cut it loose from the session. Now it is
refused like the renew (the service answers 409 naming the session; acquiring
through the session re-acquires it, still bound). Same signature and answer as
0016: replaced in place, additive.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0018", "lockkeeper_acquire")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0016", "lockkeeper_acquire")
