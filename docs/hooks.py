"""MkDocs hooks: kernel pages built from the registry, so the documentation cannot drift from it.

* ``<!-- spec: NAME -->`` in a page becomes a table of kernel ``NAME``'s :class:`KernelSpec`
  (read from ``chunkernels.get(NAME)``).
* ``<!-- kernels -->`` becomes a table of every registered kernel, linking to its page.
* ``<!-- cli: ARGS -->`` becomes what ``chunkernels ARGS`` prints (``--help`` texts, ``list``),
  as a code block.
* The Kernels section of the navigation is generated: after the entries mkdocs.yml gives it,
  one page ``kernels/NAME.md`` per built-in kernel module ``chunkernels/kernels/NAME`` (found
  with pkgutil over the package's folder, not from a list), in alphabetical order. Adding a
  kernel adds its page to the site; a module without a page is a warning, which fails
  ``mkdocs build --strict``, and a page without a module is left out of the navigation, which
  the strict build also refuses.
* ``<!-- bad-inputs -->`` becomes the table of bad inputs that ``tests/test_bad_inputs.py``
  declares (``BAD_INPUTS``), each call run here and shown with the error it raises and the
  first line of its message; ``<!-- bad-inputs: names -->`` becomes the code that makes the
  arrays those calls use. A call that raises nothing, or another error than the table says, is
  a warning.

Loaded through ``hooks: [docs/hooks.py]`` in mkdocs.yml; excluded from the site itself.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import pkgutil
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a checkout that is not installed still documents itself
    sys.path.insert(0, str(ROOT))

import chunkernels  # noqa: E402

log = logging.getLogger("mkdocs.hooks.chunkernels")

#: The built-in kernels' package folder, and the navigation section their pages go into.
KERNELS_DIR = ROOT / "chunkernels" / "kernels"
KERNELS_SECTION = "Kernels"

SPEC_MARKER = re.compile(r"<!--\s*spec:\s*([A-Za-z_][A-Za-z0-9_]*)\s*-->")
KERNELS_MARKER = re.compile(r"<!--\s*kernels\s*-->")
CLI_MARKER = re.compile(r"<!--\s*cli:\s*([\w -]+?)\s*-->")
BAD_INPUTS_MARKER = re.compile(r"<!--\s*bad-inputs\s*-->")
BAD_INPUT_NAMES_MARKER = re.compile(r"<!--\s*bad-inputs:\s*names\s*-->")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text) -> str:
    return f"`{text}`" if text not in ("", "-", None) else "-"


def spec_table(name: str) -> str:
    """A Markdown table of registered kernel ``name``'s spec."""
    spec = chunkernels.get(name)
    if spec.source:
        source = f"`kernels_cuda/{spec.source}`"
    else:
        source = "inline (`code=`)" if spec.code else "- (CPU reference only)"
    gpu = "-" if spec.gpu is None else _code(f"{spec.gpu.__module__}.{spec.gpu.__qualname__}")
    rows = [
        ("name", _code(spec.name)),
        ("summary", spec.summary or "-"),
        ("kind", _code(spec.kind)),
        ("CUDA source", source),
        ("entries", "<br>".join(_code(e) for e in spec.entries) or "-"),
        ("dtypes (GPU path)", ", ".join(_code(d) for d in spec.dtypes)),
        ("ndim (GPU path)", spec.ndim_text),
        ("operands", ", ".join(_code(o) for o in spec.operands) or "none"),
        ("alignment", _code(spec.alignment) if spec.operands else "-"),
        ("halo rule", _code(spec.halo_rule)),
        ("GPU dispatch", gpu),
        ("layout", "copies inputs to C order first (`contiguous=True`)" if spec.contiguous
         else "any strides (views are read in place)"),
        ("CPU reference", _code(f"{spec.cpu.__module__}.{spec.cpu.__qualname__}")),
        ("parameters validated by", "-" if spec.validate is None
         else _code(f"{spec.validate.__module__}.{spec.validate.__qualname__}")),
        ("`chunkernels check` cases", "yes" if spec.cases is not None else "none"),
    ]
    lines = ["| field | value |", "|---|---|"]
    lines += [f"| {field} | {_cell(value)} |" for field, value in rows]
    return "\n".join(lines)


def kernels_table(page_src: str) -> str:
    """A Markdown table of every registered kernel, linking to docs/kernels/NAME.md."""
    here = posixpath.dirname(page_src) or "."
    lines = ["| kernel | summary | kind | dtypes | halo |", "|---|---|---|---|---:|"]
    for name in chunkernels.registered():
        spec = chunkernels.get(name)
        page = f"kernels/{name}.md"
        link = posixpath.relpath(page, here)
        title = f"[`{name}`]({link})" if (ROOT / "docs" / page).exists() else f"`{name}`"
        lines.append(f"| {title} | {_cell(spec.summary or '-')} | {spec.kind} | "
                     f"{', '.join(spec.dtypes)} | `{spec.halo_rule}` |")
    return "\n".join(lines)


