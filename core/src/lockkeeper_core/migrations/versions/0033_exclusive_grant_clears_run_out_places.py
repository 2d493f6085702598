"""PostgreSQL: an exclusive grant over places that ran out clears them and
records when the session-bound ones ran out.

A resource that a semaphore's places or shared grants held, all run out, can be
granted exclusive. The grant reset the row but left the place rows behind; the
end or purge of their session later wrote a ``released`` event at each one's
expiry, but after the grant's event, so the history had already ended those
tenures at the grant, with nothing recording when a session-bound one ran out
("expired, time unknown"). The grant now deletes them and writes that
``released`` event for each one bound to a session before its own, as the
places path does for the places it clears
(``lockkeeper_core.statements.details.session_expiry_event``). Same signature and
answer as 0032: replaced in place; only rows and events change.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-06
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None
# Same signature and answer; older code reads the events as before, and a row
# with no places left reads as one whose places ran out.
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0033", "lockkeeper_acquire")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0032", "lockkeeper_acquire")
