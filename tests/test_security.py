"""Security properties, checked over every route the app has.

Routes are enumerated from the URL map, so a route added later is covered
without touching this file: no API route answers without a valid bearer token;
the dashboard's session cookie is no API credential; every state-changing form
needs its CSRF token; a viewer cannot act; tokens and passwords are never logged,
stored or shown again after creation. Every dashboard route is checked with each
kind of browser credential: none, an ended (logged out), expired or disabled
user's session, a viewer, an operator, and an operator's browser driven by
another site.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from flask import Flask, url_for
from flask.testing import FlaskClient
from lockkeeper_core.models import LockEvent
from sqlalchemy import func, select
from werkzeug.routing import IntegerConverter

from app.extensions import db, lock_service
from tests.dashboard_helpers import PASSWORD, csrf_token, log_in, make_user

RESOURCE = "job:1"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
# Everything a dashboard action form might carry, so that only the CSRF token (or
# the role) can be the reason for a refusal.
FULL_FORM = {
    "reason": "security test",
    "owner": "operator:mallory",
    "ttl": "30",
    "force": "yes",
    "fence": "1",
    "confirm": "yes",
}


def routes(app: Flask, *, api: bool) -> list[tuple[str, str, str]]:
    """(endpoint, method, url) of every route under /api/v1 or outside it."""
    found = []
    with app.test_request_context():
        for rule in app.url_map.iter_rules():
            if rule.endpoint == "static":
                continue
            # Every argument names the resource, but a number's (a fence): 1.
            values = {
                name: 1 if isinstance(converter, IntegerConverter) else RESOURCE
                for name, converter in rule._converters.items()
            }
            url = url_for(rule.endpoint, **values)
            if url.startswith("/api/") != api:
                continue
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                found.append((rule.endpoint, method, url))
    return found


def api_routes(app: Flask) -> list[tuple[str, str, str]]:
    return [r for r in routes(app, api=True) if r[0] != "api.openapi_json"]


def form_posts(app: Flask, *, acting_only: bool = False) -> list[tuple[str, str]]:
    """(endpoint, url) of every state-changing route outside the API."""
    return [
        (endpoint, url)
        for endpoint, method, url in routes(app, api=False)
        if method not in SAFE_METHODS
        and not (acting_only and endpoint.startswith("auth."))
    ]


@pytest.fixture
def csrf_app(make_app) -> Flask:
    """CSRF on, as in production (the default of ``make_app`` too)."""
    app = make_app()
    assert app.config.get("WTF_CSRF_ENABLED", True)
    make_user(app, "olga", "operator")
    make_user(app, "victor", "viewer")
    return app


# The routes name "job:1" everywhere; no session and no set has that id, so
# their pages say so (tests/test_dashboard_sessions.py and
# tests/test_dashboard_sets.py open real ones).
NAMES_NOTHING = {
    "dashboard.end_session": 404,
    "dashboard.set_page": 404,
    "dashboard.release_set": 404,
}


def held_lock(app: Flask):
    with app.app_context():
        service = lock_service()
        service.acquire(RESOURCE, "worker-1", ttl=600)
        return service.get(RESOURCE)


def lock_state(app: Flask):
    """The lock row and the number of events: what an action would change."""
    with app.app_context():
        lock = lock_service().get(RESOURCE, include_stale=True)
        events = db.session.scalar(select(func.count()).select_from(LockEvent))
        db.session.remove()
    return (lock.owner, lock.fence, lock.expires_at), events


def test_route_enumeration_finds_the_api_and_the_actions(csrf_app):
    """Guards the tests below against vacuously passing over an empty list."""
    api = {(endpoint, method) for endpoint, method, _ in api_routes(csrf_app)}
    assert len(api) >= 6
    assert {m for _, m in api} >= {"GET", "POST", "PATCH", "DELETE"}
    acting = {endpoint for endpoint, _ in form_posts(csrf_app, acting_only=True)}
    assert len(acting) >= 2


# -- the API: bearer tokens only ----------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer lk_not-a-real-token",
        "Basic b2xnYTpjb3JyZWN0IGhvcnNlIGJhdHRlcnk=",
        "Token {token}",
        "Bearer {token}x",
        "Bearer " + "A" * 5000,
    ],
)
def test_no_api_route_answers_without_a_valid_token(csrf_app, authorization):
    from app.auth.service import create_token

    with csrf_app.app_context():
        token = create_token("worker")
    held = held_lock(csrf_app)
    client = csrf_app.test_client()
    before = lock_state(csrf_app)
    for endpoint, method, url in api_routes(csrf_app):
        headers = {}
        if authorization is not None:
            headers["Authorization"] = authorization.format(token=token)
        response = client.open(
            url, method=method, headers=headers, json={"owner": held.owner, "ttl": 5}
        )
        assert response.status_code == 401, (endpoint, method, response.status_code)
        assert response.mimetype == "application/problem+json"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert token not in response.get_data(as_text=True)
    assert lock_state(csrf_app) == before


def test_revoked_token_opens_no_api_route(csrf_app):
    from app.auth.service import create_token, revoke_token

    with csrf_app.app_context():
        token = create_token("leaver")
        revoke_token("leaver")
    client = csrf_app.test_client()
    for endpoint, method, url in api_routes(csrf_app):
        response = client.open(
            url,
            method=method,
            headers={"Authorization": f"Bearer {token}"},
            json={"owner": "w", "ttl": 5},
        )
        assert response.status_code == 401, (endpoint, method)


def test_operator_session_cookie_does_not_authenticate_the_api(csrf_app):
    held = held_lock(csrf_app)
    browser = csrf_app.test_client()
    assert log_in(browser, "olga").status_code in (302, 303)
    assert browser.get("/").status_code == 200  # the session is live
    token = csrf_token(browser, "/")
    before = lock_state(csrf_app)
    for endpoint, method, url in api_routes(csrf_app):
        response = browser.open(
            url,
            method=method,
            headers={"X-CSRFToken": token},
            json={"owner": held.owner, "ttl": 5},
        )
        assert response.status_code == 401, (endpoint, method, response.status_code)
    assert lock_state(csrf_app) == before


# -- the dashboard: CSRF and roles --------------------------------------------------


@pytest.mark.parametrize("csrf", ["missing", "wrong", "another session's"])
def test_state_changing_form_without_its_csrf_token_is_rejected(csrf_app, csrf):
    held_lock(csrf_app)
    operator = csrf_app.test_client()
    log_in(operator, "olga")
    form = dict(FULL_FORM, fence=str(held_lock(csrf_app).fence))
    if csrf == "wrong":
        form["csrf_token"] = "IjRhZjM4NTQ2ZGY5In0.not-a-token"
    elif csrf == "another session's":
        other = csrf_app.test_client()
        log_in(other, "olga")
        form["csrf_token"] = csrf_token(other, "/")
    before = lock_state(csrf_app)
    for endpoint, url in form_posts(csrf_app):
        for headers in ({}, {"HX-Request": "true"}):
            response = operator.post(url, data=form, headers=headers)
            assert response.status_code == 400, (endpoint, headers, response.status)
    assert lock_state(csrf_app) == before
    assert operator.get("/").status_code == 200  # /logout did not log us out


def test_csrf_token_in_the_form_lets_an_operator_act(csrf_app):
    """The other side of the CSRF test: the same post with its token works."""
    lock = held_lock(csrf_app)
    operator = csrf_app.test_client()
    log_in(operator, "olga")
    response = operator.post(
        f"/locks/{RESOURCE}/release",
        data=dict(
            FULL_FORM, fence=str(lock.fence), csrf_token=csrf_token(operator, "/")
        ),
    )
    assert response.status_code in (200, 302, 303)
    with csrf_app.app_context():
        assert lock_service().counts()["held"] == 0


def test_a_viewer_cannot_act_even_with_a_valid_csrf_token(csrf_app):
    lock = held_lock(csrf_app)
    viewer = csrf_app.test_client()
    log_in(viewer, "victor")
    token = csrf_token(viewer, "/")
    before = lock_state(csrf_app)
    for endpoint, url in form_posts(csrf_app, acting_only=True):
        for headers in ({}, {"HX-Request": "true"}):
            response = viewer.post(
                url,
                data=dict(FULL_FORM, fence=str(lock.fence), csrf_token=token),
                headers=headers,
            )
            assert response.status_code == 403, (endpoint, headers, response.status)
        assert viewer.get(url).status_code in (403, 405), endpoint
    assert lock_state(csrf_app) == before


def test_anonymous_posts_change_nothing(csrf_app):
    held_lock(csrf_app)
    anonymous = csrf_app.test_client()
    token = csrf_token(anonymous, "/login")
    before = lock_state(csrf_app)
    for endpoint, url in form_posts(csrf_app, acting_only=True):
        response = anonymous.post(url, data=dict(FULL_FORM, csrf_token=token))
        assert response.status_code in (302, 303, 401), endpoint
    assert lock_state(csrf_app) == before


# -- secrets: never logged, stored or shown again ------------------------------------


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))
        if record.exc_info:
            self.lines.append(logging.Formatter().formatException(record.exc_info))


@pytest.fixture
def every_log_line() -> Iterator[list[str]]:
    """Every record of every logger, at DEBUG, whatever its propagation."""
    handler = _Collect()
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and not logger.propagate
    ]
    levels = [(logger, logger.level) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield handler.lines
    for logger, level in levels:
        logger.removeHandler(handler)
        logger.setLevel(level)


def stored_strings(app: Flask) -> str:
    """Every value of every row of the user and token tables, as one text."""
    from app.auth.models import ApiToken, User

    with app.app_context():
        values = []
        for model in (User, ApiToken):
            for row in db.session.execute(select(model.__table__)).all():
                values.extend(str(value) for value in row)
        db.session.remove()
    return "\n".join(values)


def test_api_token_is_shown_once_and_never_logged_or_stored(make_app, every_log_line):
    app = make_app()
    runner = app.test_cli_runner()
    created = runner.invoke(args=["tokens", "create", "ci-worker"])
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    assert token.startswith("lk_")
    assert created.output.count(token) == 1

    client = app.test_client()
    auth = {"Authorization": f"Bearer {token}"}
    assert client.post(f"/api/v1/locks/{RESOURCE}", json={"owner": "w"}, headers=auth)
    client.get(f"/api/v1/locks/{RESOURCE}", headers=auth)
    client.get("/api/v1/nope", headers=auth)
    client.post(f"/api/v1/locks/{RESOURCE}", data="{", headers=auth)
    client.get("/api/v1/locks", headers={"Authorization": f"Bearer {token}x"})
    listed = runner.invoke(args=["tokens", "list"])

    assert "ci-worker" in listed.output
    assert token not in listed.output
    assert every_log_line, "the request log wrote nothing: this test would be blind"
    assert not [line for line in every_log_line if token in line]
    assert token not in stored_strings(app)


def test_passwords_are_never_echoed_logged_or_stored(make_app, every_log_line):
    app = make_app()
    runner = app.test_cli_runner()
    secret = "s3cret-Passphrase-for-carol"
    created = runner.invoke(
        args=["users", "create", "carol", "--role", "operator", "--password-stdin"],
        input=secret + "\n",
    )
    assert created.exit_code == 0, created.output
    assert secret not in created.output

    browser = app.test_client()
    assert log_in(browser, "carol", secret).status_code in (302, 303)
    refused = app.test_client()
    log_in(refused, "carol", secret + "-wrong")
    log_in(refused, "nobody", secret)
    for page in ("/", "/audit", f"/locks/{RESOURCE}"):
        assert secret not in browser.get(page).get_data(as_text=True)

    assert every_log_line
    assert not [line for line in every_log_line if secret in line]
    assert secret not in stored_strings(app)
    assert PASSWORD not in stored_strings(app)


def test_first_start_secrets_go_to_the_console_once_never_to_the_log(
    make_app, capsys, every_log_line
):
    app = make_app(LOCKKEEPER_BOOTSTRAP=True)
    console = capsys.readouterr().err
    (shown,) = [
        json.loads(line) for line in console.splitlines() if '"first_start"' in line
    ]
    password, token = shown["password"], shown["token"]
    assert token.startswith("lk_")
    make_app(LOCKKEEPER_BOOTSTRAP=True)  # a second start shows nothing again
    assert capsys.readouterr().err == ""
    assert not [line for line in every_log_line if password in line or token in line]
    stored = stored_strings(app)
    assert password not in stored
    assert token not in stored


# -- the dashboard: each kind of browser credential over every route ------------------


def dashboard_routes(app: Flask) -> list[tuple[str, str, str]]:
    """Every route of the dashboard proper: not the API, login/logout or ops."""
    return [
        (endpoint, method, url)
        for endpoint, method, url in routes(app, api=False)
        if not endpoint.startswith(("auth.", "ops."))
    ]


def acting_endpoints(app: Flask) -> set[str]:
    return {endpoint for endpoint, _ in form_posts(app, acting_only=True)}


def ended_session(app: Flask) -> FlaskClient:
    """A copy of an operator's cookie (with its CSRF token) taken before logout."""
    browser = app.test_client()
    log_in(browser, "olga")
    token = csrf_token(browser, "/")
    copy = app.test_client()
    copy.set_cookie("session", browser.get_cookie("session").value)
    browser.post("/logout", data={"csrf_token": token})
    copy.csrf = token
    return copy


