"""chunkernels' imports run one way: down the layers, never in a circle (issue #19).

Every module of the package is read with ``ast``, nothing is imported: imports at module level,
inside functions and classes (``TYPE_CHECKING`` blocks too), relative imports, and
``importlib.import_module`` / ``__import__`` called with a literal name. Names built at run time
are not followed (the kernels package finding its modules, ``bench`` loading its benchmarks);
both stay inside one layer.

The rules, checked on that graph:

* no cycle;
* no module imports one of a higher layer (:data:`LAYERS`);
* no module imports a private name (``_name``) of a module of a lower layer: a layer uses the
  ones below through their public names;
* nothing imports Dask's private modules (``dask._*``), and in the library (below the tools)
  only :data:`GRAPH` imports its task graph modules.

``chunkernels/__init__.py`` is exempt as the face: it imports from every layer and wires what a
lower layer must not import itself (it hands the registry the built-in kernels' provider).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "chunkernels"
FACE = "chunkernels"

#: The layers, bottom up: a module imports from its own layer and the ones below. Modules are
#: named by their first component under ``chunkernels`` (a package stands for all its modules).
LAYERS = (
    ("0 base", ("_errors", "_cache", "_imports", "_worker_plugin")),
    ("1 registry", ("_registry",)),
    ("2 launch", ("cuda", "layout", "_dispatch", "interop", "_kind", "_xarray")),
    ("2s shared parameters", ("_shared",)),
    ("3 graph", ("cluster", "_halo", "_graph", "_apply", "_pipeline")),
    ("4 kernels", ("kernels",)),
    ("5 front ends", ("ndimage", "signal", "metrics", "sources", "skimage_backend")),
    ("6 tools", ("testing", "check", "_cli_args", "bench", "demo")),
    ("6 tools: the command, on top of the others", ("cli", "__main__")),
)
#: The one module of the library that builds task graphs, and Dask's modules it alone imports
#: (the tools may read graphs with them: ``testing.graph_on_a_cluster``).
GRAPH = "chunkernels._graph"
GRAPH_MODULES = ("dask.task_spec", "dask.highlevelgraph")
#: The face may be imported by the tools (``import chunkernels; chunkernels.apply(...)``), by
#: nothing below them: a kernel reaching the API through it would import every layer.
FACE_LAYER = "6 tools"

@dataclass(frozen=True)
class Import:
    """One import of ``target`` by ``importer`` (``name``: the name taken from ``target``, or
    None where the module itself is imported)."""

    importer: str
    target: str
    name: str | None
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(PACKAGE.parent)}:{self.line}"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` by its dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(known: dict[str, Path]) -> list[Import]:
    """The imports of every module in ``known``, as :class:`Import` records."""
    found = []
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target, name in _targets(node, package, known):
                found.append(Import(module, target, name, path, node.lineno))
    return found


def _targets(node, package: str, known):
    """``(module, name or None)`` pairs that ``node`` imports."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield _module_of(alias.name, known), None
    elif isinstance(node, ast.ImportFrom):
        base = _absolute(node.module or "", node.level, package)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in known:
                yield submodule, None
            else:
                yield _module_of(base, known), alias.name
    elif isinstance(node, ast.Call) and node.args and _is_import_call(node.func):
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            name = first.value.lstrip(".")
            anchor = next((k.value.value for k in node.keywords if k.arg == "package"
                           and isinstance(k.value, ast.Constant)), package)
            level = len(first.value) - len(name)  # import_module(".name", package="...")
            yield _module_of(_absolute(name, level, anchor), known), None


def _absolute(name: str, level: int, package: str) -> str:
    """``name`` imported ``level`` packages up from ``package`` (``level`` 0: as it is)."""
    if not level:
        return name
    parts = package.split(".")
    return ".".join(parts[:len(parts) - level + 1] + ([name] if name else []))


def _is_import_call(func) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def _module_of(name: str, known) -> str:
    """The module ``import name`` runs last: ``name`` itself, or for a name inside the package
    that is no module of it, its longest prefix that is."""
    if not name.startswith(f"{FACE}.") or name in known:
        return name
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of ``module``'s layer (the face: :data:`FACE_LAYER`'s)."""
    if module == FACE:
        return _index(FACE_LAYER)
    head = module.split(".")[1]
    for i, (_, members) in enumerate(LAYERS):
        if head in members:
            return i
    raise LookupError(module)


def _index(name: str) -> int:
    """Index in :data:`LAYERS` of the layer called ``name``."""
    return next(i for i, (layer, _) in enumerate(LAYERS) if layer == name)


def label(module: str) -> str:
    if module == FACE:
        return f"{FACE} (the face: for layer {FACE_LAYER} only)"
    return f"{module} (layer {LAYERS[layer_of(module)][0]})"


def _internal(edge: Import) -> bool:
    return edge.target == FACE or edge.target.startswith(f"{FACE}.")


class Graph(list):
    """The imports, shown by their number in a failure's traceback (not one by one)."""

    def __repr__(self) -> str:
        return f"<{len(self)} imports>"


@pytest.fixture(scope="module")
def graph() -> Graph:
    """The package's imports, the face's own left out (it may import anything)."""
    return Graph(edge for edge in imports(modules()) if edge.importer != FACE)


def _lines(edges, describe) -> str:
    """One line per import statement (not per name it takes)."""
    seen = {}
    for e in edges:
        seen.setdefault((e.where(), e.importer, e.target), []).append(e)
    return "\n".join(describe(found[0], sorted({e.name for e in found if e.name}))
                     for found in seen.values())


