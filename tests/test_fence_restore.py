"""A restore without the fence jump: the database's fence sequence is below the
fences its lock rows hold. A server's start moves the sequence past them and
says so, so no fence is handed out twice."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from app.extensions import lock_service
from app.ops.fences import FENCE_JUMP, next_fence

pytestmark = pytest.mark.usefixtures("backend")


def rewind_fence_sequence(url: str) -> None:
    """What restoring a backup taken before these grants does to the sequence."""
    engine = create_engine(normalize_database_url(url))
    try:
        with engine.begin() as conn:
            dialect = conn.dialect.name
            if dialect == "postgresql":
                conn.execute(text("SELECT setval('lock_fence_seq', 1, false)"))
            elif dialect == "mariadb":
                conn.execute(text("ALTER SEQUENCE lock_fence_seq RESTART WITH 1"))
            else:
                conn.execute(text("UPDATE lock_fence_counter SET value = 0"))
    finally:
        engine.dispose()


def test_a_start_moves_a_rewound_fence_sequence_past_the_fences_held(
    make_app, database_url, caplog
):
    app = make_app()
    with app.app_context():
        service = lock_service()
        held = service.acquire("restored:1", "w1", ttl=300).lock.fence
        holder = service.acquire("restored:sem", "w1", ttl=300, limit=3).lock.fence
    highest = max(held, holder)
    rewind_fence_sequence(database_url)

    with caplog.at_level(logging.WARNING, logger="app"):
        restarted = make_app()
    warnings = [r.getMessage() for r in caplog.records if "fence sequence" in r.message]
    assert len(warnings) == 1, warnings
    assert f"highest fence held ({highest})" in warnings[0]
    assert f"moved the sequence to {highest + FENCE_JUMP}" in warnings[0]
    with restarted.app_context():
        granted = lock_service().acquire("restored:2", "w2", ttl=30).lock.fence
    assert granted > highest
    assert granted >= highest + FENCE_JUMP

    # Ahead of the fences held: the next start leaves it alone, silently.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app"):
        again = make_app()
    assert not [r for r in caplog.records if "fence sequence" in r.message]
    with again.app_context():
        from app.extensions import db

        with db.engine.connect() as conn:
            assert next_fence(conn) > granted
