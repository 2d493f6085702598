"""The bench-only WSGI app serving the HTTP baselines (never part of ``app/``).

``gunicorn 'bench.baseline_app:create_app()'`` with ``BENCH_DATABASE_URL`` (and
``BENCH_REDIS_URL`` for the Redis lock). Every lock route has the shape of
Lockkeeper's: ``POST /<design>/locks/<resource>`` with ``{"owner", "ttl"}`` answers
200 ``{"acquired": true, "lock": {...}}`` or 409; ``DELETE`` with ``{"owner"}``
answers 204 or 404. Nothing else: no auth, validation, audit or ORM.

- ``GET|POST /floor``: no database, a small JSON reply (the server's own cost).
- ``/ideal/...``: the best atomic statement through the driver.
- ``/seed/...``: the seed's SELECT, INSERT-or-UPDATE, SELECT (PostgreSQL).
- ``/redis/...``: ``SET NX PX`` and a compare-and-delete script.
"""

from __future__ import annotations

import os
import threading

from flask import Flask, jsonify, request

# Compare-and-delete: only the owner's value may remove the key.
_REDIS_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


# Re-acquire by the same owner: extend only if the value is still ours.
_REDIS_REACQUIRE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""


def _lock_json(row) -> dict:
    resource, owner, fence, acquired_at, expires_at = row[:5]
    return {
        "resource": resource,
        "owner": owner,
        "fence": fence,
        "acquired_at": str(acquired_at),
        "expires_at": str(expires_at),
    }


def create_app() -> Flask:
    from bench.driver_sql import connect, driver_for

    app = Flask(__name__)
    url = os.environ.get("BENCH_DATABASE_URL")
    driver = driver_for(url) if url else None
    local = threading.local()  # one driver connection per worker thread

    def conn():
        if getattr(local, "conn", None) is None:
            local.conn = connect(url)
        return local.conn

    redis_client = None
    redis_release = redis_reacquire = None
    if os.environ.get("BENCH_REDIS_URL"):
        import redis

        redis_client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        redis_release = redis_client.register_script(_REDIS_RELEASE)
        redis_reacquire = redis_client.register_script(_REDIS_REACQUIRE)

    @app.route("/floor", methods=["GET", "POST", "DELETE"])
    def floor():
        return jsonify({"ok": True})

    def acquire_reply(row):
        if row is None:
            return jsonify({"acquired": False, "lock": None}), 409
        return jsonify({"acquired": True, "lock": _lock_json(row)})

    def body():
        data = request.get_json(silent=True) or {}
        return data.get("owner") or request.args.get("owner"), data.get("ttl", 30)

    @app.post("/ideal/locks/<resource>")
    def ideal_acquire(resource):
        owner, ttl = body()
        return acquire_reply(driver.ideal_acquire(conn(), resource, owner, ttl))

    @app.delete("/ideal/locks/<resource>")
    def ideal_release(resource):
        owner, _ = body()
        return ("", 204) if driver.ideal_release(conn(), resource, owner) else ("", 404)

    @app.post("/seed/locks/<resource>")
    def seed_acquire(resource):
        owner, ttl = body()
        return acquire_reply(driver.seed_acquire(conn(), resource, owner, ttl))

    @app.delete("/seed/locks/<resource>")
    def seed_release(resource):
        owner, _ = body()
        return ("", 204) if driver.seed_release(conn(), resource, owner) else ("", 404)

    @app.post("/redis/locks/<resource>")
    def redis_acquire(resource):
        owner, ttl = body()
        key = f"lock:{resource}"
        ttl_ms = int(ttl * 1000)
        if redis_client.set(key, owner, nx=True, px=ttl_ms):
            return acquire_reply((resource, owner, None, None, None))
        # A same-owner re-acquire is granted, as by the database designs.
        if redis_reacquire(keys=[key], args=[owner, ttl_ms]):
            return acquire_reply((resource, owner, None, None, None))
        return acquire_reply(None)

    @app.delete("/redis/locks/<resource>")
    def redis_release_route(resource):
        owner, _ = body()
        released = redis_release(keys=[f"lock:{resource}"], args=[owner])
        return ("", 204) if released else ("", 404)

    return app