def cli_output(args: str) -> str:
    """What ``chunkernels ARGS`` prints, as a code block (help texts wrapped at 100 columns)."""
    from chunkernels import cli

    argv = args.split()
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out):
            try:
                cli.main(argv)
            except SystemExit:
                pass
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "```text\n$ chunkernels " + " ".join(argv) + "\n" + out.getvalue().rstrip() + "\n```"


def kernel_modules() -> list[str]:
    """The built-in kernel modules (and packages) of ``chunkernels/kernels``, sorted: every public
    name pkgutil finds in the folder, so that a new module needs no list to be documented."""
    return sorted(m.name for m in pkgutil.iter_modules([str(KERNELS_DIR)])
                  if not m.name.startswith("_"))


def kernels_nav(nav: list, pages: list[str]) -> list:
    """``nav`` with ``pages`` (``kernels/NAME.md``, titled ``NAME``) appended to its
    ``KERNELS_SECTION`` entry, after what mkdocs.yml lists there (the section's index)."""
    for entry in nav:
        if isinstance(entry, dict) and KERNELS_SECTION in entry:
            listed = entry[KERNELS_SECTION]
            listed = [listed] if isinstance(listed, str) else list(listed or [])
            entry[KERNELS_SECTION] = listed + [{Path(page).stem: page} for page in pages]
            return nav
    raise ValueError(f"mkdocs.yml's nav has no {KERNELS_SECTION!r} section for the kernel pages; "
                     f"sections: {[next(iter(e)) for e in nav if isinstance(e, dict)]}")
@functools.cache
def _bad_inputs():
    """``tests/test_bad_inputs.py``, loaded once from its file (the tests are no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chunkernels_docs_bad_inputs",
                                                  ROOT / "tests" / "test_bad_inputs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _text(text: str) -> str:
    """``text`` as plain Markdown in a table cell: no emphasis, links or HTML made of it."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _kinds(error: type) -> str:
    """The built-in exception types ``error`` is, which code catching SciPy's errors catches."""
    builtin = [c for c in error.__mro__[1:]
               if c.__module__ == "builtins" and c not in (Exception, BaseException, object)]
    plain = [c.__name__ for c in builtin  # not ArithmeticError beside OverflowError
             if not any(d is not c and issubclass(d, c) for d in builtin)]
    return f" ({', '.join(plain)})" if plain else ""


def bad_inputs_table(page_src: str) -> str:
    """Markdown sections, one per topic, of the bad inputs the tests declare: the call, the
    error it raises now, the first line of its message."""
    module = _bad_inputs()
    names = module.namespace()
    sections: dict[str, list[str]] = {}
    for case in module.BAD_INPUTS:
        exc = module.raised(case, names)
        if not isinstance(exc, case.error) or not re.match(case.message, str(exc)):
            log.warning(f"{page_src}: {case.call} raised {exc!r}; tests/test_bad_inputs.py says "
                        f"{case.error.__name__} matching {case.message!r}")
            continue
        first = str(exc).splitlines()[0] if str(exc) else ""
        sections.setdefault(case.topic, []).append(
            f"| `{case.call}` | `{type(exc).__name__}`{_kinds(type(exc))} | {_text(first)} |")
    out = []
    for topic, rows in sections.items():
        out += [f"## {topic}", "", "| call | raises | message |", "|---|---|---|", *rows, ""]
    return "\n".join(out)


def bad_input_names() -> str:
    """The source of the function that makes the arrays the bad inputs' calls use."""
    import inspect

    return "```python\n" + inspect.getsource(_bad_inputs().namespace).rstrip() + "\n```"


def on_files(files, config, **kwargs):
    pages = []
    for name in kernel_modules():
        page = f"kernels/{name}.md"
        if files.get_file_from_path(page) is None:
            log.warning(f"built-in kernel module chunkernels/kernels/{name} has no page "
                        f"docs/{page} (copy docs/kernels/broadcast_add.md)")
        else:
            pages.append(page)
    # MkDocs builds the navigation from config["nav"] right after this event (and reloads
    # mkdocs.yml for every rebuild of `mkdocs serve`, so the section never grows twice).
    config["nav"] = kernels_nav(config["nav"], pages)
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    def spec(match):
        name = match.group(1)
        try:
            return spec_table(name)
        except KeyError as exc:
            log.warning(f"{page.file.src_uri}: {exc}")
            return match.group(0)

    markdown = SPEC_MARKER.sub(spec, markdown)
    markdown = CLI_MARKER.sub(lambda m: cli_output(m.group(1)), markdown)
    markdown = BAD_INPUT_NAMES_MARKER.sub(lambda m: bad_input_names(), markdown)
    markdown = BAD_INPUTS_MARKER.sub(lambda m: bad_inputs_table(page.file.src_uri), markdown)
    return KERNELS_MARKER.sub(lambda m: kernels_table(page.file.src_uri), markdown)
