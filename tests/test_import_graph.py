"""Stockade's import graph, read statically (with `ast`) from the source tree: no import cycle
between its modules, none between its packages, and nothing below the platform packages imports
one of them.

What counts as an import of module B by module A:

- `import B` and `from B import name` anywhere in A: at module level (class bodies and `try`
  blocks included) and inside functions. A function-level ("lazy") import runs too, only later:
  a cycle through one is still a cycle at run time (it moves the failure from import to the
  first call, and makes it depend on import order), so lazy imports count exactly as the others;
- `from P import name` where P.name is a module counts as importing P.name;
- importing stockade.x.y also runs the `__init__` of each package above it (stockade.x, if it
  has one): those count as imported too, except A's own enclosing packages (being imported
  already when A runs);
- imports under `if TYPE_CHECKING:` never run, so they are not edges for the cycle check; they
  still count for the layer rule, since a lower layer has no business naming a platform's types.

The packages are stockade.<name>, a subpackage or a module of the top level; the top package
itself, the public façade (it names what every package offers, and any may read its
`__version__`), is none. Between packages every import counts, TYPE_CHECKING ones too: a
package that names another's types depends on it as much as one that runs its code. So the
packages form layers, each importing only those below it: errors, policy, then lifecycle (the
state directory, the ledger, change sets) and net, then launch (requests, the backend contract
and registry, the readiness probe and the report, the manager), then the platforms and
everything above them.

The layer rule: the lower layers (LOWER: errors, policy, launch, lifecycle, net) import no
platform package (PLATFORMS: linux, windows, vm, macos), in any of the ways above. Platforms
plug in through the registry (stockade/launch/registry.py), which loads each platform's
`registration` module by name, with importlib, on first use. That dynamic import is not an edge
here, and it is the only one allowed below the platforms; it cannot close a cycle at import
time because it runs only inside a function, and a registration module imports, at module
level, nothing but the lower layers (both checked below).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "stockade"
LOWER = ("stockade.errors", "stockade.policy", "stockade.launch", "stockade.lifecycle",
         "stockade.net")
PLATFORMS = ("stockade.linux", "stockade.windows", "stockade.vm", "stockade.macos")
REGISTRY = "stockade.launch.registry"  # the one dynamic import below the platforms
RUNS, LAZY, TYPING = "module level", "function level", "TYPE_CHECKING only"


@dataclass
class Graph:
    modules: dict[str, Path]  # every module of the tree, by name
    packages: set[str]  # the names with an __init__.py
    # (importer, imported) -> how: the set of RUNS, LAZY, TYPING
    edges: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    dynamic: dict[str, int] = field(default_factory=dict)  # module -> importlib/__import__ calls

    def runtime(self) -> dict[str, set[str]]:
        """What each module imports when it runs (module and function level)."""
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for (a, b), how in self.edges.items():
            if how - {TYPING}:
                out[a].add(b)
        return out


def read_graph(top: Path) -> Graph:
    """The import graph of the package at `top` (a directory named as the package)."""
    modules: dict[str, Path] = {}
    packages = set()
    for path in sorted(top.rglob("*.py")):
        parts = path.relative_to(top.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        modules[".".join(parts)] = path
    graph = Graph(modules, packages)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for how, imported in _imports(tree, name, name in packages):
            for target in _targets(graph, name, imported):
                if target != name:
                    graph.edges.setdefault((name, target), set()).add(how)
        calls = sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                                   "__import__"))
        if calls:
            graph.dynamic[name] = calls
    return graph


def _imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, str]]:
    """(how, name) for each module name an import statement of `tree` names; `from P import
    n` gives P.n (resolved against the tree later)."""
    def visit(node: ast.AST, how: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            here = how
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = TYPING if how == TYPING else LAZY
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                for inner in child.body:
                    yield from visit_one(inner, TYPING)
                for inner in child.orelse:
                    yield from visit_one(inner, how)
                continue
            yield from visit_one(child, here)

    def visit_one(node: ast.AST, how: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield how, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            yield how, base
            for alias in node.names:
                yield how, f"{base}.{alias.name}"
        else:
            yield from visit(node, how)

    yield from visit(tree, RUNS)


def _targets(graph: Graph, importer: str, name: str) -> list[str]:
    """The modules of the tree that importing `name` from `importer` runs: the module itself
    and the packages above it (not `importer`'s own); nothing for a name outside the tree or
    one that is not a module (`from P import function`)."""
    own = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    if name not in graph.modules or name in own:
        return []
    parts = name.split(".")
    above = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [p for p in above if p in graph.packages and p not in own] + [name]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of `graph`, once (a strongly connected component of more than one module,
    or a module importing itself), as a path that closes on its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(_path(graph, set(component)))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the component's first module, by breadth-first search inside it."""
    start = min(component)
    came = {start: start}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph[node] & component):
            if other == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if other not in came:
                came[other] = node
                queue.append(other)
    raise AssertionError(f"no cycle through {start}")


