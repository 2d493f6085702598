"""PostgreSQL: a take-over of a session-bound grant records when it ran out.

A grant bound to a session runs out at its session's expiry, which the
session's heartbeats move without writing an event. A take-over named the
grant it took (``previous_owner``, ``previous_token``) but not that expiry, so
once the session's row was gone the history read "expired, time unknown". Its
``details`` now carry ``previous_expires_at`` (ISO 8601, UTC) when the grant
it took was bound to a session, as the transaction path writes them
(``lockkeeper_core.statements.details.ended_bound_grant``). And a place acquire that
clears expired places bound to a session (a new grant, a promotion or a
demotion; other than the place it takes over) writes a ``released`` event at
each one's expiry before its own, as the end or purge of its session would
(``details.session_expiry_event``). Same signatures and answers
as 0029: replaced in place; only events change.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-06
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None
# Same signatures and answers; older code reads the new events' details as it
# read them before (an unknown key is ignored).
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0032", "lockkeeper_acquire", "lockkeeper_acquire_place")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0029", "lockkeeper_acquire", "lockkeeper_acquire_place")
