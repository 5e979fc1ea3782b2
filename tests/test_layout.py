"""The package's layering, read from the source with ``ast`` (see docs/decisions.md, "Layout").

Layers, lowest first; a module may import its own layer and those below, never above:

    bottom     errors versions schema identity clock schemes options serialization
    helpers    _tasks _retry _frozen _redis _redis_sentinel _redis_schema _postgres _otel ring
               placement metrics trace_context tracing
    providers  directory/* membership/* storage/* streams/* messaging/* tables
               reminders/* (the storage side: model, spec, schedule, table, backends)
    grain      state outbox grain reference
    services   reminders/_service/* and reminders.service (the service), remindable/*
               (registry, declarations, management), observability, cluster_status
    runtime    runtime/* dashboard/* _prometheus
    hosts      client cli __main__ _cli_audit _cli_config _cli_output _cli_parser _cli_reminders
               _loop demo migration testing/* and the ``orleanspy`` facade

An edge is every ``import`` in a module: at the top (``top``), inside a function
(``lazy``: it runs the first time the function does, so it binds the layers as
firmly as a top-level one), or under ``if TYPE_CHECKING`` (``typing``: never
executed, so it cannot make an import cycle at run time, but it still couples
the layers, and the rules hold for it too). Importing ``a.b.c`` also runs the
``__init__`` of ``a`` and ``a.b``; those implicit edges are not counted (every
module would otherwise import the facade, which imports everything).

Where today's code breaks a rule, ``ALLOWED`` names the edge and why. The list
may only shrink: an entry no longer needed fails the test too.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import orleanspy

ROOT = Path(orleanspy.__file__).parent

LAYERS: list[tuple[str, str]] = [
    ("bottom", r"orleanspy\.(errors|versions|schema|identity|clock|schemes|options|serialization)"),
    (
        "helpers",
        r"orleanspy\.(_tasks|_retry|_frozen|_redis|_redis_sentinel|_redis_schema|_postgres|_otel"
        r"|ring|placement"
        r"|metrics|trace_context|tracing)",
    ),
    (
        "providers",
        r"orleanspy\.(directory|membership|storage|streams|messaging)(\..+)?"
        r"|orleanspy\.tables"
        # reminders/ but not its service (the folder _service/ and the module
        # that composes it); a backend may be a package (reminders/redis/...).
        r"|orleanspy\.reminders(\.(?!_?service(\.|$))[a-z_]+(\.[a-z_]+)?)?",
    ),
    ("grain", r"orleanspy\.(state|outbox|grain|reference)"),
    (
        "services",
        r"orleanspy\.reminders\.(service|_service(\..+)?)|orleanspy\.remindable(\..+)?"
        r"|orleanspy\.(observability|cluster_status)",
    ),
    ("runtime", r"orleanspy\.(runtime|dashboard)(\..+)?|orleanspy\._prometheus"),
    (
        "hosts",
        r"orleanspy(\.(client|cli|_cli_audit|_cli_config|_cli_output|_cli_parser|_cli_reminders"
        r"|_loop|demo|__main__|migration"
        r"|testing(\..+)?))?",
    ),
]

# What providers must not import: the runtime, its hosts, and the grain-facing API.
RUNTIME_AND_GRAIN_API = r"orleanspy\.(runtime(\..+)?|client|cli|grain|reference|testing(\..+)?)"

# Packages whose __init__ must import nothing, so that an optional backend's
# dependency (redis, asyncpg) loads only when that backend is chosen.
PROVIDER_PACKAGES = ("directory", "membership", "reminders", "storage", "streams")

ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # "top", "lazy" or "typing"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        if "_generated" in rel.parts:
            continue
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges_of(module: str, path: Path) -> set[Edge]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    top_level = {id(n) for n in tree.body}
    is_package = path.name == "__init__.py"
    edges: set[Edge] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            # ``from pkg import sub`` imports the submodule when there is one.
            names = [
                f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin
                for a in node.names
            ]
        else:
            continue
        if id(node) in typing_only:
            kind = "typing"
        elif id(node) in top_level:
            kind = "top"
        else:
            kind = "lazy"
        for name in names:
            target = _resolve(name) if name.startswith("orleanspy") else None
            if target is not None and target != module:
                edges.add(Edge(module, target, kind))
    return edges


EDGES = {edge for module, path in MODULES.items() for edge in _edges_of(module, path)}


def _layer(module: str) -> int:
    for index, (_, pattern) in enumerate(LAYERS):
        if re.fullmatch(pattern, module):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def test_every_module_imports() -> None:
    names = [
        info.name
        for info in pkgutil.walk_packages(orleanspy.__path__, "orleanspy.")
        if "._generated" not in info.name
    ]
    assert set(names) | {"orleanspy"} == set(MODULES)
    for name in names:
        importlib.import_module(name)


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = {
        (e.source, e.target): e.kind
        for e in EDGES
        if _layer(e.target) > _layer(e.source) and (e.source, e.target) not in ALLOWED
    }
    assert upward == {}


def test_providers_import_no_runtime() -> None:
    providers = [m for m in MODULES if LAYERS[_layer(m)][0] in ("bottom", "helpers", "providers")]
    assert providers
    bad = sorted(
        (e.source, e.target)
        for e in EDGES
        if e.source in providers
        and re.fullmatch(
            r"orleanspy\.(runtime(\..+)?|client|cli|grain|reference|testing.*)", e.target
        )
    )
    assert bad == []


def test_provider_packages_import_nothing_in_their_init() -> None:
    for package in PROVIDER_PACKAGES:
        tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
        imports = [
            ast.unparse(n)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and n.module != "__future__"
        ]
        assert imports == [], package


def _cycles(edges: set[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_at_run_time() -> None:
    assert _cycles({e for e in EDGES if e.kind != "typing"}) == []


def test_no_import_cycles_counting_type_only_imports() -> None:
    assert _cycles({e for e in EDGES if (e.source, e.target) not in ALLOWED}) == []


def test_the_allow_list_only_shrinks() -> None:
    present = {(e.source, e.target) for e in EDGES}
    assert sorted(set(ALLOWED) - present) == [], "remove entries the code no longer needs"


def test_the_checker_sees_a_planted_violation(tmp_path: Path) -> None:
    """The rules can fail: an upward import and a circle are both caught."""
    source = tmp_path / "errors.py"
    source.write_text("from orleanspy.runtime.silo import Silo\n", encoding="utf-8")
    planted = _edges_of("orleanspy.errors", source)
    assert Edge("orleanspy.errors", "orleanspy.runtime.silo", "top") in planted
    assert any(_layer(e.target) > _layer(e.source) for e in planted)
    circle = {Edge("orleanspy.a", "orleanspy.b", "top"), Edge("orleanspy.b", "orleanspy.a", "lazy")}
    assert _cycles(circle) == [["orleanspy.a", "orleanspy.b"]]


def test_reminder_backend_packages_are_providers_and_the_service_is_not() -> None:
    """The providers' pattern takes the backend packages' modules, never the service's."""
    assert LAYERS[_layer("orleanspy.reminders.redis.scripts")][0] == "providers"
    assert LAYERS[_layer("orleanspy.reminders.postgres.migrations")][0] == "providers"
    assert LAYERS[_layer("orleanspy.reminders._service.window")][0] == "services"
    assert LAYERS[_layer("orleanspy.reminders.service")][0] == "services"


