"""The README is a front page, and every document it leads to is there.

At most 8 KB; the two commands of a new machine first (install and start the
server on SQLite; install and run the tests); every document of docs/ in its map;
every relative link of the README, docs/, CONTRIBUTING.md, CHANGELOG.md and the
client's README leads to a file that exists and, with an anchor, to a heading of
that file; and the first five minutes' curl walk-through answers as it says.
(The manual's own examples are run where they are: tests/test_client.py,
tests/test_exec.py, tests/test_docs_run.py.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.paths import PROJECT_ROOT
from tests.databases import unavailable

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"

FIRST_LINES = (
    "# Lockkeeper\n"
    "\n"
    "```sh\n"
    "python3 -m venv .venv && .venv/bin/pip install -e ./client -e ./core -e . "
    "&& .venv/bin/lockkeeper run   # start on SQLite\n"
    "python3 -m venv .venv && .venv/bin/pip install -e ./client -e ./core -e '.[test]' "
    "&& .venv/bin/pytest -n 4  # run the tests\n"
    "```\n"
)

LINKED = (
    README,
    PROJECT_ROOT / "CONTRIBUTING.md",
    PROJECT_ROOT / "CHANGELOG.md",
    PROJECT_ROOT / "client" / "README.md",
    *sorted(DOCS.rglob("*.md")),
)

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def prose(text: str) -> str:
    """``text`` without its code blocks and code spans."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of the Markdown file ``path``:
    lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    found: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def test_the_readme_is_a_front_page_of_at_most_8_kb():
    assert len(README.read_bytes()) <= 8 * 1024


def test_the_readme_starts_with_the_two_commands_of_a_new_machine():
    assert README.read_text().startswith(FIRST_LINES)


def test_the_readme_maps_every_document_of_docs():
    targets = set(_LINK.findall(prose(README.read_text())))
    missing = [
        path.name
        for path in sorted(DOCS.glob("*.md"))
        if f"docs/{path.name}" not in targets
    ]
    assert not missing, f"docs/ files the README's map does not link: {missing}"


def test_the_slugs_are_githubs():
    assert anchors(DOCS / "deploy.md") >= {
        "4-running-gunicorn",
        "8-sizing",
        "workers-that-guard-their-own-writes-the-guards-privileges",
        "serving-in-production-gunicorn-gthread",
    }
    assert "a-workers-first-five-minutes" in anchors(README)


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_leads_to_a_file_and_a_heading(path):
    broken = []
    for target in _LINK.findall(prose(path.read_text())):
        if _SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no file {file_part}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, broken


def _curl_version(curl: str) -> tuple[int, int]:
    shown = subprocess.run(
        [curl, "--version"], capture_output=True, text=True, check=True
    ).stdout
    major, minor = re.match(r"curl (\d+)\.(\d+)", shown).groups()
    return int(major), int(minor)


def test_the_first_five_minutes_with_curl_answer_as_they_say(live_server, tmp_path):
    """The walk-through as written, against a live server; its first two lines
    (create a token, export it and the URL) are stood in for by the server's own
    token and URL."""
    curl = shutil.which("curl")
    if curl is None:
        unavailable("curl missing (apt-get install curl)")
    if _curl_version(curl) < (7, 82):
        unavailable("the walk-through's --json needs curl 7.82 or later")
    section = README.read_text().split("\n## A worker's first five minutes\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    create, export, *rest = block.splitlines()
    assert create.startswith(".venv/bin/lockkeeper tokens create ")
    assert export == (
        "export LOCKKEEPER_URL=http://127.0.0.1:5000 LOCKKEEPER_TOKEN=lk_..."
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "LOCKKEEPER_URL": live_server.url,
        "LOCKKEEPER_TOKEN": live_server.token,
    }
    result = subprocess.run(
        ["sh", "-e", "-c", "\n".join(rest)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r'^\{"acquired":true,"lock":\{[^}]*"fence":1,', out), out
    assert re.search(r"^HTTP/1\.[01] 409 ", out, re.M), out
    assert re.search(r"^Retry-After: [1-9][0-9]*\r?$", out, re.M), out
    assert re.search(r"^HTTP/1\.[01] 204 ", out, re.M), out
    events = out[out.index('{"events":') :]
    assert re.findall(r'"action":"(\w+)"', events) == [
        "released",
        "renewed",
        "acquired",
    ]
