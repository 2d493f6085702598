"""The operator dashboard: overview, lock pages, audit, force-release and claim.

``blueprint`` holds the blueprint and the template filters; the page modules attach
to it. The audit pages are a blueprint of their own (``audit``).
"""

from app.dashboard import operator, sets, views
from app.dashboard.blueprint import bp

__all__ = ["bp", "operator", "sets", "views"]
