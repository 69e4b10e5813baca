"""Every name the tests, benchmarks, examples and docs take from a chunkernels module exists there,
and every patch of one reaches the code that reads it.

The GPU tests and the benchmarks reach into kernels' private names (``label``'s merge, its forest,
its task bodies). They skip without a device, so a name that moved to another module would only
fail on a GPU. This test reads the code with ``ast`` (nothing of it runs) and imports only the
chunkernels modules it names, on any machine:

* every ``module.attribute`` read, for a name bound to a chunkernels module (``import``, ``from
  ... import``, at module level or inside functions): the attribute exists (and, where it is a
  class, the attribute read from it too);
* every ``from chunkernels.x import name``: ``name`` exists;
* every ``monkeypatch.setattr(module, "name", ...)`` and ``mock.patch.object(module, "name", ...)``
  of a chunkernels module: ``name`` exists, and code reads it through that module (a global of the
  module's own code, or ``module.name`` elsewhere), so that the patch changes something. A name a
  package only re-exports is read where it is defined: patching the package changes nothing;
* every dotted name ``chunkernels.x.y`` written in the docs, comments and docstrings (``.py``,
  ``.md``, ``.cu``, ``.cuh``) resolves.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import sys
import tokenize
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "chunkernels"
#: Where code that uses chunkernels lives.
CODE = ("chunkernels", "tests", "examples", "docs")
#: Where dotted names are written in prose too.
TEXT = (*CODE, "kernels_cuda", "README.md")
TEXT_SUFFIXES = (".py", ".md", ".cu", ".cuh")
DOTTED = re.compile(r"(?<![\w./-])chunkernels(?:\.[A-Za-z_]\w*)+")
PATCHERS = {"setattr", "object"}  # monkeypatch.setattr(obj, "name"), mock.patch.object(obj, "name")
#: Names written in prose for any name (``chunkernels.NAME``).
PLACEHOLDERS = {"NAME"}
SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def python_files() -> list[Path]:
    return sorted(p for top in CODE for p in (ROOT / top).rglob("*.py")
                  if ".venv" not in p.parts and "site" not in p.parts)


def module_name(path: Path) -> str | None:
    """The dotted name of a module of the package, else None."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] != PACKAGE:
        return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_modules: dict[str, ModuleType | None] = {}


def load(name: str) -> ModuleType | None:
    """The chunkernels module ``name`` (imported), or None where ``name`` is no module."""
    if name not in _modules:
        try:
            _modules[name] = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the module exists but imports something missing: a real failure
            _modules[name] = None
    return _modules[name]


def is_module(name: str) -> bool:
    return name.startswith(PACKAGE) and load(name) is not None


class Use:
    """One name taken from a chunkernels module: ``kind`` is ``"read"``, ``"import"`` or
    ``"patch"``."""

    def __init__(self, kind, module, chain, path, line):
        self.kind, self.module, self.chain = kind, module, tuple(chain)
        self.path, self.line = path, line

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def text(self) -> str:
        return ".".join((self.module, *self.chain))


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    own = module_name(path) or ""
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _bindings(scope, path) -> tuple[dict[str, str], set[str], list[Use]]:
    """A scope's names bound to chunkernels modules, its other bound names (which hide an outer
    module of the same name), and its ``from chunkernels... import name`` of attributes."""
    modules, others, imported = {}, set(), []
    if not isinstance(scope, ast.Module):
        args = scope.args
        others |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                   *filter(None, (args.vararg, args.kwarg)))}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # "import a.b as c" binds c to a.b; "import a.b" binds a
                bound, target = ((alias.asname, alias.name) if alias.asname
                                 else (alias.name.split(".")[0],) * 2)
                if is_module(target):
                    modules[bound] = target
                else:
                    others.add(bound)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path)
            for alias in node.names:
                bound = alias.asname or alias.name
                if is_module(f"{base}.{alias.name}"):
                    modules[bound] = f"{base}.{alias.name}"
                else:
                    others.add(bound)
                    if base.startswith(PACKAGE) and alias.name != "*":
                        imported.append(Use("import", base, [alias.name], path, node.lineno))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            others.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                               ast.ExceptHandler)) and node.name:
            others.add(node.name)
    return modules, others - set(modules), imported


