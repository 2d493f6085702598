"""The JSON API for workers, at ``/api/v1``.

``blueprint`` holds the blueprint and the bearer-token guard; the route modules
attach to it.
"""

from app.api import events, locks, openapi, sessions, sets
from app.api.blueprint import bp

__all__ = ["bp", "events", "locks", "openapi", "sessions", "sets"]
