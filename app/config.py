"""Configuration: defaults < instance/config.py < LOCKKEEPER_* env < test map."""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask
from sqlalchemy.engine import make_url

from app.paths import make_private_dir, restrict_to_owner

DEFAULTS: dict[str, Any] = {
    "LOCKKEEPER_DEFAULT_TTL": 30.0,
    "LOCKKEEPER_MAX_TTL": 86400.0,
    "LOCKKEEPER_EXPIRING_WITHIN": 15.0,
    # Statements that lose a deadlock (MariaDB 1213) or a serialization race are
    # retried by the service this many times before the caller sees a 503.
    "LOCKKEEPER_DEADLOCK_RETRIES": 5,
    # Acquires may wait in line ("wait" seconds) up to this long.
    "LOCKKEEPER_MAX_WAIT": 30.0,
    # Waiting acquires one server worker holds at once (each holds a thread);
    # past it a waiting acquire is answered 503 and the client polls instead.
    "LOCKKEEPER_MAX_WAITERS": 16,
    # How many of those holders one API token may hold at once, so one token
    # sending without pause cannot turn every other token's wait into a 503.
    "LOCKKEEPER_MAX_WAITERS_PER_TOKEN": 8,
    # SQLite/MariaDB: how often a waiting acquire looks whether its turn has come
    # (PostgreSQL is woken by NOTIFY instead).
    "LOCKKEEPER_WAIT_POLL_INTERVAL": 0.05,
    # Event streams (GET /api/v1/events?follow=true) one server worker holds open
    # at once, each on a thread of its own; past it a stream is answered 503.
    "LOCKKEEPER_MAX_STREAMS": 8,
    # How many of those one API token may hold at once, so one token (even a
    # read-only one) cannot take every stream and 503 everyone else's watch().
    "LOCKKEEPER_MAX_STREAMS_PER_TOKEN": 4,
    # Live sessions (POST /api/v1/sessions) one API token may have at once, in
    # the whole database; past it a new one is answered 429. A session holds any
    # number of locks, so a worker needs one; 0: no limit.
    "LOCKKEEPER_MAX_SESSIONS_PER_TOKEN": 100,
    # How many resources one set (POST /api/v1/sets) may name; past it a 400.
    "LOCKKEEPER_MAX_SET_SIZE": 16,
    # A stream sends a comment at least this often, so proxies keep it open.
    "LOCKKEEPER_STREAM_KEEPALIVE": 15.0,
    # How often a stream looks for new events (PostgreSQL: also woken by NOTIFY).
    "LOCKKEEPER_STREAM_POLL_INTERVAL": 0.1,
    # A stream ends after this many seconds (its client reconnects and resumes);
    # 0: it lasts as long as its client stays.
    "LOCKKEEPER_STREAM_MAX_SECONDS": 0.0,
    "LOCKKEEPER_REFUSALS_FLUSH_SECONDS": 5.0,
    "LOCKKEEPER_LOGIN_MAX_FAILURES": 5,
    "LOCKKEEPER_LOGIN_LOCKOUT_SECONDS": 300,
    "LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS": 20,
    "LOCKKEEPER_LOGIN_ADDRESS_WINDOW_SECONDS": 60,
    "LOCKKEEPER_SESSION_HOURS": 12.0,
    # Reverse proxies in front of the app whose X-Forwarded-For/-Proto to trust
    # (werkzeug's ProxyFix); 0: the socket's peer is the client.
    "LOCKKEEPER_PROXY_COUNT": 0,
    "LOCKKEEPER_BOOTSTRAP": True,
    # The lock quota a new API token gets unless `tokens create --max-locks` says
    # otherwise; 0: no limit.
    "LOCKKEEPER_MAX_LOCKS_PER_TOKEN": 10000,
    # A worker trusts a token it looked up for this long: a revoked token keeps
    # working in other workers for at most this many seconds; 0: look up every call.
    "LOCKKEEPER_TOKEN_CACHE_SECONDS": 2.0,
    # The PostgreSQL URL points at PgBouncer in transaction pooling: psycopg must
    # not prepare statements (a later transaction may run on another server
    # connection, where the prepared statement does not exist).
    "LOCKKEEPER_PGBOUNCER": False,
    # MariaDB/MySQL: seconds a statement's answer may take before the service
    # gives up on its connection (PyMySQL's read_timeout); 0: wait forever.
    "LOCKKEEPER_DATABASE_READ_TIMEOUT": 60.0,
    # Resource prefixes whose hold times and lost locks /metrics counts apart
    # (comma-separated, at most 50); every other resource is "other".
    "LOCKKEEPER_METRICS_PREFIXES": "",
    "MAX_CONTENT_LENGTH": 64 * 1024,
    # The dashboard's cookie is Secure: "auto" when the request came over https
    # (the proxy's X-Forwarded-Proto, with LOCKKEEPER_PROXY_COUNT), or always
    # ("true") or never ("false").
    "LOCKKEEPER_SESSION_COOKIE_SECURE": "auto",
    "SESSION_COOKIE_HTTPONLY": True,
    "SESSION_COOKIE_SAMESITE": "Lax",
    # A dashboard tab polls for hours; a time-limited CSRF token would fail its first
    # click. The token still dies with the session.
    "WTF_CSRF_TIME_LIMIT": None,
    # No pre-ping: it would add a round trip to every checkout (~60 µs measured).
    # Each pool instead polls a connection's socket as it hands it out (~3 µs,
    # app/database.py) and replaces one the server or PgBouncer closed; one that
    # dies in use is invalidated with its pool and the service retries once.
    "SQLALCHEMY_ENGINE_OPTIONS": {},
}


