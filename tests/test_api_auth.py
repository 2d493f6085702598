"""Bearer tokens guard every API endpoint but the OpenAPI document; the session
cookie of the dashboard never does."""

from __future__ import annotations

import pytest

from app.auth.service import revoke_token

PROTECTED = [
    ("POST", "/api/v1/locks/job:42"),
    ("GET", "/api/v1/locks/job:42"),
    ("PATCH", "/api/v1/locks/job:42"),
    ("DELETE", "/api/v1/locks/job:42"),
    ("GET", "/api/v1/locks"),
    ("GET", "/api/v1/locks/job:42/events"),
    ("GET", "/api/v1/events"),
]


def assert_unauthorized(response) -> None:
    assert response.status_code == 401
    assert response.mimetype == "application/problem+json"
    assert response.get_json()["status"] == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_request_without_token_is_401(client, method, path):
    assert_unauthorized(client.open(path, method=method, json={"owner": "w-1"}))


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer lk_not-a-real-token",
        "Bearer ",
        "Bearer",
        "Basic d29ya2VyOnNlY3JldA==",
        "Token {token}",
        "Bearer {token}x",
        "Bearer " + "x" * 10_000,
    ],
)
def test_request_with_a_bad_authorization_header_is_401(api, authorization):
    header = authorization.format(token=api.token)
    response = api.client.get("/api/v1/locks", headers={"Authorization": header})
    assert_unauthorized(response)


def test_bearer_scheme_is_case_insensitive(api):
    response = api.client.get(
        "/api/v1/locks", headers={"Authorization": f"bearer {api.token}"}
    )
    assert response.status_code == 200


def test_revoked_token_is_401(api):
    assert api.get("/api/v1/locks").status_code == 200
    with api.app.app_context():
        revoke_token("worker")
    assert_unauthorized(api.get("/api/v1/locks"))


def test_unauthorized_request_changes_nothing(api):
    response = api.client.post("/api/v1/locks/job:42", json={"owner": "w-1"})
    assert_unauthorized(response)
    assert api.get("/api/v1/locks").get_json()["locks"] == []


def test_session_cookie_is_not_a_credential(api):
    """Even a client holding a logged-in session needs a bearer token."""
    with api.client.session_transaction() as session:
        session["_user_id"] = "1"
        session["_fresh"] = True
    assert_unauthorized(api.client.get("/api/v1/locks"))


def test_the_api_never_answers_with_a_cookie_session(api):
    """A client holding a dashboard session cookie gets no cookie back from the
    API, nor a response that varies with it, even where a hook reads the session."""
    with api.client.session_transaction() as session:
        session["_user_id"] = "1"
        session["_remember"] = "set"
    for response in (
        api.post("/api/v1/locks/job:42", json={"owner": "w-1"}),
        api.get("/api/v1/locks/job:42"),
        api.client.get("/api/v1/locks"),  # 401: no token
    ):
        assert "Set-Cookie" not in response.headers
        assert "cookie" not in response.headers.get("Vary", "").lower()
    # The dashboard still has its cookie session.
    assert "Set-Cookie" in api.client.post("/login", data={}).headers


def test_api_needs_no_csrf_token(make_app):
    """CSRF is on in the app; the bearer-token API is exempt from it."""
    from tests.conftest import ApiClient

    app = make_app(WTF_CSRF_ENABLED=True)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/job:42", json={"owner": "w-1"}).status_code == 200


def test_openapi_document_needs_no_token(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.get_json()["openapi"].startswith("3.1")


def test_database_outage_is_a_503_problem_not_a_500(make_app):
    """Even the token check needs the database; when it does not answer, say so."""
    app = make_app(LOCKKEEPER_DATABASE_URL="postgresql://postgres@127.0.0.1:1/gone")
    response = app.test_client().get(
        "/api/v1/locks", headers={"Authorization": "Bearer lk_anything"}
    )
    assert response.status_code == 503
    assert response.mimetype == "application/problem+json"
    assert response.headers["Retry-After"] == "1"
