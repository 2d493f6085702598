"""MariaDB: a new grant under an API token reads its token's row and the clock in
one round trip.

A new exclusive tenure under a token locked the token's row (shared, or for
update near its quota) in one statement, then read the clock, the freeze, the
quota's count and a fence in the next: the round trip a token cost over no
token. ``lockkeeper_token_clock`` runs the same reads as statements of their
own on the server, in the same order (each starts once the one before it
returned, so the clock and the count still follow the token's row lock), and
counts the quota once (the clock's statement counted it twice). A new
procedure: nothing else changes.

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-07
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None
# A new procedure that only this code calls; older code runs as before.
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "mariadb":
        return
    install("0039", "lockkeeper_token_clock")


def downgrade():
    if routine_dialect() != "mariadb":
        return
    op.execute("DROP PROCEDURE IF EXISTS lockkeeper_token_clock")