def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _boolean_or_auto(raw: str) -> bool | str:
    return "auto" if raw.strip().lower() == "auto" else _boolean(raw)


# Environment variables read as numbers or switches; the others are strings.
_PARSED = {
    "LOCKKEEPER_DEFAULT_TTL": float,
    "LOCKKEEPER_MAX_TTL": float,
    "LOCKKEEPER_EXPIRING_WITHIN": float,
    "LOCKKEEPER_DEADLOCK_RETRIES": int,
    "LOCKKEEPER_MAX_WAIT": float,
    "LOCKKEEPER_MAX_WAITERS": int,
    "LOCKKEEPER_MAX_WAITERS_PER_TOKEN": int,
    "LOCKKEEPER_WAIT_POLL_INTERVAL": float,
    "LOCKKEEPER_MAX_STREAMS": int,
    "LOCKKEEPER_MAX_STREAMS_PER_TOKEN": int,
    "LOCKKEEPER_MAX_SESSIONS_PER_TOKEN": int,
    "LOCKKEEPER_MAX_SET_SIZE": int,
    "LOCKKEEPER_STREAM_KEEPALIVE": float,
    "LOCKKEEPER_STREAM_POLL_INTERVAL": float,
    "LOCKKEEPER_STREAM_MAX_SECONDS": float,
    "LOCKKEEPER_REFUSALS_FLUSH_SECONDS": float,
    "LOCKKEEPER_LOGIN_MAX_FAILURES": int,
    "LOCKKEEPER_LOGIN_LOCKOUT_SECONDS": int,
    "LOCKKEEPER_MAX_LOCKS_PER_TOKEN": int,
    "LOCKKEEPER_TOKEN_CACHE_SECONDS": float,
    "LOCKKEEPER_PGBOUNCER": _boolean,
    "LOCKKEEPER_DATABASE_READ_TIMEOUT": float,
    "LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS": int,
    "LOCKKEEPER_LOGIN_ADDRESS_WINDOW_SECONDS": float,
    "LOCKKEEPER_SESSION_HOURS": float,
    "LOCKKEEPER_PROXY_COUNT": int,
    # Off: no admin and token are created (and printed) on a first start.
    "LOCKKEEPER_BOOTSTRAP": _boolean,
    "LOCKKEEPER_AUTO_MIGRATE": _boolean,
    "LOCKKEEPER_SESSION_COOKIE_SECURE": _boolean_or_auto,
}
_ENV_KEYS = (
    "LOCKKEEPER_DATABASE_URL",
    "LOCKKEEPER_SECRET_KEY",
    # PostgreSQL's LISTEN connection for waiting acquires, when the database URL
    # goes through a transaction-pooling PgBouncer (default: the database URL).
    "LOCKKEEPER_LISTEN_DATABASE_URL",
    "LOCKKEEPER_METRICS_PREFIXES",
    *_PARSED,
)

_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}


# Prefix families of the metrics (LOCKKEEPER_METRICS_PREFIXES): a bounded list.
MAX_PREFIX_FAMILIES = 50
OTHER_FAMILY = "other"


def prefix_families(raw: str) -> tuple[str, ...]:
    """``LOCKKEEPER_METRICS_PREFIXES`` read: comma-separated prefixes, bounded.

    :raise ValueError: too many, too long, or one given twice.
    """
    families = tuple(p.strip() for p in raw.split(",") if p.strip())
    if len(families) > MAX_PREFIX_FAMILIES:
        raise ValueError(f"at most {MAX_PREFIX_FAMILIES} prefixes")
    if len(set(families)) != len(families):
        raise ValueError("a prefix is listed twice")
    if OTHER_FAMILY in families or any(len(p) > 64 for p in families):
        raise ValueError(f"prefixes are 1 to 64 characters, and not {OTHER_FAMILY!r}")
    return families


