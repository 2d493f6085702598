"""What a list of locks, its counts and the operator's stale release select: the
sources of entries, their filters, and the filters' checks (client input).

Shared by ``lists``, ``counts`` and ``operator``; it holds no state and reads
nothing itself.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, func, literal

from lockkeeper_core import validation
from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.pagination import starts_with, within
from lockkeeper_core.state import LockState, state_condition
from lockkeeper_core.statements import listing
from lockkeeper_core.statements.common import locks

# What one entry of a lock list is (``SOURCES``).
ENTRIES_EXCLUSIVE = "exclusive"
ENTRIES_GRANTS = "grants"
ENTRIES_RESOURCES = "resources"

# The grant sources (``listing.GRANT_COLUMNS``) a list of each kind of entries
# reads: ``exclusive`` the exclusive grants only (what a whole-lock operator
# action takes); ``grants`` every holder and shared grant as an entry of its own
# too; ``resources`` a resource held by holders as one entry, its grant that
# ends first. A statement reading them binds ``listing.LISTED_AT``, the instant
# whose live holders they are. Built once.
SOURCES = {
    ENTRIES_EXCLUSIVE: [listing.EXCLUSIVE_SOURCE],
    ENTRIES_GRANTS: [listing.EXCLUSIVE_SOURCE, listing.HOLDER_GRANTS_SOURCE],
    ENTRIES_RESOURCES: [listing.EXCLUSIVE_SOURCE, listing.HOLDER_HELD_SOURCE],
}


def state_of(
    state: LockState | None,
    now: datetime,
    expiring_within: float,
    grant=locks.c,
):
    """The condition of ``state`` at ``now`` on the entries of ``grant`` (a
    source's columns, ``listing.GRANT_COLUMNS``), each judged against its own
    ttl (``listing.granted_ttl``); None: any."""
    if state is None:
        return None
    return state_condition(
        state, grant.expires_at, now, expiring_within, listing.granted_ttl(grant)
    )


def state_counts(now: datetime, expiring_within: float, grant=locks.c) -> list:
    """One ``count`` column per state, labelled by its name."""
    return [
        func.count(case((state_of(state, now, expiring_within, grant), 1))).label(
            state.value
        )
        for state in LockState
    ]


def filtered(
    query,
    source,
    now: datetime,
    expiring_within: float,
    *,
    state: LockState | None = None,
    prefix: str | None = None,
    owner: str | None = None,
    owner_contains: str | None = None,
    scope: tuple[str, ...] | None = None,
    contended: bool = False,
):
    """``query`` narrowed to the entries of ``source`` a list's filters
    select."""
    resource = source.c.resource
    condition = state_of(state, now, expiring_within, source.c)
    if condition is not None:
        query = query.where(condition)
    if prefix:
        query = query.where(starts_with(resource, prefix))
    if scope is not None:
        query = query.where(within(resource, scope))
    at = literal(now, UTCDateTime())
    if owner is not None:
        query = query.where(
            listing.held_by_owner(source, lambda column: column == owner, at)
        )
    if owner_contains:
        query = query.where(
            listing.held_by_owner(
                source,
                lambda column: listing.owner_contains(owner_contains, column),
                at,
            )
        )
    if contended:
        query = query.where(listing.is_contended(at, resource))
    return query


def filter_error(text: str | None) -> str | None:
    """What is wrong with a list filter's text (a prefix, part of an owner)."""
    if text is not None and (
        len(text) > validation.MAX_NAME or validation.has_control_characters(text)
    ):
        return "must be at most 255 printable characters"
    return None


def validate_filters(
    prefix: str | None, owner: str | None, owner_contains: str | None = None
) -> None:
    errors = []
    if filter_error(prefix):
        errors.append(("prefix", filter_error(prefix)))
    if filter_error(owner_contains):
        errors.append(("owner", filter_error(owner_contains)))
    if owner is not None and validation.name_error(owner):
        errors.append(("owner", validation.name_error(owner)))
    if errors:
        raise InvalidInput(errors)


def list_filters(
    state: LockState | str | None,
    prefix: str | None,
    owner: str | None,
    owner_contains: str | None,
) -> tuple[LockState | None, list[tuple[str, str]]]:
    """The state a list asks for, and what is wrong with its filters."""
    errors = []
    if filter_error(owner_contains):
        errors.append(("owner", filter_error(owner_contains)))
    chosen = None
    if state not in (None, "all"):
        try:
            chosen = LockState(state)
        except ValueError:
            errors.append(("state", "must be one of held, expiring, stale, all"))
    if prefix is not None and (
        len(prefix) > validation.MAX_NAME or validation.has_control_characters(prefix)
    ):
        errors.append(("prefix", "must be at most 255 printable characters"))
    if owner is not None and validation.name_error(owner):
        errors.append(("owner", validation.name_error(owner)))
    return chosen, errors
