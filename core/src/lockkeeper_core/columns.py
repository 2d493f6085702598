"""Column types shared by every table: the lock core's and the app's."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, DateTime, Integer, String
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeDecorator

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BigIntId = BigInteger().with_variant(Integer, "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A UTC instant: ``timestamptz`` on PostgreSQL, naive-UTC elsewhere.

    MySQL/MariaDB need ``DATETIME(6)`` or they drop the microseconds; SQLite stores
    ISO text, which orders correctly only if every value is naive UTC of one format.
    Values always come back timezone-aware in UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC instant")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if isinstance(value, str):  # raw text from SQLite through text() queries
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class ExactString(TypeDecorator[str]):
    """A string compared byte for byte on every database.

    MariaDB/MySQL compare case-insensitively by default (``Job:1`` and ``job:1``
    would be one lock), and their ``_bin`` collations still ignore trailing spaces
    (owner ``w-1 `` would pass for ``w-1``): use the binary NO PAD collation.
    """

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in ("mysql", "mariadb"):
            is_mariadb = dialect.name == "mariadb" or getattr(
                dialect, "is_mariadb", False
            )
            collation = "utf8mb4_nopad_bin" if is_mariadb else "utf8mb4_0900_bin"
            return dialect.type_descriptor(
                mysql.VARCHAR(self.length, charset="utf8mb4", collation=collation)
            )
        return dialect.type_descriptor(String(self.length))


def name_column(length: int = 255) -> ExactString:
    return ExactString(length)


# Every table: InnoDB and utf8mb4 on MariaDB/MySQL (the server default may be latin1).
MYSQL_TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
