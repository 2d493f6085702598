"""PostgreSQL: a take-over's event names the previous holder's token too.

A take-over recorded its previous owner (``previous_owner``) but not the token
that owner held it under, so the history could not tell which of one owner's
grants under two tokens (a semaphore's places, shared grants) a take-over
ended. Its ``details`` now carry ``previous_token`` ('' for a holder with no
token, as ``lock_holders`` records it), as the transaction path writes them
(``app.locks.statements.common.took_over_from``). Same signatures and answers
as 0018 (``lockkeeper_acquire``) and 0024 (``lockkeeper_acquire_place``):
replaced in place; only a take-over's event changes.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03
"""

import importlib

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_ACQUIRE = importlib.import_module(
    "app.migrations.versions.0018_reacquire_leaves_session_grants"
)
_ACQUIRE_PLACE = importlib.import_module(
    "app.migrations.versions.0024_demotion_leaves_session_grants"
)

# lockkeeper_acquire: the row's token comes down to the grant, which returns
# the event's details (a take-over's: the token it took from; else none).
_ACQUIRE_EDITS = (
    (
        "    SELECT prior.id, prior.owner,\n",
        "    SELECT prior.id, prior.owner, prior.token,\n",
    ),
    (
        "              decided.owner AS previous_owner,\n",
        "              decided.owner AS previous_owner,\n"
        "              CASE WHEN decided.owner IS NOT NULL AND NOT decided.valid\n"
        "                   THEN jsonb_build_object(\n"
        "                       'previous_token', COALESCE(decided.token, ''))::text\n"
        "              END AS details,\n",
    ),
    (
        "              CAST(NULL AS varchar) AS previous_owner, 'acquired' AS action\n",
        "              CAST(NULL AS varchar) AS previous_owner,\n"
        "              CAST(NULL AS text) AS details, 'acquired' AS action\n",
    ),
    (
        "                             acquired_at, expires_at, actor, occurred_at, mode)\n"
        "    SELECT g.resource, g.action, g.owner, g.previous_owner, g.token, g.fence,\n"
        "           g.acquired_at, g.expires_at, p_actor, clock.now, 'exclusive'\n",
        "                             acquired_at, expires_at, actor, occurred_at, mode,\n"
        "                             details)\n"
        "    SELECT g.resource, g.action, g.owner, g.previous_owner, g.token, g.fence,\n"
        "           g.acquired_at, g.expires_at, p_actor, clock.now, 'exclusive',\n"
        "           g.details\n",
    ),
)

# lockkeeper_acquire_place: the token of the grant taken over (the expired
# exclusive grant's, or the expired place's) beside its owner.
_ACQUIRE_PLACE_EDITS = (
    (
        "    previous varchar;\n",
        "    previous varchar;\n    previous_token varchar;\n",
    ),
    (
        "        previous := r.owner;  -- an expired exclusive grant taken over\n",
        "        previous := r.owner;  -- an expired exclusive grant taken over\n"
        "        previous_token := r.token;\n",
    ),
    (
        "        SELECT h.owner INTO previous FROM lock_holders AS h\n",
        "        SELECT h.owner, h.token INTO previous, previous_token\n"
        "        FROM lock_holders AS h\n",
    ),
    (
        "        RETURNING l.expires_at INTO expires_at;\n"
        "        previous := r.owner;\n"
        "        token := p_token;\n"
        "        mode := 'exclusive';\n"
        "        EXIT decision;\n",
        "        RETURNING l.expires_at INTO expires_at;\n"
        "        previous := r.owner;\n"
        "        previous_token := r.token;\n"
        "        token := p_token;\n"
        "        mode := 'exclusive';\n"
        "        EXIT decision;\n",
    ),
    (
        "IF done THEN\n    resource := p_resource;\n",
        "IF done THEN\n"
        "    IF action = 'took_over' AND previous IS NOT NULL THEN\n"
        "        v_details := jsonb_build_object(\n"
        "            'previous_token', COALESCE(previous_token, ''))::text;\n"
        "    END IF;\n"
        "    resource := p_resource;\n",
    ),
)


def _edited(text: str, edits, name: str) -> str:
    for before, after in edits:
        if text.count(before) != 1:
            raise RuntimeError(f"{name} is not the one expected: {before!r}")
        text = text.replace(before, after)
    return text


def acquire() -> str:
    return _edited(_ACQUIRE.ACQUIRE, _ACQUIRE_EDITS, "0018's lockkeeper_acquire")


def acquire_place() -> str:
    return _edited(
        _ACQUIRE_PLACE._acquire_place(),
        _ACQUIRE_PLACE_EDITS,
        "0024's lockkeeper_acquire_place",
    )


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(acquire())
    op.execute(acquire_place())


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_ACQUIRE.ACQUIRE)
    op.execute(_ACQUIRE_PLACE._acquire_place())