def disabled_user(app: Flask) -> FlaskClient:
    browser = app.test_client()
    log_in(browser, "olga")
    browser.csrf = csrf_token(browser, "/")
    result = app.test_cli_runner().invoke(args=["users", "disable", "olga"])
    assert result.exit_code == 0, result.output
    return browser


def expired_session(app: Flask) -> FlaskClient:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from app.auth.models import UserSession

    browser = app.test_client()
    log_in(browser, "olga")
    browser.csrf = csrf_token(browser, "/")
    with app.app_context():
        db.session.execute(
            update(UserSession).values(
                expires_at=datetime.now(UTC) - timedelta(seconds=1)
            )
        )
        db.session.commit()
    return browser


def no_session(app: Flask) -> FlaskClient:
    browser = app.test_client()
    browser.csrf = csrf_token(browser, "/login")
    return browser


@pytest.mark.parametrize(
    "credential", [no_session, ended_session, disabled_user, expired_session]
)
def test_without_a_live_session_every_dashboard_route_sends_to_login(
    csrf_app, credential
):
    lock = held_lock(csrf_app)
    browser = credential(csrf_app)
    before = lock_state(csrf_app)
    for endpoint, method, url in dashboard_routes(csrf_app):
        form = dict(FULL_FORM, fence=str(lock.fence), csrf_token=browser.csrf)
        page = browser.open(url, method=method, data=form)
        assert page.status_code in (302, 303), (endpoint, method, page.status_code)
        assert page.headers["Location"].startswith("/login"), endpoint
        htmx = browser.open(
            url, method=method, data=form, headers={"HX-Request": "true"}
        )
        assert htmx.status_code == 401, (endpoint, method, htmx.status_code)
        assert htmx.headers["HX-Redirect"].startswith("/login")
    assert lock_state(csrf_app) == before


