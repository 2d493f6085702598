"""MariaDB: a new grant under an API token counts the token's live grants once.

``lockkeeper_token_clock`` (0039) counted them twice per grant: a first look
before the token's row lock, only to pick whether that lock is shared, then
the quota's count after it. A count walks the token's index entries that its
grants and releases moved and purge has not removed yet, each checked against
its row, so one token's workers paid for each other's churn, twice.
``lockkeeper_token_grant`` takes the same steps less the first look: the
caller says whether to lock the row shared (far from the quota, as the last
grant of the token in its process found it), and the answer says whether the
next grant should take the row alone. The count after the lock decides the
quota as before. A new procedure that only this code calls;
``lockkeeper_token_clock`` stays for older code: additive.

Revision ID: 0044
Revises: 0043
Create Date: 2026-12-07
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None
# A new procedure that only this code calls; older code runs as before.
oldest_code = "0016"


def upgrade():
    if routine_dialect() != "mariadb":
        return
    install("0044", "lockkeeper_token_grant")


def downgrade():
    if routine_dialect() != "mariadb":
        return
    op.execute("DROP PROCEDURE IF EXISTS lockkeeper_token_grant")
