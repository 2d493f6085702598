"""Freezes: while one lasts, no new grant of a resource under its prefix.

Freezing and unfreezing are each one transaction with their audit event; the
grant itself refuses a frozen resource (``ResourceFrozen``, decided by the
statements), so nothing here is on the worker's path.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update

from lockkeeper_core import rules, validation
from lockkeeper_core.core import LockCore
from lockkeeper_core.errors import InvalidInput, NotFrozen
from lockkeeper_core.results import Freeze
from lockkeeper_core.state import Action
from lockkeeper_core.statements.common import events, freezes

MAX_FREEZE = timedelta(days=366)


class Freezes:
    def __init__(self, core: LockCore) -> None:
        self.core = core

    def freeze(
        self,
        prefix: str,
        *,
        actor: str,
        reason: str | None,
        duration: timedelta | None = None,
    ) -> Freeze:
        """Stop new grants of every resource starting with ``prefix``, until
        unfrozen or, with ``duration``, until that much later by the deciding
        clock. Freezing a frozen prefix again replaces its reason and end."""
        core = self.core
        core.validate(actor=actor, reason=reason)
        errors = []
        if validation.resource_error(prefix):
            errors.append(("prefix", validation.resource_error(prefix)))
        if duration is not None and not (timedelta(0) < duration <= MAX_FREEZE):
            errors.append(("for", f"must be more than 0 and at most {MAX_FREEZE}"))
        if errors:
            raise InvalidInput(errors)
        rules.require_reason(reason, "to freeze")

        def work(conn) -> Freeze:
            existing = conn.execute(
                select(freezes.c.id).where(freezes.c.prefix == prefix).with_for_update()
            ).one_or_none()
            now = core.clock_in(conn)
            ends_at = now + duration if duration is not None else None
            values = {
                "reason": reason,
                "actor": actor,
                "frozen_at": now,
                "ends_at": ends_at,
            }
            if existing is None:
                conn.execute(insert(freezes).values(prefix=prefix, **values))
            else:
                conn.execute(
                    update(freezes).where(freezes.c.id == existing.id).values(**values)
                )
            _log_freeze(conn, Action.FROZEN, prefix, actor, reason, now, ends_at)
            return Freeze(prefix, reason, actor, now, ends_at)

        return core.run(work)

    def unfreeze(self, prefix: str, *, actor: str, reason: str | None) -> Freeze:
        """End the freeze of ``prefix`` now; returns it as it was.

        :raise NotFrozen: no freeze of ``prefix`` is in force.
        """
        core = self.core
        core.validate(actor=actor, reason=reason)
        if validation.resource_error(prefix):
            raise InvalidInput([("prefix", validation.resource_error(prefix))])
        rules.require_reason(reason, "to unfreeze")

        def work(conn) -> Freeze:
            row = conn.execute(
                select(freezes).where(freezes.c.prefix == prefix).with_for_update()
            ).one_or_none()
            now = core.clock_in(conn)
            if row is None or (row.ends_at is not None and row.ends_at <= now):
                raise NotFrozen(prefix)
            conn.execute(delete(freezes).where(freezes.c.id == row.id))
            _log_freeze(conn, Action.UNFROZEN, prefix, actor, reason, now, now)
            return Freeze.from_row(row)

        return core.run(work)

    def list_freezes(
        self, *, scope: tuple[str, ...] | None = None, at: datetime | None = None
    ) -> list[Freeze]:
        """The freezes in force now (``at``: the instant a page judges
        everything at, read once for it), by prefix; ``scope``: the asking
        token's prefixes, and only the freezes that cover one of its resources
        (a freeze inside the scope, or one over all of a scope prefix, which
        its acquires would be refused with anyway)."""
        now = self.core.read_at(at)
        query = (
            select(freezes)
            .where(freezes.c.ends_at.is_(None) | (freezes.c.ends_at > now))
            .order_by(freezes.c.prefix)
        )
        with self.core.reads.connect() as conn:
            found = [Freeze.from_row(row) for row in conn.execute(query)]
        if scope is None:
            return found
        return [
            freeze
            for freeze in found
            if any(
                freeze.prefix.startswith(mine) or mine.startswith(freeze.prefix)
                for mine in scope
            )
        ]

    def freezes_over(self, resource: str) -> list[Freeze]:
        """The freezes in force now whose prefix ``resource`` starts with."""
        return [f for f in self.list_freezes() if resource.startswith(f.prefix)]


def _log_freeze(conn, action, prefix, actor, reason, now, ends_at) -> None:
    conn.execute(
        insert(events).values(
            resource=prefix,
            action=action.value,
            expires_at=ends_at,
            actor=actor,
            reason=reason,
            occurred_at=now,
        )
    )