class ConfigError(ValueError):
    """The configuration cannot run the service; the message names the setting."""


def normalize_database_url(url: str) -> str:
    """Give plain postgresql://, mysql:// and mariadb:// URLs the drivers we ship."""
    parsed = make_url(url)
    if parsed.drivername in _DRIVERS:
        parsed = parsed.set(drivername=_DRIVERS[parsed.drivername])
    return parsed.render_as_string(hide_password=False)


#: Where the database URL came from, for the CLI to say (``database_source``).
DEFAULT_DATABASE = "the default: no LOCKKEEPER_DATABASE_URL is set"


def database_source(app: Flask) -> str:
    return app.extensions.get("lockkeeper.database_source", DEFAULT_DATABASE)


def load_config(
    app: Flask, test_config: Mapping[str, Any] | None, *, serving: bool = True
) -> None:
    """``serving``: the app is built to serve (not for a command of the CLI),
    so a missing secret key is created in the instance folder."""
    app.config.from_mapping(DEFAULTS)
    source = DEFAULT_DATABASE
    instance_file = Path(app.instance_path) / "config.py"
    app.config.from_pyfile("config.py", silent=True)
    if app.config.get("LOCKKEEPER_DATABASE_URL"):
        source = str(instance_file)
    if os.environ.get("LOCKKEEPER_DATABASE_URL"):
        source = "LOCKKEEPER_DATABASE_URL"
    if test_config is not None and test_config.get("LOCKKEEPER_DATABASE_URL"):
        source = "the test configuration"
    app.extensions["lockkeeper.database_source"] = source
    for key in _ENV_KEYS:
        if key in os.environ:
            raw = os.environ[key]
            try:
                app.config[key] = _PARSED[key](raw) if key in _PARSED else raw
            except ValueError as exc:
                raise ConfigError(f"{key}={raw!r} cannot be read") from exc
    if test_config is not None:
        app.config.from_mapping(test_config)

    instance = Path(app.instance_path)
    url = app.config.get("LOCKKEEPER_DATABASE_URL") or (
        f"sqlite:///{instance / 'lockkeeper.sqlite3'}"
    )
    app.config["LOCKKEEPER_DATABASE_URL"] = normalize_database_url(url)
    app.config["SQLALCHEMY_DATABASE_URI"] = app.config["LOCKKEEPER_DATABASE_URL"]
    _validate(app.config)
    if not app.config.get("SECRET_KEY"):
        key = app.config.get("LOCKKEEPER_SECRET_KEY")
        if not key and serving:
            key = load_or_create_secret_key(instance)
        elif not key:
            key = existing_secret_key(instance)
            if key is None:
                # No command signs anything that outlives it: a key of this
                # process alone, never written (`lockkeeper --help` leaves no
                # file); a server's start writes the instance's (keep_secret_key).
                key = secrets.token_hex(32)
                app.extensions[_PROCESS_KEY] = key
        app.config["SECRET_KEY"] = key


