"""PostgreSQL: one lock order, and a refused place writes nothing.

``lockkeeper_acquire`` locked its token's row, then the resource's; the places'
function (``lockkeeper_acquire_place``) the resource's row, then the token's
(FOR UPDATE under any quota). One token's exclusive and shared acquires of one
resource deadlocked each other, round after round. Both now take the order
every path follows (``lockkeeper_core.statements``): the resource's row, then the
token's. The exclusive function locks the row a new tenure may take (free or
expired, no one in line first) before its token; a row validly held is left
alone as before (a re-acquire needs no token, a refusal locks nothing).

The places' function inserted a free row for a resource with none before it
decided: a refusal (over quota, frozen, a token that ended) left that row
behind, with no event. The row now comes with the resource's first grant,
after the token's row; a concurrent first grant's row that came first makes
this one answer nothing, and the service tries again.

``lockkeeper_heartbeat`` updated the rows of its session's resources in
whatever order its plan met them: two heartbeats of sessions with grants on
the same resources could take them in opposite orders. It now locks them in
resource order first.

Same signatures and answers as 0025 and 0013: replaced in place, whole.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None
# Same signatures and answers: the code of 0016 on runs on it.
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install(
        "0029", "lockkeeper_acquire", "lockkeeper_acquire_place", "lockkeeper_heartbeat"
    )


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0025", "lockkeeper_acquire", "lockkeeper_acquire_place")
    install("0013", "lockkeeper_heartbeat")