# -- the rules -------------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in modules() if m != FACE and _layer_or_none(m) is None)
    assert not unplaced, (
        f"modules in no layer: {', '.join(unplaced)}; add each (its first name under "
        f"chunkernels) to LAYERS in {Path(__file__).name}, in the lowest layer whose modules "
        f"it needs")


def _layer_or_none(module):
    try:
        return layer_of(module)
    except LookupError:
        return None


def test_no_import_runs_up_a_layer(graph):
    wrong = [edge for edge in graph if _internal(edge)
             and None not in (_layer_or_none(edge.importer), _layer_or_none(edge.target))
             and layer_of(edge.importer) < layer_of(edge.target)]
    assert not wrong, "imports that run up a layer (a module imports only from its own layer " \
        "and the ones below; move what both need below the lower one, e.g. parameter rules to " \
        "chunkernels/_shared):\n" + _lines(wrong, lambda e, names: (
            f"  {e.where()}: {label(e.importer)} imports {label(e.target)}"
            + (f": {', '.join(names)}" if names else "")))


def test_no_import_cycle(graph):
    edges: dict[str, dict[str, list[Import]]] = {}
    for edge in graph:
        if _internal(edge) and edge.target != edge.importer:
            edges.setdefault(edge.importer, {}).setdefault(edge.target, []).append(edge)
    cycles = [group for group in _strongly_connected(edges) if len(group) > 1]
    assert not cycles, "import cycles (each module reaches the others and itself again):\n" + \
        "\n".join(_describe_cycle(group, edges) for group in cycles)


def test_no_private_name_from_a_lower_layer(graph):
    wrong = [edge for edge in graph if _internal(edge) and edge.name is not None
             and edge.name.startswith("_") and not edge.name.startswith("__")
             and edge.target != FACE
             and None not in (_layer_or_none(edge.importer), _layer_or_none(edge.target))
             and layer_of(edge.importer) > layer_of(edge.target)]
    assert not wrong, "private names taken from a lower layer (make the name public in its " \
        "module, or move what needs it):\n" + _lines(wrong, lambda e, names: (
            f"  {e.where()}: {label(e.importer)} imports {', '.join(names)} from "
            f"{label(e.target)}"))


def test_nothing_imports_private_dask(graph):
    wrong = [edge for edge in graph if edge.target.split(".")[0] == "dask"
             and any(part.startswith("_") for part in edge.target.split(".")[1:])]
    assert not wrong, "imports of Dask's private modules (use its public API: dask.task_spec, " \
        "dask.highlevelgraph, dask.array):\n" + _lines(wrong, lambda e, names: (
            f"  {e.where()}: {e.importer} imports {e.target}"
            + (f": {', '.join(names)}" if names else "")))


def test_only_the_graph_module_touches_dask_task_graphs(graph):
    wrong = [edge for edge in graph if edge.target in GRAPH_MODULES and edge.importer != GRAPH
             and _layer_or_none(edge.importer) is not None
             and layer_of(edge.importer) < _index("6 tools")]
    assert not wrong, f"task graphs are built by {GRAPH} alone (its functions describe the " \
        f"tasks; nothing else imports {' or '.join(GRAPH_MODULES)}):\n" + _lines(
            wrong, lambda e, names: f"  {e.where()}: {e.importer} imports {e.target}"
            + (f": {', '.join(names)}" if names else ""))


def _strongly_connected(edges) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph ``edges`` (iterative)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(sorted(group))
    return groups


def _describe_cycle(group, edges) -> str:
    members = set(group)
    lines = [f"  cycle of {len(group)}: {', '.join(label(m) for m in group)}"]
    for importer in group:
        for target, found in sorted(edges.get(importer, {}).items()):
            if target in members:
                names = sorted({e.name for e in found if e.name})
                lines.append(f"    {found[0].where()}: {importer} imports {target}"
                             + (f" ({', '.join(names)})" if names else ""))
    return "\n".join(lines)


# -- the walk itself ------------------------------------------------------------------------------


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """Imports inside functions, relative imports and ``import_module`` calls with a literal name
    are all edges; names built at run time are not."""
    package = tmp_path / "chunkernels"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("VALUE = 1\n_PRIVATE = 2\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text(
        "import importlib\n"
        "from .. import low\n"
        "from ..low import _PRIVATE\n"
        "def f(name):\n"
        "    from chunkernels.sub import other\n"
        "    import chunkernels.low as renamed\n"
        "    importlib.import_module('chunkernels.sub.other')\n"
        "    importlib.import_module(f'chunkernels.{name}')\n"
        "    importlib.import_module('.low', package='chunkernels')\n"
        "    return __import__('dask._task_spec')\n")
    (package / "sub" / "other.py").write_text("from . import mod\n")
    known = modules(package)
    found = {(e.importer, e.target, e.name, e.line) for e in imports(known)}
    mod, other = "chunkernels.sub.mod", "chunkernels.sub.other"
    assert found == {
        (mod, "importlib", None, 1),
        (mod, "chunkernels.low", None, 2),
        (mod, "chunkernels.low", "_PRIVATE", 3),
        (mod, other, None, 5),
        (mod, "chunkernels.low", None, 6),
        (mod, other, None, 7),
        (mod, "chunkernels.low", None, 9),
        (mod, "dask._task_spec", None, 10),
        (other, mod, None, 1),
    }
    edges = {}
    for e in imports(known):
        if e.target.startswith("chunkernels"):
            edges.setdefault(e.importer, {}).setdefault(e.target, []).append(e)
    assert [g for g in _strongly_connected(edges) if len(g) > 1] == [[mod, other]]