def test_a_viewer_reads_every_page_and_opens_no_action(csrf_app):
    held_lock(csrf_app)
    viewer = csrf_app.test_client()
    log_in(viewer, "victor")
    acting = acting_endpoints(csrf_app)
    for endpoint, method, url in dashboard_routes(csrf_app):
        if method != "GET":
            continue
        status = viewer.get(url).status_code
        if endpoint in acting:
            assert status in (403, 405), (endpoint, status)
        else:
            assert status == NAMES_NOTHING.get(endpoint, 200), (endpoint, status)


def test_an_operator_opens_every_page_and_form(csrf_app):
    held_lock(csrf_app)
    operator = csrf_app.test_client()
    log_in(operator, "olga")
    for endpoint, method, url in dashboard_routes(csrf_app):
        if method == "GET":
            expected = NAMES_NOTHING.get(endpoint, 200)
            assert operator.get(url).status_code == expected, endpoint


CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://localhost.evil.example"},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_a_state_changing_request_from_another_site_is_refused(csrf_app, headers):
    """An operator's browser, with the session and the right CSRF token, sent by
    another site's page: refused before anything runs, and the page says why."""
    lock = held_lock(csrf_app)
    operator = csrf_app.test_client()
    log_in(operator, "olga")
    form = dict(FULL_FORM, fence=str(lock.fence), csrf_token=csrf_token(operator, "/"))
    before = lock_state(csrf_app)
    posts = form_posts(csrf_app)
    assert "auth.login" in {endpoint for endpoint, _ in posts}
    for endpoint, url in posts:
        response = operator.post(url, data=form, headers=headers)
        assert response.status_code == 403, (endpoint, response.status_code)
        assert "came from another site" in response.get_data(as_text=True)
    assert lock_state(csrf_app) == before
    assert operator.get("/").status_code == 200  # /logout did not log us out


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": "http://localhost"},
        # Fetch Metadata decides when present: Origin is the fallback.
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:5000"},
        {},
    ],
)
def test_the_same_post_from_our_own_pages_is_carried_out(csrf_app, headers):
    lock = held_lock(csrf_app)
    operator = csrf_app.test_client()
    log_in(operator, "olga")
    response = operator.post(
        f"/locks/{RESOURCE}/release",
        data=dict(
            FULL_FORM, fence=str(lock.fence), csrf_token=csrf_token(operator, "/")
        ),
        headers=headers,
    )
    assert response.status_code == 303
    with csrf_app.app_context():
        assert lock_service().counts()["held"] == 0


