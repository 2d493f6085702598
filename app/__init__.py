"""Lockkeeper: named locks with owner tokens, TTLs and fencing tokens.

Importing a part of the package (the worker client, say) must not import the web
stack, so ``create_app`` is looked up from ``app.factory`` only when asked for:
``app:create_app()`` for gunicorn and ``--app app`` for flask both still work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.factory import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from app.factory import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
