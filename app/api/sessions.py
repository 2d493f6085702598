"""Sessions: create, heartbeat, read and end; call ``LockService.sessions``.

A session belongs to the token that created it: another token's session is
answered 404, as an unknown one is.
"""

from __future__ import annotations

from typing import Any

from flask import Response, g, jsonify

from app.api.blueprint import bp
from app.api.schemas import lock_to_json
from app.api.shapes import body, seconds
from app.locks.service import lock_service
from app.locks.sessions import Session
from app.timestamps import rfc3339


def session_to_json(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "owner": session.owner,
        "token": session.token,
        "ttl": session.ttl,
        "created_at": rfc3339(session.created_at),
        "expires_at": rfc3339(session.expires_at),
        "last_heartbeat": rfc3339(session.last_heartbeat),
        "ttl_remaining": round(session.ttl_remaining, 3),
        "locks": [lock_to_json(lock) for lock in session.locks],
    }


@bp.post("/sessions")
def create_session():
    fields = body()
    session = lock_service().sessions.create(
        fields["owner"], seconds(fields.get("ttl")), token=g.token.name
    )
    response = jsonify(session_to_json(session))
    response.status_code = 201
    response.headers["Location"] = f"{bp.url_prefix}/sessions/{session.id}"
    return response


@bp.get("/sessions/<session_id>")
def get_session(session_id: str):
    session = lock_service().sessions.get(session_id, token=g.token.name)
    return jsonify(session_to_json(session))


@bp.patch("/sessions/<session_id>")
def heartbeat_session(session_id: str):
    session = lock_service().sessions.heartbeat(session_id, token=g.token.name)
    return jsonify(session_to_json(session))


@bp.delete("/sessions/<session_id>")
def end_session(session_id: str):
    lock_service().sessions.end(session_id, token=g.token.name, actor=g.actor)
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response
