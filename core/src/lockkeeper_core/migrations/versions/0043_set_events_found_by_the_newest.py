"""PostgreSQL: a set's acquire and release find the event they name the set
on by the newest event of its resource, not the whole history.

``lockkeeper_acquire_set`` (0041) and ``lockkeeper_release_set`` (0042)
named the set on the event they had just written, found as the newest event
of its resource and fence at once. The planner answered that by reading
every event of the resource (a bitmap scan of its name, the fence filtered
row by row, with or without statistics): on a resource with 9,000 events,
2 to 47 ms per member, growing with its history. They now take the newest
event of the resource (one step back along its (resource, id) index) and
name it when it carries the grant's fence; only when a freeze's event is
newer (a freeze names its prefix as its resource) do they look by the fence.
Same signatures and answers: replaced in place.

Revision ID: 0043
Revises: 0042
Create Date: 2026-12-07
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None
# Same signatures and answers, which only this code calls.
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0043", "lockkeeper_acquire_set", "lockkeeper_release_set")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0041", "lockkeeper_acquire_set")
    install("0042", "lockkeeper_release_set")
