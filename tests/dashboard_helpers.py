"""Helpers for dashboard and auth tests: users, logging in through the real form."""

from __future__ import annotations

import json

from bs4 import BeautifulSoup
from flask import Flask
from flask.testing import FlaskClient

PASSWORD = "correct horse battery"


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


def poller_version(poller) -> str:
    """The version a live region's poller sends with each poll."""
    return json.loads(poller["hx-headers:inherited"])["Lockkeeper-Shown"]
