"""Secure defaults an operator gets without editing instance/config.py: the
session cookie's Secure flag from the environment or the forwarded scheme, a
connect timeout on PostgreSQL, and no secret key file written by a command that
does not need one."""

from __future__ import annotations

import pytest

from app.database import POSTGRESQL_CONNECT_TIMEOUT, engine_options
from tests.dashboard_helpers import log_in, make_user


def session_cookie(response) -> str:
    (cookie,) = [
        value
        for value in response.headers.getlist("Set-Cookie")
        if value.startswith("session=")
    ]
    return cookie


@pytest.mark.parametrize(
    ("setting", "scheme", "secure"),
    [
        (None, "https", True),  # auto: the proxy says the request was https
        (None, "http", False),
        ("true", "http", True),
        ("false", "https", False),
    ],
)
def test_the_session_cookie_is_secure_by_scheme_or_by_the_environment(
    make_app, monkeypatch, setting, scheme, secure
):
    if setting is not None:
        monkeypatch.setenv("LOCKKEEPER_SESSION_COOKIE_SECURE", setting)
    app = make_app(LOCKKEEPER_PROXY_COUNT=1)
    make_user(app, "olga")
    client = app.test_client()
    client.environ_base["HTTP_X_FORWARDED_PROTO"] = scheme
    # Over https Flask-WTF checks the Referer is this site, as a browser sends it.
    client.environ_base["HTTP_REFERER"] = f"{scheme}://localhost/login"
    response = log_in(client, "olga")
    assert response.status_code == 303
    assert ("; Secure" in session_cookie(response)) is secure


def test_a_cookie_setting_that_is_not_a_switch_is_refused(make_app, monkeypatch):
    from app.config import ConfigError

    monkeypatch.setenv("LOCKKEEPER_SESSION_COOKIE_SECURE", "sometimes")
    with pytest.raises(ConfigError, match="LOCKKEEPER_SESSION_COOKIE_SECURE"):
        make_app()


@pytest.mark.parametrize(
    ("url", "timeout"),
    [
        ("postgresql+psycopg://u@db.example/x", POSTGRESQL_CONNECT_TIMEOUT),
        ("postgresql+psycopg://u@db.example/x?connect_timeout=3", None),
    ],
)
def test_postgresql_connects_with_a_timeout_unless_the_url_names_one(url, timeout):
    class App:
        config = {"SQLALCHEMY_DATABASE_URI": url}

    connect_args = engine_options(App()).get("connect_args", {})
    assert connect_args.get("connect_timeout") == timeout


@pytest.mark.parametrize(
    ("url", "setting", "timeout"),
    [
        ("mariadb+pymysql://u@db.example/x", 60.0, 60.0),
        ("mariadb+pymysql://u@db.example/x", 0.0, None),
        ("mysql+pymysql://u@db.example/x?read_timeout=5", 60.0, None),
        ("postgresql+psycopg://u@db.example/x", 60.0, None),
    ],
)
def test_mariadb_reads_with_a_timeout_unless_the_url_names_one(url, setting, timeout):
    class App:
        config = {
            "SQLALCHEMY_DATABASE_URI": url,
            "LOCKKEEPER_DATABASE_READ_TIMEOUT": setting,
        }

    connect_args = engine_options(App()).get("connect_args", {})
    assert connect_args.get("read_timeout") == timeout


@pytest.mark.parametrize("raw", ["-1", "inf", "soon"])
def test_a_read_timeout_that_is_no_length_of_time_is_refused(
    make_app, monkeypatch, raw
):
    from app.config import ConfigError

    monkeypatch.setenv("LOCKKEEPER_DATABASE_READ_TIMEOUT", raw)
    with pytest.raises(ConfigError, match="LOCKKEEPER_DATABASE_READ_TIMEOUT"):
        make_app()
