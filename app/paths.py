"""Absolute paths of the project's top-level folders.

Flask joins relative template/static/instance folders to the package's root path,
and an installed package would put its instance folder under ``$PREFIX/var``; the
required layout keeps them at the top level of the checkout, so pass them absolute.
"""

import os
import stat
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = PROJECT_ROOT / "templates"
STATIC_DIR = PROJECT_ROOT / "static"
INSTANCE_DIR = PROJECT_ROOT / "instance"


def make_private_dir(path: Path) -> None:
    """Create ``path`` readable by its owner only (0700), or tighten ours to that.

    The instance folder holds the SQLite database (password and token hashes) and
    the secret key that signs sessions. A folder another user owns is left as it
    is: it was set up on purpose.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    restrict_to_owner(path, 0o700)


def make_private_file(path: Path) -> None:
    """Create ``path`` empty and owner-only (0600) unless it exists; tighten ours.

    SQLite creates a database's ``-wal`` and ``-shm`` files with the permissions of
    the database file, so creating the database file 0600 before SQLite opens it
    keeps all three private, whichever worker opens it first.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    restrict_to_owner(path, 0o600)


def restrict_to_owner(path: Path, mode: int) -> None:
    """``chmod mode`` if ``path`` exists, is ours, and others may read it."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, mode)
