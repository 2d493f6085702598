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

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

LISTENERS_TABLE = """
CREATE TABLE lock_event_listeners (
    pid integer PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
# One notification per inserting statement, and PostgreSQL folds identical ones
# of a transaction into one: a payload would make every event its own.
NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION lock_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lock_event_listeners) THEN
        PERFORM pg_notify('lockkeeper_events', '');
    END IF;
    RETURN NULL;
END
$$
"""
TRIGGER = """
CREATE TRIGGER lock_events_notify AFTER INSERT ON lock_events
FOR EACH STATEMENT EXECUTE FUNCTION lock_events_notify()
"""


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(LISTENERS_TABLE)
    op.execute(NOTIFY_FUNCTION)
    op.execute(TRIGGER)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS lock_events_notify ON lock_events")
    op.execute("DROP FUNCTION IF EXISTS lock_events_notify()")
    op.execute("DROP TABLE IF EXISTS lock_event_listeners")
