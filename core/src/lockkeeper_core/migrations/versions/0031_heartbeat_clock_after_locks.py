"""PostgreSQL: a heartbeat reads its clock once its grants' rows are held.

``lockkeeper_heartbeat`` read the clock as soon as it held the session's row,
then waited for its resources' rows. A grant of the session taken over in
that wait (the taker, holding the resource's row, read a later clock and found
the session run out) was followed by the heartbeat's commit under its earlier
reading: it answered 200 with a new expiry for a session whose place was gone,
so its worker believed a grant another held (the fault harness's session-bound
workload found a semaphore of 2 with three places believed). The clock is now
read after every row the heartbeat locks, as every other path reads it: such a
heartbeat finds the session expired and is refused, changing nothing.

Same signature and answers otherwise: replaced in place, whole.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None
# Same signature and answers: the code of 0016 on runs on it.
oldest_code = "0016"


def upgrade():
    if routine_dialect() == "postgresql":
        install("0031", "lockkeeper_heartbeat")


def downgrade():
    if routine_dialect() == "postgresql":
        install("0029", "lockkeeper_heartbeat")
