"""Pages of a listing: the limit, keyset cursors, and prefix filters.

Every list the service offers (locks, audit events) pages the same way: order by
a key that ends in a unique column, fetch ``limit + 1`` rows, and hand out the
last row's key as an opaque cursor; the next page starts strictly after it, so
ties never repeat or go missing. The API's request validation and the services
share ``page_limit_error``: there is one limit and one check of it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Boolean, Connection, Select, and_, false, func, literal, or_
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import String

T = TypeVar("T")

MAX_PAGE = 500
DEFAULT_PAGE = 50
BAD_CURSOR = "is not a cursor this service handed out"


def page_limit_error(limit: Any) -> str | None:
    """Why ``limit`` is not a page size, or None when it is one."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        return "must be an integer"
    if not 1 <= limit <= MAX_PAGE:
        return f"must be between 1 and {MAX_PAGE}"
    return None


def encode_cursor(position: dict[str, Any]) -> str:
    raw = json.dumps(position, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any]:
    """The position a cursor encodes; :raise ValueError: not one we handed out."""
    if not isinstance(cursor, str) or len(cursor) > 1024:
        raise ValueError("bad cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = json.loads(raw)
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError("bad cursor") from exc
    if not isinstance(position, dict):
        raise ValueError("bad cursor")
    return position


def read_cursor(cursor: str, read: Callable[[dict[str, Any]], T]) -> T:
    """``read`` applied to the cursor's position.

    A cursor is client input: ``read`` checks every value it takes (a number, a
    list or a NUL byte where a name belongs would reach the SQL as a bad bind)
    and raises ValueError, KeyError or TypeError on anything else.

    :raise ValueError: the cursor is not one this service handed out.
    """
    try:
        return read(decode_cursor(cursor))
    except (ValueError, KeyError, TypeError):
        raise ValueError(BAD_CURSOR) from None


def after(columns: Sequence[Any], values: Sequence[Any], *, descending: bool):
    """Rows strictly after ``values`` in the order of ``columns`` (the last one
    unique): (a, b) > (x, y) as ``a > x OR (a = x AND b > y)``, which every
    dialect plans as index ranges."""
    column, value = columns[0], values[0]
    beyond = column < value if descending else column > value
    if len(columns) == 1:
        return beyond
    rest = after(columns[1:], values[1:], descending=descending)
    return or_(beyond, and_(column == value, rest))


def fetch_page(
    conn: Connection,
    query: Select,
    limit: int,
    position_of: Callable[[Any], dict[str, Any]],
) -> tuple[list[Any], str | None]:
    """The first ``limit`` rows of ``query`` (already ordered and filtered), and
    the cursor of the page after them (None on the last page)."""
    rows = conn.execute(query.limit(limit + 1)).all()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(position_of(rows[-1]))


# -- filters every listing offers ---------------------------------------------


def starts_with(column, prefix: str, *, ranged: bool = True):
    """``column`` begins with ``prefix``, exactly.

    LIKE lets an index narrow the range; the substr comparison keeps the match
    case-exact, as resources are, where LIKE is not (SQLite). SQLite's LIKE
    ignores ASCII case, so it never narrows a (case-exact) index: there the
    names from ``prefix`` up to the next prefix (``_PrefixRange``) do.
    ``ranged=False`` leaves that range out, so SQLite reads no index by the
    name (the audit's newest-first page walks the ids past a common prefix).
    """
    matches = and_(
        column.startswith(prefix, autoescape=True),
        func.substr(column, 1, len(prefix)) == prefix,
    )
    if not ranged:
        return matches
    return and_(matches, _PrefixRange(column, *prefix_range_bounds(prefix)))


def prefix_range_bounds(prefix: str) -> tuple[Any, ...]:
    """(``prefix``, the first string after every string starting with it) in
    code point order, which is UTF-8's byte order (SQLite's BINARY collation);
    only ``prefix`` when no string follows them."""
    head = prefix.rstrip(chr(0x10FFFF))
    if not head:
        return (literal(prefix, String()),)
    following = ord(head[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # surrogates are no characters
        following = 0xE000
    after = head[:-1] + chr(following)
    return literal(prefix, String()), literal(after, String())


class _PrefixRange(FunctionElement[bool]):
    """SQLite: ``column`` between a prefix and the next one (an index range);
    elsewhere nothing (their LIKE narrows the index already; a range under a
    linguistic collation would not match LIKE's prefix exactly)."""

    type = Boolean()
    inherit_cache = True
    name = "lockkeeper_prefix_range"
    # A comparison, not a boolean value: without this SQLAlchemy writes
    # "(...) = 1" on databases without a native boolean (SQLite), which no
    # index can serve.
    _is_implicitly_boolean = True


@compiles(_PrefixRange)
def _no_range(element, compiler, **kw):
    return "1 = 1"


@compiles(_PrefixRange, "sqlite")
def _binary_range(element, compiler, **kw):
    column, low, *high = (compiler.process(c, **kw) for c in element.clauses)
    below = f" AND {column} < {high[0]}" if high else ""
    return f"({column} >= {low}{below})"


def within(column, prefixes: tuple[str, ...], *, ranged: bool = True):
    """``column`` begins with one of ``prefixes`` (none: nothing matches);
    ``ranged`` as ``starts_with``."""
    return or_(
        false(), *(starts_with(column, prefix, ranged=ranged) for prefix in prefixes)
    )
