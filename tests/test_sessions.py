"""Dashboard sessions end on the server: logout, a new password, a disabled
account and the session lifetime all make every copy of the cookie useless."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from app.auth.models import UserSession
from app.extensions import db, lock_service
from tests.dashboard_helpers import PASSWORD, csrf_token, log_in, make_user

pytestmark = pytest.mark.usefixtures("backend")

RESOURCE = "job:1"


@pytest.fixture
def app(make_app):
    app = make_app()
    make_user(app, "olga", "operator")
    make_user(app, "vic", "viewer")
    return app


def copy_of(app, client):
    """Another browser holding a copy of ``client``'s session cookie."""
    thief = app.test_client()
    thief.set_cookie("session", client.get_cookie("session").value)
    return thief


def held(app) -> int:
    with app.app_context():
        service = lock_service()
        service.acquire(RESOURCE, "worker-1", ttl=600)
        return service.get(RESOURCE).fence


def holder(app):
    with app.app_context():
        lock = lock_service().get(RESOURCE)
        return lock.owner if lock else None


def sessions(app) -> int:
    with app.app_context():
        count = db.session.scalar(select(func.count()).select_from(UserSession))
        db.session.remove()
        return count


def force_release(client, token, fence):
    return client.post(
        f"/locks/{RESOURCE}/release",
        data={"reason": "test", "fence": str(fence), "csrf_token": token},
    )


def test_a_copied_cookie_works_until_logout_then_opens_nothing(app):
    fence = held(app)
    operator = app.test_client()
    assert log_in(operator, "olga").status_code == 303
    token = csrf_token(operator, "/")
    # The copy carries the session and its CSRF token, as a stolen cookie would.
    thief = copy_of(app, operator)
    assert thief.get("/").status_code == 200  # a copy works while the session lives
    assert operator.post("/logout", data={"csrf_token": token}).status_code == 303
    assert sessions(app) == 0

    assert thief.get("/").status_code == 302
    assert thief.get("/audit").status_code == 302
    refused = force_release(thief, token, fence)
    assert refused.status_code in (302, 303, 401)
    assert refused.headers["Location"].startswith("/login")
    assert holder(app) == "worker-1"


def test_logging_in_again_ends_the_session_the_browser_had(app):
    browser = app.test_client()
    log_in(browser, "olga")
    browser.get("/")
    before = copy_of(app, browser)
    assert before.get("/").status_code == 200
    # /login redirects a logged-in browser; the form posted from an older tab:
    again = browser.post(
        "/login",
        data={
            "username": "vic",
            "password": PASSWORD,
            "csrf_token": csrf_token(browser, "/"),
        },
    )
    assert again.status_code == 303
    assert sessions(app) == 1
    assert before.get("/").status_code == 302
    assert browser.get("/").status_code == 200


def test_logout_ends_only_its_own_session(app):
    first, second = app.test_client(), app.test_client()
    log_in(first, "olga")
    log_in(second, "olga")
    assert sessions(app) == 2
    first.post("/logout", data={"csrf_token": csrf_token(first, "/")})
    assert first.get("/").status_code == 302
    assert second.get("/").status_code == 200


@pytest.mark.parametrize(
    "command",
    [
        ["users", "set-password", "olga", "--password-stdin"],
        ["users", "disable", "olga"],
    ],
)
def test_set_password_and_disable_end_every_session_of_the_user(app, command):
    fence = held(app)
    operator, other_browser, viewer = (app.test_client() for _ in range(3))
    log_in(operator, "olga")
    log_in(other_browser, "olga")
    log_in(viewer, "vic")
    token = csrf_token(operator, "/")
    result = app.test_cli_runner().invoke(args=command, input="a new password\n")
    assert result.exit_code == 0, result.output
    assert "sessions have ended" in result.output
    for client in (operator, other_browser):
        assert client.get("/").status_code == 302
    assert force_release(operator, token, fence).status_code in (302, 303)
    assert holder(app) == "worker-1"
    assert viewer.get("/").status_code == 200  # another user is untouched


def test_set_password_takes_the_new_one_and_unlocks(app):
    client = app.test_client()
    for _ in range(5):
        log_in(client, "olga", "wrong password")
    assert log_in(client, "olga").status_code == 429
    runner = app.test_cli_runner()
    short = runner.invoke(
        args=["users", "set-password", "olga", "--password-stdin"], input="short\n"
    )
    assert short.exit_code != 0
    assert "at least 8 characters" in short.output
    result = runner.invoke(
        args=["users", "set-password", "olga", "--password-stdin"],
        input="a new password\n",
    )
    assert result.exit_code == 0, result.output
    assert log_in(client, "olga").status_code == 401
    assert log_in(client, "olga", "a new password").status_code == 303


def test_unknown_user_is_an_error_for_every_users_command(app):
    runner = app.test_cli_runner()
    for command in ("set-password", "disable", "enable"):
        result = runner.invoke(
            args=["users", command, "nobody", "--password-stdin"]
            if command == "set-password"
            else ["users", command, "nobody"],
            input="a new password\n",
        )
        assert result.exit_code == 1
        assert "no user named 'nobody'" in result.output


def test_a_session_ends_after_its_lifetime(app):
    browser = app.test_client()
    log_in(browser, "olga")
    assert browser.get("/").status_code == 200
    with app.app_context():
        db.session.execute(
            update(UserSession).values(
                expires_at=datetime.now(UTC) - timedelta(seconds=1)
            )
        )
        db.session.commit()
    assert browser.get("/").status_code == 302


def test_a_session_lasts_session_hours(make_app):
    app = make_app(LOCKKEEPER_SESSION_HOURS=2)
    make_user(app, "olga")
    before = datetime.now(UTC)
    log_in(app.test_client(), "olga")
    with app.app_context():
        row = db.session.scalar(select(UserSession))
    assert (
        before + timedelta(hours=2)
        <= row.expires_at
        <= datetime.now(UTC) + timedelta(hours=2)
    )


def test_the_cookie_holds_no_user_id_and_the_table_no_token(app):
    browser = app.test_client()
    log_in(browser, "olga")
    with app.app_context():
        row = db.session.scalar(select(UserSession))
    cookie = browser.get_cookie("session").value
    assert row.token_hash not in cookie
    with browser.session_transaction() as session:
        token = session["_user_id"]
    assert len(token) >= 40
    assert token != str(row.user_id)
    assert token not in row.token_hash


def test_a_cookie_naming_a_user_id_as_before_server_sessions_opens_nothing(app):
    """Cookies signed before sessions moved to the server held the user's id: after
    the upgrade they are logged out, not taken as that user."""
    from app.auth.models import User

    with app.app_context():
        user_id = db.session.scalar(select(User.id).where(User.username == "olga"))
    browser = app.test_client()
    log_in(browser, "olga")
    assert browser.get("/").status_code == 200
    with browser.session_transaction() as session:
        session["_user_id"] = str(user_id)  # all else as a real login left it
    assert browser.get("/").status_code == 302