def _own_nodes(scope):
    """The nodes of ``scope`` outside the scopes nested in it (their names are their own)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _chain(node) -> tuple[str | None, list[str]]:
    """``(root name, attributes)`` of ``a.b.c``; root None where it is no name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attrs[::-1]


def uses(path: Path) -> list[Use]:
    """Every name ``path`` takes from a chunkernels module."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(scope, outer):
        modules, others, imported = _bindings(scope, path)
        found.extend(imported)
        here = {**{k: v for k, v in outer.items() if k not in others}, **modules}
        for node in _own_nodes(scope):
            if isinstance(node, ast.Attribute) and not isinstance(
                    getattr(node, "parent", None), ast.Attribute):
                root, attrs = _chain(node)
                if root in here:
                    found.append(Use("read", here[root], attrs, path, node.lineno))
            elif isinstance(node, ast.Call) and _is_patch(node):
                root, attrs = _chain(node.args[0])
                name = node.args[1].value
                if root in here:
                    found.append(Use("patch", here[root], [*attrs, name], path, node.lineno))
            if isinstance(node, SCOPES):
                visit(node, here)

    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node
    visit(tree, {})
    return found


def _is_patch(node: ast.Call) -> bool:
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr in PATCHERS and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def resolve(module: str, chain) -> tuple[object, list[str], str | None]:
    """Follow ``chain`` from ``module``: submodules, then an attribute, then a class's attributes.
    Returns ``(the last object reached, the names followed, the first missing name or None)``."""
    obj, followed = load(module), []
    for name in chain:
        if isinstance(obj, ModuleType) and is_module(f"{obj.__name__}.{name}"):
            obj = load(f"{obj.__name__}.{name}")
        elif isinstance(obj, (ModuleType, type)):
            if not hasattr(obj, name):
                return obj, followed, name
            obj = getattr(obj, name)
        else:  # an instance or a function: what it holds is not read from the code
            break
        followed.append(name)
    return obj, followed, None


def _missing(use: Use) -> str | None:
    obj, _, name = resolve(use.module, use.chain)
    if name is None:
        return None
    kind = "module" if isinstance(obj, ModuleType) else "class"
    where = obj.__name__ if kind == "module" else f"{obj.__module__}.{obj.__qualname__}"
    return f"  {use.where()}: {use.text()}: {kind} {where} has no {name!r}"


@pytest.fixture(scope="module")
def all_uses() -> list[Use]:
    return [use for path in python_files() for use in uses(path)]


def test_every_name_taken_from_a_module_exists(all_uses):
    wrong = [m for m in map(_missing, (u for u in all_uses if u.kind != "patch")) if m]
    assert not wrong, ("names read from chunkernels modules that are not there (moved or "
                       "renamed? read them from the module that defines them now):\n"
                       + "\n".join(sorted(set(wrong))))


@pytest.fixture(scope="module")
def reads(all_uses) -> set[tuple[str, str]]:
    return _reads(all_uses)


def test_every_patch_reaches_the_code_that_reads_the_name(all_uses, reads):
    patches = [u for u in all_uses if u.kind == "patch"]
    wrong = [m for m in map(_missing, patches) if m]
    assert not wrong, "patches of names that are not there:\n" + "\n".join(sorted(set(wrong)))
    wrong = [m for m in (idle(use, reads) for use in patches) if m]
    assert not wrong, "patches that change nothing:\n" + "\n".join(sorted(set(wrong)))


def idle(patch: Use, reads) -> str | None:
    """Why ``patch`` changes nothing (no code reads the name through the module patched), or
    None where it reaches some."""
    obj, _, _ = resolve(patch.module, patch.chain[:-1])
    if not isinstance(obj, ModuleType) or not obj.__name__.startswith(PACKAGE):
        return None  # a class or another package: its attributes are read through it
    name = patch.chain[-1]
    if (obj.__name__, name) in reads:
        return None
    readers = sorted(m for m, n in reads if n == name)
    return (f"  {patch.where()}: {obj.__name__}.{name} is read by no code there nor through it, "
            f"so the patch changes nothing" + (f"; the code reading {name!r} is in "
                                               f"{', '.join(readers)}: patch that module"
                                               if readers else ""))


def _reads(all_uses) -> set[tuple[str, str]]:
    """``(module, name)`` for every name the package's code reads as a global of its own module,
    or as ``module.name`` through a module it imports."""
    reads = set()
    for path in python_files():
        module = module_name(path)
        if module is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                reads.add((module, node.id))
    for use in all_uses:
        if use.kind == "read" and module_name(use.path) is not None:
            owner = use.module
            for name in use.chain:  # submodules, then the name read from the last of them
                if not is_module(f"{owner}.{name}"):
                    reads.add((owner, name))
                    break
                owner = f"{owner}.{name}"
    return reads


def dotted_names() -> list[tuple[Path, int, str]]:
    """``(file, line, name)`` of every dotted ``chunkernels.x`` name in the docs, and in the
    comments and docstrings of the code (its strings may name modules that do not exist on
    purpose: a test's made-up package, a module a test adds)."""
    found = []
    for top in TEXT:
        base = ROOT / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*")
                                                     if p.suffix in TEXT_SUFFIXES)
        for path in files:
            if path == Path(__file__).resolve():  # its own examples name nothing on purpose
                continue
            text = path.read_text()
            lines = prose(text, path) if path.suffix == ".py" else enumerate(text.splitlines(), 1)
            for n, line in lines:
                found += [(path, n, m.group(0)) for m in DOTTED.finditer(line)]
    return found


