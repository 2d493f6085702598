"""Operators (dashboard sessions) and API tokens (workers)."""
