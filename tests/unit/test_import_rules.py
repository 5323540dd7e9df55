"""Who may import whom, read from the source with `ast` (no module is imported): the
three packages of DESIGN.md (`schema` imports none of ours; `engine` and `gateway` never
import each other), the gateway's packages in one direction (gateway/__init__.py says
which), and no import cycle in the gateway or in viewgate/bench. Imports inside
functions and under `if TYPE_CHECKING:` count too: they are arrows all the same."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("schema", "engine", "gateway", "viewgate")

# The gateway's packages, lowest first, and what each may import besides itself.
GATEWAY_MAY_IMPORT: dict[str, set[str]] = {
    "ops": set(),
    "reads": {"ops"},
    "access": {"reads", "ops"},
    "types": {"access", "reads", "ops"},
    "http": {"types", "access", "reads", "ops"},
    "subscriptions": {"types", "access", "reads", "ops"},
    "compiled": {"http", "types", "access", "reads", "ops"},
}
# Modules at the top of gateway/: they wire the packages; nothing in the gateway imports them.
GATEWAY_TOP = {"gateway", "gateway.app", "gateway.baseline"}
# Top-level packages of ours each may import (DESIGN.md, "who may import whom").
REPO_MAY_IMPORT: dict[str, set[str]] = {
    "schema": set(),
    "engine": {"schema"},
    "gateway": {"schema"},
}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted name of the importing module
    imported: str  # dotted name of the module of ours it imports
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path) -> dict[str, Path]:
    files = {}
    for top in OURS:
        for path in sorted((root / top).rglob("*.py")):
            if not any(part.startswith(".") or part == "__pycache__" for part in path.parts):
                files[module_name(path, root)] = path
    return files


def resolve(name: str, modules: set[str]) -> str | None:
    """The module of ours `name` is or lies in (`pkg.mod.attr` -> `pkg.mod`), else None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: set[str], root: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    where = path.relative_to(root)
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` mod.
            names = [f"{prefix}.{alias.name}" for alias in node.names]
        for name in names:
            if name.split(".")[0] in OURS:
                found = resolve(name, modules)
                if found is not None and found != module:
                    yield Import(module, found, f"{where}:{node.lineno}")


def all_imports(root: Path = ROOT) -> list[Import]:
    files = source_files(root)
    modules = set(files)
    return [imp for module, path in files.items()
            for imp in imports_of(module, path, modules, root)]


def gateway_package(module: str) -> str | None:
    """`gateway.reads.lists` -> `reads`; None for the modules at the top."""
    if module in GATEWAY_TOP:
        return None
    return module.split(".")[1]


def repo_violations(imports: list[Import]) -> list[str]:
    wrong = []
    for imp in imports:
        src, dst = imp.importer.split(".")[0], imp.imported.split(".")[0]
        if src in REPO_MAY_IMPORT and src != dst and dst not in REPO_MAY_IMPORT[src]:
            allowed = ", ".join(sorted(REPO_MAY_IMPORT[src])) or "nothing of ours"
            wrong.append(f"{imp}: {src}/ may import {allowed}")
    return wrong


def gateway_violations(imports: list[Import], modules: set[str]) -> list[str]:
    wrong = []
    for module in sorted(m for m in modules if m.startswith("gateway.")):
        if module not in GATEWAY_TOP and gateway_package(module) not in GATEWAY_MAY_IMPORT:
            wrong.append(f"{module}: not in a package of GATEWAY_MAY_IMPORT (gateway/ holds "
                         "app.py and baseline.py at the top, everything else in a package "
                         "with a rule)")
    for imp in imports:
        if not (imp.importer.startswith("gateway.") and imp.imported.startswith("gateway")):
            continue
        if imp.imported in GATEWAY_TOP:
            wrong.append(f"{imp}: nothing in the gateway imports {imp.imported} (only entry "
                         "points and tests do)")
            continue
        src, dst = gateway_package(imp.importer), gateway_package(imp.imported)
        if src is None or src == dst:
            continue
        allowed = GATEWAY_MAY_IMPORT.get(src, set())
        if dst not in allowed:
            wrong.append(f"{imp}: gateway.{src} may import "
                         f"{', '.join(sorted(allowed)) or 'nothing else of the gateway'}")
    return wrong


def cycles(imports: list[Import], prefix: str) -> list[list[str]]:
    """The import cycles among modules under `prefix`: each strongly connected component
    of more than one module (or a module importing itself), as a list of its modules."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.importer.startswith(prefix) and imp.imported.startswith(prefix):
            graph.setdefault(imp.importer, set()).add(imp.imported)
            graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def test_schema_engine_and_gateway_import_only_what_design_allows(imports):
    wrong = repo_violations(imports)
    assert not wrong, "\n".join(wrong)


def test_gateway_packages_import_one_way(imports):
    wrong = gateway_violations(imports, set(source_files(ROOT)))
    assert not wrong, "\n".join(wrong)


def test_the_gateway_has_no_import_cycle(imports):
    found = cycles(imports, "gateway.")
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_bench_has_no_import_cycle(imports):
    found = cycles(imports, "viewgate.bench.")
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_gateway_package_says_what_it_may_import():
    for package in GATEWAY_MAY_IMPORT:
        doc = ast.get_docstring(ast.parse((ROOT / "gateway" / package / "__init__.py")
                                          .read_text()))
        assert doc and "May import" in doc, f"gateway/{package}/__init__.py"


# The checks themselves, on a tree written here: each rule catches what it is for.

def _tree(tmp_path: Path, files: dict[str, str]) -> list[Import]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return all_imports(tmp_path)


def test_the_rules_catch_bad_imports(tmp_path):
    imports = _tree(tmp_path, {
        "schema/__init__.py": "",
        "schema/catalog.py": "from engine import runner\n",
        "engine/__init__.py": "",
        "engine/runner.py": "def f():\n    from gateway.reads.reads import Reads\n",
        "gateway/__init__.py": "",
        "gateway/app.py": "from gateway.http.http import GraphQLHTTP\n",
        "gateway/reads/__init__.py": "",
        "gateway/reads/reads.py": "from ..http import http\nfrom gateway import app\n",
        "gateway/http/__init__.py": "",
        "gateway/http/http.py": "from gateway.reads.reads import Reads\nimport engine.runner\n",
        "gateway/extras/__init__.py": "",
    })
    modules = set(source_files(tmp_path))
    assert [line.split(": ", 1)[0] for line in repo_violations(imports)] == [
        "schema/catalog.py:1", "engine/runner.py:2", "gateway/http/http.py:2"]
    wrong = gateway_violations(imports, modules)
    assert any(w.startswith("gateway.extras: not in a package") for w in wrong)
    assert any("gateway/reads/reads.py:1: gateway.reads.reads imports gateway.http.http: "
               "gateway.reads may import ops" in w for w in wrong)
    assert any("gateway/reads/reads.py:2" in w and "nothing in the gateway imports "
               "gateway.app" in w for w in wrong)
    assert not any("gateway/http/http.py" in w for w in wrong)  # http may import reads
    assert cycles(imports, "gateway.") == [  # reads -> app -> http -> reads
        ["gateway.app", "gateway.http.http", "gateway.reads.reads"]]
