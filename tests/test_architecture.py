"""The layers only look down: which of planner's packages may import which (docs/architecture.md).

Every module under planner/ is parsed with ``ast`` (nothing is imported); every ``import`` and ``from``
statement is collected, function-local ones and ``import_module("planner....")`` calls included, and each
target is mapped to its top-level part of planner (``planner.cost.sparse`` -> ``cost``, ``planner.types`` ->
``types``). The rules below name what a package must not import; an edge that breaks one fails here with
its file and line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "planner"

# package -> the packages it must not import. cost/ and search/ see dense models only: the sparse tables
# reach embeddings/ through compose.py, the one module that knows both (search/ calls it as its entry).
FORBIDDEN: dict[str, frozenset[str]] = {
    "cost": frozenset({"embeddings", "compose", "search", "report", "export", "commands"}),
    "search": frozenset({"embeddings", "report", "export", "commands"}),
    "graph": frozenset({"cost", "search", "embeddings", "compose", "report", "export", "commands"}),
    "hardware": frozenset({"cost", "search", "embeddings", "compose", "report", "export", "commands"}),
}
# only the command line reaches the commands
COMMANDS_IMPORTERS = frozenset({"cli", "commands"})
# the modules at the top of planner/ that import a package, and which; cli.py and compose.py may import any
TOP_LEVEL_IMPORTS: dict[str, frozenset[str]] = {"rules": frozenset({"hardware"}), "plans": frozenset({"hardware"})}
ANY_PACKAGE = frozenset({"cli", "compose"})
PACKAGES = frozenset(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())

# (importing module, imported part) pairs known to break a rule, each with the reason it is tolerated;
# none today
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    module: str  # importing module, dotted ("planner.cost.sparse")
    part: str  # top-level part of planner it imports ("embeddings", "types", ...)
    where: str  # file:line of the statement


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str | None:
    """The top-level part of planner a dotted name lies in; None outside planner or for the package itself."""
    names = module.split(".")
    if names[0] != "planner" or len(names) < 2:
        return None
    return names[1]


def _import_module_target(node: ast.Call) -> str | None:
    """``import_module("planner.x")`` or ``import_module(f"planner.x.{name}")``: the literal part, else None."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name != "import_module" or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.JoinedStr) and first.values:
        first = first.values[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value.rstrip(".")
    return None


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted modules one import statement reaches (``from planner import x`` reaches ``planner.x``)."""
    if isinstance(node, ast.Call):
        target = _import_module_target(node)
        return [target] if target else []
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: resolve against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1])
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    if source == "planner":
        return [f"planner.{alias.name}" for alias in node.names]
    return [source]


def _edges() -> list[Edge]:
    edges: list[Edge] = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # walks function bodies too: local imports count
            for target in _targets(node, module, path.name == "__init__.py"):
                part = _part(target)
                if part is not None:
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    edges.append(Edge(module, part, where))
    return edges


EDGES = _edges()


def _broken(edge: Edge) -> bool:
    own = _part(edge.module)
    if own is None or own == edge.part:
        return False
    if edge.part == "commands" and own not in COMMANDS_IMPORTERS:
        return True
    return edge.part in FORBIDDEN.get(own, frozenset())


def test_the_scan_sees_the_imports():
    """The parser finds top-level, function-local, ``from planner import x`` and ``import_module`` imports."""
    seen = {(e.module, e.part) for e in EDGES}
    assert ("planner.cli", "commands") in seen  # import_module(f"planner.commands.{name}")
    assert ("planner.search.space", "rules") in seen  # ``from planner import rules``
    assert ("planner.sweep.whatif", "graph") in seen  # a function-local import
    assert ("planner.report.table", "units") in seen


@pytest.mark.parametrize("package", sorted(FORBIDDEN) + ["commands"])
def test_package_imports_only_downwards(package: str):
    broken = [e for e in EDGES if _broken(e) and (e.module, e.part) not in ALLOWED
              and (_part(e.module) == package or (package == "commands" and e.part == "commands"))]
    assert not broken, "\n".join(f"{e.where}: {e.module} imports planner.{e.part}" for e in broken)


def test_allowed_entries_name_edges_a_rule_forbids():
    """An allow-list entry excuses a rule-breaking edge; one for an edge the rules allow is a mistake."""
    for module, part in ALLOWED:
        assert _broken(Edge(module, part, "")), f"{module} -> {part} breaks no rule; drop it from ALLOWED"


def test_architecture_doc_names_only_paths_that_exist():
    """docs/architecture.md describes the tree as it is: every path it names under planner/ exists."""
    text = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(planner/[\w/.]*?)/?`", text)) | set(re.findall(r"\bplanner/[\w/]+\.py\b", text))
    missing = sorted(p for p in named if not (ROOT.parent / p).exists())
    assert named and not missing, missing


def test_top_level_modules_import_only_the_packages_the_doc_names():
    """docs/architecture.md: apart from cli.py and compose.py, only rules.py and plans.py import a package
    (hardware/); every other module at the top of planner/ imports modules beside it only."""
    broken = [e for e in EDGES
              if e.module.count(".") == 1 and e.part in PACKAGES and _part(e.module) not in PACKAGES
              and _part(e.module) not in ANY_PACKAGE
              and e.part not in TOP_LEVEL_IMPORTS.get(_part(e.module) or "", frozenset())]
    assert not broken, "\n".join(f"{e.where}: {e.module} imports planner.{e.part}" for e in broken)
    assert {"graph", "hardware", "cost", "search", "embeddings"} <= PACKAGES
