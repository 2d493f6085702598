"""Absolute paths of the project's top-level folders.

Flask joins relative template/static/instance folders to the package's root path,
and an installed package would put its instance folder under ``$PREFIX/var``; the
required layout keeps them at the top level of the checkout, so pass them absolute.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = PROJECT_ROOT / "templates"
STATIC_DIR = PROJECT_ROOT / "static"
INSTANCE_DIR = PROJECT_ROOT / "instance"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
