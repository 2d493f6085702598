"""PostgreSQL: an insert into lock_events notifies ``lockkeeper_events`` while some
app process follows the log, so its event streams wake at once. Other databases:
nothing (their streams poll).

A NOTIFY is not free: PostgreSQL serialises the commits of notifying
transactions (they hold one lock across their commit), which cost the lock path
about a third of its throughput with 4 writers on a 2-core host. So writers
notify only while ``lock_event_listeners`` has a row: one per listening
connection of a process with a stream open (by its backend pid; a row whose
backend is gone is deleted by the next process that registers).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
oldest_code = "0009"

LISTENERS_TABLE = """
CREATE TABLE lock_event_listeners (
    pid integer PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
TRIGGER = """
CREATE TRIGGER lock_events_notify AFTER INSERT ON lock_events
FOR EACH STATEMENT EXECUTE FUNCTION lock_events_notify()
"""


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(LISTENERS_TABLE)
    install("0010", "lock_events_notify")
    op.execute(TRIGGER)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS lock_events_notify ON lock_events")
    op.execute("DROP FUNCTION IF EXISTS lock_events_notify()")
    op.execute("DROP TABLE IF EXISTS lock_event_listeners")