def test_the_api_ignores_the_site_headers(csrf_app):
    """Bearer tokens are never sent by a browser on its own: no site check."""
    from app.auth.service import create_token

    with csrf_app.app_context():
        token = create_token("worker")
    response = csrf_app.test_client().post(
        "/api/v1/locks/job:2",
        json={"owner": "w"},
        headers={
            "Authorization": f"Bearer {token}",
            "Sec-Fetch-Site": "cross-site",
            "Origin": "https://evil.example",
        },
    )
    assert response.status_code == 200


# -- the API: each kind of token credential over every route -----------------------

HOLDER, OWNER = "holder", "worker-1"


def token_credentials(app: Flask) -> dict[str, str | None]:
    """A bearer token of each kind (None: no Authorization header at all)."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from app.auth.models import ApiToken
    from app.auth.service import create_token, revoke_token

    with app.app_context():
        tokens = {
            "none": None,
            "another scope": create_token("elsewhere", prefixes=["report:"]),
            "read-only": create_token("reader", read_only=True),
            "expired": create_token("lapsed", expires_in=timedelta(days=1)),
            "revoked": create_token("leaver"),
            "valid": create_token("colleague"),
        }
        revoke_token("leaver")
        db.session.execute(
            update(ApiToken)
            .where(ApiToken.name == "lapsed")
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
        db.session.commit()
    return tokens


def _expected_api_status(
    credential: str, method: str, on_resource: bool, endpoint: str = ""
) -> int:
    """What each credential gets on a lock held by another token, same owner."""
    if credential in ("none", "expired", "revoked"):
        return 401
    if credential == "read-only" and method not in SAFE_METHODS:
        return 403
    if endpoint == "api.create_session":
        return 201  # a session of the caller's own, in no resource's scope
    if endpoint.endswith("_session"):
        return 400  # "job:1" is not a session id's form: nothing is looked up
    if credential == "another scope" and on_resource:
        return 403  # decided before the resource is looked up
    if credential == "read-only" and method not in SAFE_METHODS:
        return 403
    if method in SAFE_METHODS:
        return 200
    if endpoint == "api.release_set":
        return 200  # names what it did not hold (``not_held``), changes nothing
    # A valid token sending the holder's owner string is another owner.
    return {"POST": 409, "PATCH": 409, "DELETE": 403}[method]


@pytest.mark.usefixtures("backend")
def test_every_api_route_against_each_kind_of_token(csrf_app):
    """None, another scope, read-only, expired, revoked, and a valid token that
    sends the holder's owner string: every API route, on a lock held by another
    token. Only the holder's own token changes anything."""
    from app.auth.service import create_token

    with csrf_app.app_context():
        holder = {"Authorization": f"Bearer {create_token(HOLDER)}"}
    client = csrf_app.test_client()
    for resource in (RESOURCE, "report:1"):
        granted = client.post(
            f"/api/v1/locks/{resource}",
            json={"owner": OWNER, "ttl": 600},
            headers=holder,
        )
        assert granted.status_code == 200
    credentials = token_credentials(csrf_app)
    before = lock_state(csrf_app)
    checked = 0
    for credential, token in credentials.items():
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        for endpoint, method, url in api_routes(csrf_app):
            body = {"owner": OWNER}
            if method != "DELETE":
                body["ttl"] = 5
            # A set names its resources in the body: the held one.
            in_body = endpoint.endswith("_set")
            if in_body and method == "POST":
                body["members"] = [{"resource": RESOURCE}]
            elif in_body:
                body["resources"] = [RESOURCE]
            response = client.open(url, method=method, headers=headers, json=body)
            expected = _expected_api_status(
                credential, method, RESOURCE in url or in_body, endpoint
            )
            assert response.status_code == expected, (
                credential,
                endpoint,
                method,
                response.get_data(as_text=True),
            )
            if expected not in (200, 201):
                assert response.mimetype in (
                    "application/problem+json",
                    "application/json",  # a refused acquire names the holder
                )
            if credential == "another scope":
                # Nothing about job:1 leaks, whatever the route (the problem's
                # ``instance`` is the caller's own path, nothing learnt).
                shown = dict(response.get_json())
                shown.pop("instance", None)
                assert RESOURCE not in str(shown)
                assert OWNER not in str(shown) or expected in (200, 201)
                if expected == 200 and endpoint not in (
                    "api.list_freezes",
                    "api.create_session",
                ):
                    # The listings show the lock in scope (freezes list no locks).
                    assert "report:1" in str(shown)
            checked += 1
    assert checked >= 6 * 7
    assert lock_state(csrf_app) == before  # no credential but the holder's changed it

    # The holder's token: renew, re-acquire (same fence), release.
    path = f"/api/v1/locks/{RESOURCE}"
    renewed = client.patch(path, json={"owner": OWNER, "ttl": 60}, headers=holder)
    assert renewed.status_code == 200
    again = client.post(path, json={"owner": OWNER, "ttl": 60}, headers=holder)
    assert again.get_json()["lock"]["fence"] == before[0][1]
    released = client.delete(path, json={"owner": OWNER}, headers=holder)
    assert released.status_code == 204
