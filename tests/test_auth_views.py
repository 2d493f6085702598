"""Login, logout, roles and login throttling of the dashboard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from app.auth.models import User
from app.extensions import db
from tests.dashboard_helpers import PASSWORD, csrf_token, log_in, make_user, soup


@pytest.fixture
def app(make_app):
    app = make_app(LOCKKEEPER_LOGIN_MAX_FAILURES=3)
    make_user(app, "olga", "operator")
    make_user(app, "vic", "viewer")
    return app


def user_row(app, username):
    with app.app_context():
        return db.session.scalar(select(User).where(User.username == username))


def test_login_page_has_labelled_inputs_and_a_csrf_token(client):
    page = soup(client.get("/login"))
    form = page.find("form", attrs={"action": "/login"})
    assert form["method"] == "post"
    assert form.find("input", attrs={"name": "csrf_token"})["value"]
    for name in ("username", "password"):
        field = form.find("input", attrs={"name": name})
        assert page.find("label", attrs={"for": field["id"]})


def test_login_with_right_password_redirects_to_overview(client):
    response = log_in(client, "olga")
    assert response.status_code == 303
    assert response.headers["Location"] == "/"


def test_login_returns_to_the_page_that_asked_for_it(client):
    response = log_in(client, "olga", next="/locks/job:1?x=1")
    assert response.headers["Location"] == "/locks/job:1?x=1"


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "x"]
)
def test_login_never_redirects_to_another_site(client, target):
    response = log_in(client, "olga", next=target)
    assert response.headers["Location"] == "/"


def test_login_with_wrong_password_is_refused_without_naming_the_cause(client):
    wrong = log_in(client, "olga", "not the password")
    unknown = log_in(client, "nobody", "not the password")
    assert wrong.status_code == unknown.status_code == 401
    assert "Wrong username or password." in wrong.get_data(as_text=True)
    assert "Wrong username or password." in unknown.get_data(as_text=True)


def test_login_post_without_csrf_token_is_rejected(client):
    response = client.post("/login", data={"username": "olga", "password": PASSWORD})
    assert response.status_code == 400
    assert "CSRF" in response.get_data(as_text=True)


def test_repeated_failures_lock_the_account_even_for_the_right_password(app, client):
    for _ in range(2):
        assert log_in(client, "olga", "wrong password").status_code == 401
    locked = log_in(client, "olga", "wrong password")
    assert locked.status_code == 429
    assert int(locked.headers["Retry-After"]) == 300
    assert "try again in 5 minutes" in locked.get_data(as_text=True)
    assert log_in(client, "olga").status_code == 429
    assert user_row(app, "olga").locked_until is not None


def test_lockout_ends_after_its_time(app, client):
    for _ in range(3):
        log_in(client, "olga", "wrong password")
    with app.app_context():
        user = db.session.scalar(select(User).where(User.username == "olga"))
        user.locked_until = datetime.now(UTC) - timedelta(seconds=1)
        db.session.commit()
    assert log_in(client, "olga").status_code == 303
    row = user_row(app, "olga")
    assert row.failed_logins == 0
    assert row.locked_until is None


def test_success_resets_the_failure_count(app, client):
    log_in(client, "olga", "wrong password")
    log_in(client, "olga", "wrong password")
    assert log_in(client, "olga").status_code == 303
    assert user_row(app, "olga").failed_logins == 0


def test_session_cookie_is_httponly_and_samesite_lax(client):
    response = log_in(client, "olga")
    cookie = next(
        value
        for value in response.headers.getlist("Set-Cookie")
        if value.startswith("session=")
    )
    assert "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie


def test_logout_needs_a_post_with_csrf_token_and_ends_the_session(client):
    log_in(client, "olga")
    assert client.get("/logout").status_code == 405
    token = csrf_token(client, "/")
    response = client.post("/logout", data={"csrf_token": token})
    assert response.status_code == 303
    assert client.get("/").status_code == 302


def test_anonymous_page_request_is_sent_to_login_with_next(client):
    response = client.get("/?state=stale")
    assert response.status_code == 302
    assert response.headers["Location"] == "/login?next=/?state%3Dstale"


def test_anonymous_htmx_request_gets_401_with_hx_redirect(client):
    response = client.get(
        "/?state=stale",
        headers={
            "HX-Request": "true",
            "HX-Current-URL": "http://localhost/?state=stale",
        },
    )
    assert response.status_code == 401
    assert response.headers["HX-Redirect"].startswith("/login?next=")
    assert "<table" not in response.get_data(as_text=True)


def test_html_responses_carry_security_headers(client):
    response = client.get("/login")
    csp = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert "unsafe-eval" not in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert response.headers["X-Frame-Options"] == "DENY"


def test_other_responses_carry_the_headers_for_every_response_and_no_page_policy(
    app, client
):
    @app.get("/_test/own-headers")
    def own_headers():
        return (
            "{}",
            200,
            {
                "Content-Type": "application/json",
                "referrer-policy": "no-referrer",
            },
        )

    response = client.get("/_test/own-headers")
    assert response.headers.getlist("X-Content-Type-Options") == ["nosniff"]
    # A view's own value is kept, whatever the case of its name.
    assert response.headers.getlist("Referrer-Policy") == ["no-referrer"]
    assert "Content-Security-Policy" not in response.headers
    assert "X-Frame-Options" not in response.headers

    problem = client.get("/api/v1/locks")  # no token: a problem+json 401
    assert problem.status_code == 401
    assert problem.headers["X-Content-Type-Options"] == "nosniff"
    assert "Content-Security-Policy" not in problem.headers


def test_an_html_type_with_parameters_gets_the_page_policy(app, client):
    @app.get("/_test/html")
    def html_page():
        return "<p>hi</p>", 200, {"Content-Type": "Text/HTML ; charset=utf-8"}

    response = client.get("/_test/html")
    assert response.headers.getlist("X-Frame-Options") == ["DENY"]
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_login_page_has_no_inline_script_or_style(client):
    page = soup(client.get("/login"))
    assert all(script.get("src") for script in page.find_all("script"))
    assert not page.find_all("style")
    assert not page.select("[style]")
    assert not [
        tag for tag in page.find_all(True) if any(a.startswith("on") for a in tag.attrs)
    ]