def prose(source: str, path: Path):
    """``(line number, text)`` of the comments and docstrings of Python ``source``."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for n, line in enumerate(first.value.value.splitlines()):
                    yield first.value.lineno + n, line


def test_every_dotted_name_in_code_and_docs_resolves():
    wrong = []
    for path, line, name in dotted_names():
        parts = name.split(".")
        _, followed, missing = resolve(PACKAGE, parts[1:])
        if missing is not None and missing not in PLACEHOLDERS:
            wrong.append(f"  {path.relative_to(ROOT)}:{line}: {name} ({missing!r} is not in "
                         f"{'.'.join((PACKAGE, *followed))})")
    assert not wrong, "dotted names that name nothing:\n" + "\n".join(wrong)


# -- the check itself --------------------------------------------------------------------------


def test_the_check_sees_moved_names_and_idle_patches(tmp_path, monkeypatch):
    """A read of a missing name, inside a function too, is found; a name that is something else
    in a function is not taken for the module; a patch of a re-export is idle."""
    test = tmp_path / "tests" / "test_x.py"
    test.parent.mkdir()
    test.write_text(
        "from chunkernels import cuda\n"
        "from chunkernels.kernels import label as label_kernel\n"
        "def f(monkeypatch):\n"
        "    from chunkernels.kernels.label import no_such_name\n"
        "    label_kernel.no_such_thing\n"
        "    cuda.cupy\n"
        "    monkeypatch.setattr(label_kernel, 'check_structure', None)\n"
        "def g(cuda):\n"
        "    cuda.not_the_module\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = {(u.kind, u.text(), u.line) for u in uses(test)}
    assert found == {
        ("import", "chunkernels.kernels.label.no_such_name", 4),
        ("read", "chunkernels.kernels.label.no_such_thing", 5),
        ("read", "chunkernels.cuda.cupy", 6),
        ("patch", "chunkernels.kernels.label.check_structure", 7),
    }
    missing = [u.text() for u in uses(test) if u.kind != "patch" and _missing(u)]
    assert missing == ["chunkernels.kernels.label.no_such_name",
                       "chunkernels.kernels.label.no_such_thing"]


def test_a_patch_of_a_re_export_is_idle(reads):
    """The label package re-exports ``local_shape``, which ``plan`` reads in ``label._graph``:
    a patch of the package's name changes nothing, one of ``label._graph``'s does."""

    def patch(module):
        return Use("patch", module, ["local_shape"], ROOT / "tests" / "test_x.py", 1)

    assert "changes nothing" in idle(patch("chunkernels.kernels.label"), reads)
    assert idle(patch("chunkernels.kernels.label._graph"), reads) is None
