"""PostgreSQL: a take-over's event names the previous holder's token too.

A take-over recorded its previous owner (``previous_owner``) but not the token
that owner held it under, so the history could not tell which of one owner's
grants under two tokens (a semaphore's places, shared grants) a take-over
ended. Its ``details`` now carry ``previous_token`` ('' for a holder with no
token, as ``lock_holders`` records it), as the transaction path writes them
(``lockkeeper_core.statements.common.took_over_from``). Same signatures and answers
as 0018 (``lockkeeper_acquire``) and 0024 (``lockkeeper_acquire_place``):
replaced in place; only a take-over's event changes.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0025", "lockkeeper_acquire", "lockkeeper_acquire_place")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    install("0018", "lockkeeper_acquire")
    install("0024", "lockkeeper_acquire_place")