def package_graph(graph: Graph) -> dict[str, set[str]]:
    """Which package imports which (see the module's docstring), every import counted."""
    out: dict[str, set[str]] = {}
    for a, b in graph.edges:
        first, second = _package(a), _package(b)
        if first and second and first != second:
            out.setdefault(first, set()).add(second)
            out.setdefault(second, set())
    return out


def _package(module: str) -> str | None:
    """stockade.<name> for a module of it; None for the top package, the façade."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def _in(name: str, layers: tuple[str, ...]) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


def crossings(graph: Graph) -> list[str]:
    """Each import of a platform package by a lower layer, said as `importer -> imported
    (how)`."""
    return [f"{a} -> {b} ({', '.join(sorted(how))})" for (a, b), how in sorted(graph.edges.items())
            if _in(a, LOWER) and _in(b, PLATFORMS)]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_graph(SOURCE)


def test_the_reader_sees_the_imports_it_must(graph):
    # (so that an empty or misread graph cannot pass the tests below)
    assert len(graph.modules) > 150 and len(graph.edges) > 500
    assert RUNS in graph.edges[("stockade.api", "stockade.launch.manager")]
    assert LAZY in graph.edges[("stockade.launch.manager", "stockade.launch.probe")]
    assert graph.edges[("stockade.launch.backend", "stockade.launch.probe")] == {TYPING}
    assert LAZY in graph.edges[("stockade.cli.server", "stockade.cli.run")]  # (from P import m)
    assert ("stockade.cli.server", "stockade.cli") not in graph.edges  # (its own package)
    assert RUNS in graph.edges[("stockade.program", "stockade.cliwire")]
    assert ("stockade.linux.probe", "stockade.lifecycle") in graph.edges  # (its __init__ runs)


def test_no_module_imports_another_that_imports_it_back(graph):
    assert cycles(graph.runtime()) == []


def test_no_package_imports_another_that_imports_it_back(graph):
    between = package_graph(graph)
    assert {"stockade.launch", "stockade.lifecycle", "stockade.errors"} <= between.keys()
    assert cycles(between) == []


def test_no_lower_layer_imports_a_platform_package(graph):
    assert crossings(graph) == []


def test_only_the_registry_imports_by_name_below_the_platforms(graph):
    below = {name for name in graph.dynamic if _in(name, LOWER)}
    assert below == {REGISTRY}
    registry = ast.parse(graph.modules[REGISTRY].read_text())
    loaders = [node.name for node in registry.body if isinstance(node, ast.FunctionDef)
               and "import_module" in ast.unparse(node)]
    assert loaders == ["_load"]
    at_import = [ast.unparse(call) for node in registry.body
                 if not isinstance(node, ast.FunctionDef | ast.ClassDef)
                 for call in ast.walk(node) if isinstance(call, ast.Call)
                 and ast.unparse(call.func) in ("_load", "importlib.import_module")]
    assert at_import == []  # (it loads inside a function, on first use, never at import)


def test_each_platform_registers_itself_and_its_registration_imports_only_lower_layers(graph):
    from stockade.launch import registry

    registrations = {name for name in graph.modules if name.endswith(".registration")}
    assert registrations == {f"stockade.{package}.registration"
                             for package in registry.PLATFORMS}
    for name in sorted(registrations):
        runs = sorted(b for (a, b), how in graph.edges.items() if a == name and RUNS in how)
        assert runs and all(_in(b, LOWER) or b == "stockade" for b in runs), (name, runs)


# --- the reader on trees made to fail --------------------------------------------------------

def _tree(top: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = top / "stockade" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return top / "stockade"


def test_a_lazy_cycle_and_a_cycle_through_a_package_init_are_cycles(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "",
        "launch/manager.py": "def select():\n    from stockade.lifecycle import probe\n",
        "lifecycle/__init__.py": "",
        "lifecycle/probe.py": "from stockade.launch.manager import select\n",
        "cli/__init__.py": "from stockade.cli import tools\n",
        "cli/tools.py": "def run():\n    import stockade.program\n",
        "program.py": "from stockade.cli import main\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    import stockade.other\n",
        "other.py": "import stockade.typed\n",
    })
    found = cycles(read_graph(top).runtime())
    assert found == [["stockade.cli", "stockade.cli.tools", "stockade.program", "stockade.cli"],
                     ["stockade.launch.manager", "stockade.lifecycle.probe",
                      "stockade.launch.manager"]]


def test_packages_that_import_each_other_are_a_cycle_even_when_their_modules_are_not(tmp_path):
    # launch's backend contract names a lifecycle type; lifecycle's probe imports launch's
    # registry: no module imports one that imports it back, but the packages do. The façade
    # (the top package), which names everything and whose version anyone reads, closes none.
    top = _tree(tmp_path, {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from stockade.launch import backend\n__version__ = '0'\n",
        "errors.py": "from stockade import __version__\n",
        "launch/backend.py": "from typing import TYPE_CHECKING\nimport stockade.errors\n"
                             "if TYPE_CHECKING:\n    from stockade.lifecycle.report import Row\n",
        "launch/registry.py": "from stockade.launch import backend\n",
        "lifecycle/__init__.py": "",
        "lifecycle/report.py": "from stockade import __version__\n",
        "lifecycle/probe.py": "from stockade.launch import registry\n",
    })
    graph = read_graph(top)
    assert cycles(graph.runtime()) == []
    assert cycles(package_graph(graph)) == [["stockade.launch", "stockade.lifecycle",
                                             "stockade.launch"]]
    del graph.edges[("stockade.launch.backend", "stockade.lifecycle.report")]
    del graph.edges[("stockade.launch.backend", "stockade.lifecycle")]
    assert cycles(package_graph(graph)) == []


def test_a_lower_layer_naming_a_platform_is_a_crossing_even_lazily_or_typed(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "",
        "windows/__init__.py": "",
        "windows/admission.py": "",
        "linux/probe_child.py": "",
        "launch/compile.py": "from stockade.windows.admission import inside\n",
        "lifecycle/probe.py": "def launch():\n    from stockade.linux import probe_child\n",
        "lifecycle/report.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from stockade.windows import admission\n",
        "windows/backend.py": "from stockade.launch import compile\n",  # (upward: fine)
    })
    assert crossings(read_graph(top)) == [
        f"stockade.launch.compile -> stockade.windows ({RUNS})",
        f"stockade.launch.compile -> stockade.windows.admission ({RUNS})",
        f"stockade.lifecycle.probe -> stockade.linux.probe_child ({LAZY})",
        f"stockade.lifecycle.report -> stockade.windows ({TYPING})",
        f"stockade.lifecycle.report -> stockade.windows.admission ({TYPING})",
    ]


def test_the_source_tree_is_the_installed_package():
    import stockade

    assert Path(os.path.realpath(stockade.__file__)).parent == SOURCE