def test_the_reminder_storage_side_imports_nothing_of_the_service() -> None:
    """The boundary inside reminders/ is the folder _service/ (and the module
    composing it): the storage side beside it never reaches in."""
    service = {
        m for m in MODULES if re.fullmatch(r"orleanspy\.reminders\.(service|_service(\..+)?)", m)
    }
    storage = {m for m in MODULES if m.startswith("orleanspy.reminders.") and m not in service}
    assert "orleanspy.reminders._service.window" in service
    assert "orleanspy.reminders.table" in storage
    assert (
        sorted((e.source, e.target) for e in EDGES if e.source in storage and e.target in service)
        == []
    )


# Each wire or store library is imported by its seam alone, which translates its
# errors; everything else goes through it. The Redis seam is ``_redis`` and the
# Sentinel client it builds (``_redis_sentinel``, no errors of its own to translate).
SEAMS: dict[str, set[str]] = {
    "asyncpg": {"orleanspy._postgres"},
    "redis": {"orleanspy._redis", "orleanspy._redis_sentinel"},
    "msgpack": {"orleanspy.serialization"},
    "grpc": {"orleanspy.messaging.grpc"},
    "prometheus_client": {"orleanspy._prometheus"},
    "opentelemetry": {"orleanspy._otel"},
}


def _third_party_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found


def test_each_wire_library_is_imported_by_its_seam_alone() -> None:
    importers: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for library in _third_party_imports(path) & set(SEAMS):
            importers[library].add(module)
    assert dict(importers) == SEAMS


def test_the_architecture_page_shows_this_layer_map() -> None:
    """docs/architecture.md draws LAYERS, in order: there is one map."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page[page.index("## 1. Layers") : page.index("\n## 2.")]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    assert rows[1:] == [name for name, _ in LAYERS]  # after the header row
    for module in ("schemes", "redis/", "reminders/_service/", "__main__"):
        assert f"`{module}" in section, module


def test_the_reminder_lua_scripts_are_one_copy_each() -> None:
    """Every Lua script of the Redis reminder table is written once and registered
    under one name: the table's own in ``reminders/redis/scripts.py``
    (``SCRIPTS``), the audit log's and the stores' beside the code that calls
    them (``AUDIT_SCRIPTS``, ``STORE_SCRIPTS``), and the shared fragments
    (named ``*LUA*``: no script of their own); no other module of
    ``reminders/`` holds Lua, and no two registered scripts are alike."""
    from orleanspy.reminders.redis import audit, scripts, stores

    registered = {
        "scripts": scripts.SCRIPTS,
        "audit": audit.AUDIT_SCRIPTS,
        "stores": stores.STORE_SCRIPTS,
    }
    for name, module in (("scripts", scripts), ("audit", audit), ("stores", stores)):
        texts = [
            v
            for k, v in vars(module).items()
            if isinstance(v, str) and "redis.call" in v and "LUA" not in k
        ]
        assert sorted(map(id, texts)) == sorted(map(id, registered[name].values())), name
    every = [text for table in registered.values() for text in table.values()]
    assert len(set(every)) == len(every), "two registered scripts are alike"
    assert len({n for table in registered.values() for n in table}) == len(every), "a name twice"
    holders = sorted(
        module
        for module, path in MODULES.items()
        if module.startswith("orleanspy.reminders") and "redis.call" in path.read_text()
    )
    assert holders == [f"orleanspy.reminders.redis.{m}" for m in ("audit", "scripts", "stores")]
