"""MariaDB: the fence sequence steps by ``INCREMENT BY 0``, so it runs on Galera.

Revision 0001 created ``lock_fence_seq`` with MariaDB's defaults (``INCREMENT
BY 1``, a cache of 1000), which a Galera cluster refuses (error 1235: "CACHE
without INCREMENT BY 0 in Galera cluster"): the schema could not be installed
there. ``INCREMENT BY 0`` steps by the server's ``auto_increment_increment``
from its ``auto_increment_offset``: 1 and 1 on one server, the same values as
before; on Galera each node's own offset in steps of the cluster's size, so
two nodes never draw the same value. 0001 now creates it so; this revision
alters a sequence created before.

``ALTER SEQUENCE`` without ``RESTART`` keeps the sequence's next value: the
next draw is the first value the sequence had not yet handed out to a cache,
so no fence is drawn twice (the values a server had cached are skipped, as a
restart of the server skips them). The fences of one resource still increase
whichever node grants: a new tenure's fence is raised above the fence of the
grant it replaces (``lockkeeper_core.statements.transaction``). (A node draws
from its own cache, which other nodes' draws do not move: with several writing
nodes a grant after a purge can draw below the purged row's fence; one writing
node is what docs/deploy.md supports.)

The server refuses to start on a Galera node whose fence sequence has a cache
and another increment (``app.ops.galera``).

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None
# Nothing the code reads changes: any code that ran on 0033 draws fences the same.
oldest_code = "0016"


def _mariadb() -> bool:
    dialect = op.get_bind().dialect
    return dialect.name == "mariadb" or getattr(dialect, "is_mariadb", False)


def upgrade():
    if _mariadb():
        op.execute("ALTER SEQUENCE lock_fence_seq INCREMENT BY 0")


def downgrade():
    # INCREMENT BY 0 is what 0001 creates now: the sequence stays as it is
    # (INCREMENT BY 1 with a cache cannot exist on Galera).
    pass
