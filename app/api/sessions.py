"""Sessions: create, heartbeat, read and end; call ``LockService.sessions``.

A session belongs to the token that created it: another token's session is
answered 404, as an unknown one is.
"""

from __future__ import annotations

from flask import Response, g, jsonify
from lockkeeper_core.wire import session_to_json

from app.api.blueprint import bp
from app.api.shapes import body, seconds
from app.extensions import lock_service


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
