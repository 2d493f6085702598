"""The SQL forms of the lock list's orders and filters, on every dialect.

The list is read in the database, a page at a time with a keyset cursor, so
each order here is a tuple of SQL expressions ending in the unique resource and
each has a Python twin that computes a cursor's position from a row's values.

- **Natural order** of names: ``job:4100`` before ``job:20001``. A name is its
  head (everything up to its trailing digits) and the count of those digits;
  ordering by (head, digit count, name) puts the trailing numbers of one head in
  numeric order (equal lengths compare as text do as numbers).
- **Contended**: a lock with a live waiter in line.
- **Prefixes**: a name's next prefix below a searched one, to group by.
- **Waiters**: how many live waiters each waited-for resource has, from one
  grouped read of the line (the service merges those few locks with the rest,
  read in resource order).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, literal, null, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Integer, String

from app.locks.statements.common import locks, waiters

DIGITS = "0123456789"


class _NameHead(FunctionElement[str]):
    """A name without its trailing digits (``job:4100`` -> ``job:``)."""

    type = String()
    inherit_cache = True
    name = "lockkeeper_name_head"


@compiles(_NameHead)
def _head_rtrim(element, compiler, **kw):
    # SQLite and PostgreSQL: rtrim(text, characters) strips any of them.
    (argument,) = element.clauses
    return f"rtrim({compiler.process(argument, **kw)}, '{DIGITS}')"


@compiles(_NameHead, "mysql")
@compiles(_NameHead, "mariadb")
def _head_regexp(element, compiler, **kw):
    # MariaDB's RTRIM takes no character set; its regexp does.
    (argument,) = element.clauses
    return f"regexp_replace({compiler.process(argument, **kw)}, '[0-9]+$', '')"


class _Position(FunctionElement[int]):
    """Where ``needle`` first occurs in ``text``, from 1; 0 when it does not."""

    type = Integer()
    inherit_cache = True
    name = "lockkeeper_position"


@compiles(_Position)
def _position_instr(element, compiler, **kw):
    text, needle = element.clauses
    return f"instr({compiler.process(text, **kw)}, {compiler.process(needle, **kw)})"


@compiles(_Position, "postgresql")
def _position_strpos(element, compiler, **kw):
    text, needle = element.clauses
    return f"strpos({compiler.process(text, **kw)}, {compiler.process(needle, **kw)})"


def next_prefix(under: str, resource=locks.c.resource, separator: str = ":"):
    """The name up to and including its first ``separator`` after ``under``
    (which it starts with), or NULL when none follows: ``job:`` for
    ``job:4100`` under ``""``, ``job:eu:`` for ``job:eu:7`` under ``job:``.
    Every name starting with such a prefix has it as its own, so a group of
    them is exactly what a prefix search for it lists."""
    rest = func.substr(resource, len(under) + 1)
    at = _Position(rest, literal(separator, String()))
    return case((at > 0, func.substr(resource, 1, len(under) + at)), else_=null())


def name_head(name: str) -> str:
    """The Python twin of the SQL head (digits are ASCII on every dialect)."""
    return name.rstrip(DIGITS)


def natural_order(resource=locks.c.resource) -> list[Any]:
    """(head, count of trailing digits, name): the natural order of names.

    The digit count is a difference of lengths, so it is the same whether a
    dialect counts characters or bytes (digits are one byte)."""
    head = _NameHead(resource)
    return [head, func.length(resource) - func.length(head), resource]


def natural_position(name: str) -> list[Any]:
    """The values of ``natural_order`` for ``name``, for a cursor."""
    head = name_head(name)
    return [head, len(name) - len(head), name]


def contended_resources(now):
    """The resources with a live waiter at ``now`` (an uncorrelated subquery,
    read once per statement)."""
    return (
        select(waiters.c.resource)
        .where(waiters.c.deadline > now)
        .group_by(waiters.c.resource)
    )


def waiter_counts(now):
    """(resource, waiting) of every resource with live waiters: a derived table
    to outer-join to the locks (a lock absent from it has none)."""
    return (
        select(waiters.c.resource, func.count().label("waiting"))
        .where(waiters.c.deadline > now)
        .group_by(waiters.c.resource)
        .subquery("waiting_counts")
    )


def owner_contains(text: str, owner=locks.c.owner):
    """Owners containing ``text``, ignoring case: the overview's search. Its
    one form, so the rows, the counts and the stale release all agree (even
    where a dialect's ``lower`` folds only ASCII, as SQLite's does)."""
    escaped = text.replace("/", "//").replace("%", "/%").replace("_", "/_")
    pattern = literal(f"%{escaped}%", String())
    return func.lower(owner).like(func.lower(pattern), escape="/")


def is_contended(now):
    return locks.c.resource.in_(contended_resources(now))
