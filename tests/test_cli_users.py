"""``lockkeeper users create``."""

from __future__ import annotations

from sqlalchemy import select

from app.auth.models import User
from app.auth.service import check_password
from app.extensions import db


def user(app, name):
    with app.app_context():
        return db.session.scalar(select(User).where(User.username == name))


def test_users_create_reads_password_from_stdin(app, runner):
    result = runner.invoke(
        args=["users", "create", "olga", "--role", "operator", "--password-stdin"],
        input="s3cret-enough\n",
    )
    assert result.exit_code == 0, result.output
    assert "Created operator 'olga'." in result.output
    created = user(app, "olga")
    assert created.role == "operator"
    assert check_password(created, "s3cret-enough")
    assert "s3cret-enough" not in created.password_hash


def test_users_create_prompts_twice_for_the_password(app, runner):
    result = runner.invoke(
        args=["users", "create", "vic"], input="long password\nlong password\n"
    )
    assert result.exit_code == 0, result.output
    assert user(app, "vic").role == "viewer"


def test_users_create_refuses_mismatched_prompt_answers(app, runner):
    result = runner.invoke(
        args=["users", "create", "vic"],
        input="long password\nother password\nlong password\nlong password\n",
    )
    assert "do not match" in result.output
    assert user(app, "vic") is not None


def test_users_create_rejects_unknown_role(app, runner):
    result = runner.invoke(
        args=["users", "create", "x", "--role", "admin", "--password-stdin"],
        input="long password\n",
    )
    assert result.exit_code == 2
    assert user(app, "x") is None


def test_users_create_rejects_short_password_and_duplicates(app, runner):
    short = runner.invoke(
        args=["users", "create", "olga", "--password-stdin"], input="short\n"
    )
    assert short.exit_code == 1
    assert "at least 8 characters" in short.output
    assert user(app, "olga") is None
    ok = ["users", "create", "olga", "--password-stdin"]
    assert runner.invoke(args=ok, input="long password\n").exit_code == 0
    again = runner.invoke(args=ok, input="long password\n")
    assert again.exit_code == 1
    assert "exists already" in again.output
