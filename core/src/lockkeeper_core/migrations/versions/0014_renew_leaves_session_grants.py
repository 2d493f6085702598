"""PostgreSQL: ``lockkeeper_renew`` leaves a session-bound grant alone.

A grant bound to a session expires with it and is renewed by the session's
heartbeat only: renewed on its own, its expiry would leave the session's, and
the session's end and expiry would no longer cover it. Renew now refuses a row
bound to a live binding (its ``session_id`` names a session whose expiry is the
row's, same holder); the service then answers 409, "renew the session". A row
whose ``session_id`` outlived its binding (an earlier tenure's) renews as before.
The lookup is one primary-key probe, made only for a row with a ``session_id``.
Same signature and answer: replaced in place.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
oldest_code = "0009"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0014", "lockkeeper_renew")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0007", "lockkeeper_renew")