def _validate(config: Mapping[str, Any]) -> None:
    max_ttl = config["LOCKKEEPER_MAX_TTL"]
    default_ttl = config["LOCKKEEPER_DEFAULT_TTL"]
    window = config["LOCKKEEPER_EXPIRING_WITHIN"]
    for key, value in (
        ("LOCKKEEPER_MAX_TTL", max_ttl),
        ("LOCKKEEPER_DEFAULT_TTL", default_ttl),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{key} must be a positive number, not {value!r}")
    if default_ttl > max_ttl:
        raise ConfigError("LOCKKEEPER_DEFAULT_TTL must not exceed LOCKKEEPER_MAX_TTL")
    if int(config["LOCKKEEPER_MAX_LOCKS_PER_TOKEN"]) < 0:
        raise ConfigError("LOCKKEEPER_MAX_LOCKS_PER_TOKEN must be 0 (no limit) or more")
    cache = config["LOCKKEEPER_TOKEN_CACHE_SECONDS"]
    if not (math.isfinite(cache) and 0 <= cache <= 60):
        raise ConfigError("LOCKKEEPER_TOKEN_CACHE_SECONDS must be 0 to 60 seconds")
    max_wait = config["LOCKKEEPER_MAX_WAIT"]
    if not (math.isfinite(max_wait) and max_wait >= 0):
        raise ConfigError("LOCKKEEPER_MAX_WAIT must be zero or more seconds")
    if int(config["LOCKKEEPER_MAX_WAITERS"]) < 0:
        raise ConfigError("LOCKKEEPER_MAX_WAITERS must be zero or more")
    if int(config["LOCKKEEPER_MAX_WAITERS_PER_TOKEN"]) < 0:
        raise ConfigError("LOCKKEEPER_MAX_WAITERS_PER_TOKEN must be zero or more")
    poll = config["LOCKKEEPER_WAIT_POLL_INTERVAL"]
    if not (math.isfinite(poll) and 0 < poll <= 5):
        raise ConfigError("LOCKKEEPER_WAIT_POLL_INTERVAL must be in (0, 5] seconds")
    if int(config["LOCKKEEPER_MAX_STREAMS"]) < 0:
        raise ConfigError("LOCKKEEPER_MAX_STREAMS must be zero or more")
    if int(config["LOCKKEEPER_MAX_STREAMS_PER_TOKEN"]) < 0:
        raise ConfigError("LOCKKEEPER_MAX_STREAMS_PER_TOKEN must be zero or more")
    if int(config["LOCKKEEPER_MAX_SESSIONS_PER_TOKEN"]) < 0:
        raise ConfigError(
            "LOCKKEEPER_MAX_SESSIONS_PER_TOKEN must be 0 (no limit) or more"
        )
    if not 1 <= int(config["LOCKKEEPER_MAX_SET_SIZE"]) <= 1000:
        raise ConfigError("LOCKKEEPER_MAX_SET_SIZE must be from 1 to 1000")
    keepalive = config["LOCKKEEPER_STREAM_KEEPALIVE"]
    if not (math.isfinite(keepalive) and 0 < keepalive <= 15):
        raise ConfigError("LOCKKEEPER_STREAM_KEEPALIVE must be in (0, 15] seconds")
    if not 0 <= config["LOCKKEEPER_REFUSALS_FLUSH_SECONDS"] <= 60:
        raise ConfigError("LOCKKEEPER_REFUSALS_FLUSH_SECONDS must be 0 to 60 seconds")
    lifetime = config["LOCKKEEPER_STREAM_MAX_SECONDS"]
    if not (math.isfinite(lifetime) and lifetime >= 0):
        raise ConfigError("LOCKKEEPER_STREAM_MAX_SECONDS must be zero or more seconds")
    stream_poll = config["LOCKKEEPER_STREAM_POLL_INTERVAL"]
    if not (math.isfinite(stream_poll) and 0 < stream_poll <= 5):
        raise ConfigError("LOCKKEEPER_STREAM_POLL_INTERVAL must be in (0, 5] seconds")
    if not (math.isfinite(window) and window >= 0):
        raise ConfigError("LOCKKEEPER_EXPIRING_WITHIN must be zero or more seconds")
    read_timeout = config["LOCKKEEPER_DATABASE_READ_TIMEOUT"]
    if not (math.isfinite(read_timeout) and read_timeout >= 0):
        raise ConfigError(
            "LOCKKEEPER_DATABASE_READ_TIMEOUT must be zero (none) or more seconds"
        )
    for key in ("LOCKKEEPER_SESSION_HOURS", "LOCKKEEPER_LOGIN_ADDRESS_WINDOW_SECONDS"):
        value = float(config[key])
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{key} must be a positive number, not {value!r}")
    try:
        prefix_families(config["LOCKKEEPER_METRICS_PREFIXES"])
    except ValueError as exc:
        raise ConfigError(f"LOCKKEEPER_METRICS_PREFIXES: {exc}") from exc
    for key in ("LOCKKEEPER_LOGIN_ATTEMPTS_PER_ADDRESS", "LOCKKEEPER_PROXY_COUNT"):
        if int(config[key]) < 0:
            raise ConfigError(f"{key} must be zero or more")


_PROCESS_KEY = "lockkeeper.process_secret_key"


def existing_secret_key(instance: Path) -> str | None:
    """The instance's secret key if it has one; nothing is created."""
    try:
        return (instance / "secret_key").read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def keep_secret_key(app: Flask) -> None:
    """A server started from a command (`lockkeeper run`) signs with the
    instance's key, created now if need be, not the command's own."""
    if app.config.get("SECRET_KEY") == app.extensions.pop(_PROCESS_KEY, None):
        app.config["SECRET_KEY"] = load_or_create_secret_key(Path(app.instance_path))


def load_or_create_secret_key(instance: Path) -> str:
    """Read the instance's secret key, creating it once even when workers race.

    The key is written to a temporary file and hard-linked into place: ``link`` fails
    if the name exists, so exactly one worker's key wins and every worker reads it.
    """
    path = instance / "secret_key"
    if not path.exists():
        make_private_dir(instance)
        tmp = instance / f".secret_key.{os.getpid()}.{secrets.token_hex(4)}"
        # Created 0600: the key is never readable by others, not even briefly.
        with os.fdopen(
            os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w"
        ) as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    restrict_to_owner(path, 0o600)
    return path.read_text().strip()
