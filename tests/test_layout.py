"""The package's shape: a short top level, no import cycles, settings documented."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from app.paths import PROJECT_ROOT

APP = PROJECT_ROOT / "app"
CORE = PROJECT_ROOT / "core" / "src" / "lockkeeper_core"
CLIENT = PROJECT_ROOT / "client" / "src" / "lockkeeper_client"


def _module_name(path: Path) -> str:
    root = CORE.parent if CORE in path.parents else PROJECT_ROOT
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


OURS = ("app", "lockkeeper_core")


def _runtime_imports(tree: ast.Module, *, annotations: bool = False) -> list[str]:
    """Every ``app…`` or ``lockkeeper_core…`` name imported, at module level or
    in a function; imports under ``if TYPE_CHECKING:`` only serve annotations
    and are left out, unless ``annotations``."""
    annotation_only = {
        id(node)
        for branch in ast.walk(tree)
        if not annotations
        and isinstance(branch, ast.If)
        and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    names = []
    for node in ast.walk(tree):
        if id(node) in annotation_only:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return [name for name in names if name.partition(".")[0] in OURS]


@functools.cache
def import_graph(*, annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ``app`` and the lock core it imports (migrations
    excluded: Alembic loads them by path; ``annotations``: its imports for
    annotations too). Parsed once per run: callers only read it."""
    modules = {
        _module_name(path): path
        for path in [*APP.rglob("*.py"), *CORE.rglob("*.py")]
        if "migrations" not in path.relative_to(PROJECT_ROOT).parts
    }

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        imported = {
            owner(target) for target in _runtime_imports(tree, annotations=annotations)
        }
        graph[name] = {target for target in imported if target and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_top_of_app_has_at_most_eight_modules():
    modules = sorted(path.name for path in APP.glob("*.py"))
    assert len(modules) <= 8, modules


def test_app_has_no_import_cycles():
    assert cycles(import_graph()) == []


def test_app_has_no_import_cycles_even_for_annotations():
    """An import made only for an annotation still ties the two modules: the
    one annotated cannot be read (or moved) without the other."""
    assert cycles(import_graph(annotations=True)) == []


def test_no_module_of_the_lock_core_is_over_800_lines():
    """One concept per room: a module the size of the old ``LockService``
    (2,213 lines) cannot be read in one sitting."""
    long = {
        str(path.relative_to(CORE)): lines
        for path in CORE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 800
    }
    assert not long, long


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


# The lock service's parts, one concept each, built as a set by
# ``lockkeeper_core.service``.
PARTS = tuple(
    f"lockkeeper_core.{part}"
    for part in (
        "commands",
        "operator",
        "freezes",
        "reads",
        "lists",
        "counts",
        "sessions",
        "sets",
    )
)
FACES = ("app.api", "app.dashboard", "app.cli", "app.ops", "app.audit", "app.auth")
DIALECTS = tuple(
    f"lockkeeper_core.statements.{dialect}"
    for dialect in ("postgresql", "sqlite", "mariadb")
)
# The lock core's leaves: values, rules and tables, importing no other part of it.
LEAVES = tuple(
    f"lockkeeper_core.{leaf}"
    for leaf in (
        "clock",
        "columns",
        "engine",
        "errors",
        "models",
        "results",
        "rules",
        "state",
        "validation",
        "values",
    )
)
# What never imports what: (the importers, what none of them may import, why).
NEVER = [
    (
        ("lockkeeper_core",),
        FACES,
        "the lock core serves every face and is told about tokens (token_is_live)",
    ),
    (
        ("lockkeeper_core",),
        ("app",),
        "the core is a distribution of its own: a worker's own process runs it "
        "without Flask (tests/test_core_alone.py), beside a worker's own ``app`` "
        "package; the app wires it, not the other way round",
    ),
    (
        ("lockkeeper_core.queue", "lockkeeper_core.wakeups"),
        (
            "lockkeeper_core.service",
            "lockkeeper_core.statements",
            "lockkeeper_core.core",
            *PARTS,
        ),
        "the waiting line is handed its reads, its transaction and its attempt",
    ),
    (
        (
            *PARTS,
            "lockkeeper_core.core",
            "lockkeeper_core.service",
            "lockkeeper_core.queue",
        ),
        ("lockkeeper_core.embedded", "lockkeeper_core.wire"),
        "the embedded transport and the API's words are faces of the core, "
        "built on it: the core never calls back into them",
    ),
    (
        ("lockkeeper_core.core", "lockkeeper_core.filters"),
        (*PARTS, "lockkeeper_core.service"),
        "the core (and the lists' filters) is handed to the parts: it knows none",
    ),
    *(
        (
            (part,),
            (*(p for p in PARTS if p != part), "lockkeeper_core.service"),
            "one concept per room: a part is handed the core (and the line, or one "
            "read of another part), never imports another part or the set",
        )
        for part in PARTS
    ),
    *(
        ((dialect,), tuple(d for d in DIALECTS if d != dialect), "one dialect each")
        for dialect in DIALECTS
    ),
]


def _imports_of(importers: tuple[str, ...]) -> dict[str, set[str]]:
    return {
        name: targets
        for name, targets in import_graph().items()
        if any(name == i or name.startswith(i + ".") for i in importers)
    }


def test_what_never_imports_what():
    broken = []
    for importers, forbidden, why in NEVER:
        assert _imports_of(importers), importers
        for name, targets in _imports_of(importers).items():
            bad = sorted(
                t
                for t in targets
                if any(t == f or t.startswith(f + ".") for f in forbidden)
            )
            if bad:
                broken.append(f"{name} imports {bad}: {why}")
    assert broken == []


def test_the_lock_core_leaves_import_only_leaves():
    graph = import_graph()
    for leaf in LEAVES:
        assert graph[leaf] <= set(LEAVES), (leaf, graph[leaf] - set(LEAVES))


def test_the_waiting_line_does_not_import_the_service_even_for_annotations():
    source = (CORE / "queue.py").read_text()
    assert "lockkeeper_core.service" not in source


def test_the_client_never_imports_the_server():
    """The client is a distribution of its own, installed without the server:
    an import of ``app`` would fail there, or find the worker's own ``app``."""
    sources = sorted(CLIENT.rglob("*.py"))
    assert sources
    for path in sources:
        assert _runtime_imports(ast.parse(path.read_text())) == [], path


SETTING = re.compile(r"LOCKKEEPER_[A-Z0-9_]+")
# Tests and CI only: where the test suite finds its databases.
TEST_ONLY = re.compile(r"LOCKKEEPER_TEST_")


def test_the_configuration_docs_list_every_setting_the_code_reads():
    read = {
        setting
        for path in [*APP.rglob("*.py"), *CORE.rglob("*.py")]
        for setting in SETTING.findall(path.read_text())
        if not TEST_ONLY.match(setting)
    }
    readme = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
    table_rows = {
        match
        for line in readme.splitlines()
        if line.startswith("| `LOCKKEEPER_")
        for match in SETTING.findall(line.split("|")[1])
    }
    exec_environment = {"LOCKKEEPER_FENCE", "LOCKKEEPER_RESOURCE", "LOCKKEEPER_OWNER"}
    client_environment = {"LOCKKEEPER_URL", "LOCKKEEPER_TOKEN"}
    missing = read - table_rows - exec_environment - client_environment
    assert not missing, (
        f"read by the code, in no table of docs/configuration.md: {missing}"
    )
    assert (exec_environment | client_environment) <= set(SETTING.findall(readme))


def test_every_table_is_emptied_between_tests():
    """A table left out of ``tests.databases.TABLES`` keeps one test's rows for the
    next on PostgreSQL and MariaDB (a semaphore's holders once did)."""
    import lockkeeper_core.models  # noqa: F401

    import app.audit.models  # noqa: F401 - the tables of the models
    import app.auth.models  # noqa: F401
    from app.extensions import db
    from tests.databases import KEPT_TABLES, TABLES

    assert set(TABLES) | set(KEPT_TABLES) == set(db.metadata.tables)
    assert len(TABLES) == len(set(TABLES))
