"""MkDocs hooks: kernel pages built from the registry, so the documentation cannot drift from it.

* ``<!-- spec: NAME -->`` in a page becomes a table of kernel ``NAME``'s :class:`KernelSpec`
  (read from ``chunkernels.get(NAME)``).
* ``<!-- kernels -->`` becomes a table of every registered kernel, linking to its page.
* ``<!-- cli: ARGS -->`` becomes what ``chunkernels ARGS`` prints (``--help`` texts, ``list``),
  as a code block.
* Every built-in kernel must have a page ``docs/kernels/NAME.md``; a missing one is a warning,
  which fails ``mkdocs build --strict``.

Loaded through ``hooks: [docs/hooks.py]`` in mkdocs.yml; excluded from the site itself.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a checkout that is not installed still documents itself
    sys.path.insert(0, str(ROOT))

import chunkernels  # noqa: E402
from chunkernels.kernels import builtin_modules  # noqa: E402

log = logging.getLogger("mkdocs.hooks.chunkernels")

SPEC_MARKER = re.compile(r"<!--\s*spec:\s*([A-Za-z_][A-Za-z0-9_]*)\s*-->")
KERNELS_MARKER = re.compile(r"<!--\s*kernels\s*-->")
CLI_MARKER = re.compile(r"<!--\s*cli:\s*([\w -]+?)\s*-->")


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


def on_files(files, config, **kwargs):
    for name in builtin_modules():
        if files.get_file_from_path(f"kernels/{name}.md") is None:
            log.warning(f"built-in kernel {name!r} has no page docs/kernels/{name}.md "
                        f"(copy docs/kernels/broadcast_add.md)")
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
    return KERNELS_MARKER.sub(lambda m: kernels_table(page.file.src_uri), markdown)
