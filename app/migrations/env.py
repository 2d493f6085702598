"""Alembic environment, run by Flask-Migrate inside an app context."""

from alembic import context
from flask import current_app

config = context.config
database = current_app.extensions["migrate"].db


def run_migrations_offline() -> None:
    context.configure(
        url=database.engine.url, target_metadata=database.metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    configure_args = current_app.extensions["migrate"].configure_args
    with database.engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=database.metadata, **configure_args
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
