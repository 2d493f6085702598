"""Helpers for dashboard and auth tests: users, logging in and posting forms as a
browser would. The ``operator`` and ``viewer`` fixtures (``conftest.py``) use them."""

from __future__ import annotations

import json

from bs4 import BeautifulSoup
from flask import Flask
from flask.testing import FlaskClient

PASSWORD = "correct horse battery"
HTMX = {"HX-Request": "true"}


def soup(response) -> BeautifulSoup:
    return BeautifulSoup(response.get_data(as_text=True), "html.parser")


def make_user(app: Flask, username: str, role: str = "operator") -> None:
    from app.auth.service import create_user

    with app.app_context():
        create_user(username, PASSWORD, role)


def csrf_token(client: FlaskClient, path: str = "/login") -> str:
    page = soup(client.get(path))
    return page.find("meta", attrs={"name": "csrf-token"})["content"]


def log_in(client: FlaskClient, username: str, password: str = PASSWORD, **extra):
    """Post the /login form as a browser would, with the token from the page."""
    token = csrf_token(client)
    return client.post(
        "/login",
        data={"username": username, "password": password, "csrf_token": token, **extra},
    )


def post(client: FlaskClient, url: str, data=None, htmx: bool = False):
    """Post an action form with the page's CSRF token; ``htmx`` as the dashboard's
    forms do, aiming at the action panel."""
    token = csrf_token(client, "/")
    headers = {**HTMX, "HX-Target": "div#action-panel"} if htmx else {}
    return client.post(url, data={"csrf_token": token, **(data or {})}, headers=headers)


def poller_version(poller) -> str:
    """The version a live region's poller sends with each poll."""
    return json.loads(poller["hx-headers:inherited"])["Lockkeeper-Shown"]
