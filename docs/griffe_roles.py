"""Griffe extension for the API pages: chunkernels' docstrings use a few reST/Sphinx habits
(``:class:`KernelSpec```, ``:func:`empty_like```, literal blocks introduced by ``::``) that
Markdown would show verbatim. Before mkdocstrings renders them they become Markdown: a role whose
target is on the API page becomes a cross-reference, any other a code span, and ``text::`` before
an indented block becomes ``text:``. Module constants documented with Sphinx's ``#:`` comments
(``#: NVRTC options every chunkernels kernel is compiled with.``) get those comments as docstrings.

Loaded by mkdocstrings through ``extensions: [docs/griffe_roles.py]`` in mkdocs.yml. The source
docstrings are not changed.
"""

from __future__ import annotations

import re

import griffe

# Modules rendered whole on docs/api.md; top-level names come from chunkernels.__all__.
DOCUMENTED_MODULES = ("chunkernels.layout", "chunkernels.testing", "chunkernels.cuda",
                      "chunkernels.check", "chunkernels.metrics", "chunkernels.skimage_backend")

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`~?\.?([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(\S)::\n(\s*\n)", re.M)


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite Sphinx roles and ``::`` literal-block markers in every docstring of the package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.path != "chunkernels":
            return
        import chunkernels

        public = set(chunkernels.__all__)
        collection = loader.modules_collection

        def exists(path: str) -> bool:
            try:
                collection.get_member(path)
            except (KeyError, ValueError, AttributeError):
                return False
            return True

        def target(name: str, obj: griffe.Object) -> str | None:
            if name in public:
                return f"chunkernels.{name}"
            if name.startswith("chunkernels."):
                head = name.rsplit(".", 1)[0]
                if name in DOCUMENTED_MODULES or head in DOCUMENTED_MODULES:
                    return name if exists(name) else None
                return None
            module = obj.module.path if not obj.is_module else obj.path
            if module in DOCUMENTED_MODULES and exists(f"{module}.{name}"):
                return f"{module}.{name}"
            return None

        def comment_docstring(attr: griffe.Object) -> None:
            """``#:`` comment lines right above an attribute become its docstring."""
            lines = attr.module.lines
            i = (attr.lineno or 0) - 2
            comment = []
            while i >= 0 and lines[i].lstrip().startswith("#:"):
                comment.insert(0, lines[i].lstrip()[2:].strip())
                i -= 1
            if comment:
                attr.docstring = griffe.Docstring(" ".join(comment), parent=attr)

        def rewrite(obj: griffe.Object) -> None:
            if obj.is_attribute and obj.docstring is None:
                comment_docstring(obj)
            if obj.docstring is not None:
                def role(match: re.Match) -> str:
                    name = match.group(1)
                    where = target(name, obj)
                    qualified = name.startswith("chunkernels.") and where
                    short = name.rsplit(".", 1)[-1] if qualified else name
                    return f"[`{short}`][{where}]" if where else f"`{name}`"

                text = _ROLE.sub(role, obj.docstring.value)
                obj.docstring.value = _LITERAL_BLOCK.sub(r"\1:\n\2", text)
            for member in obj.members.values():
                if not member.is_alias:
                    rewrite(member)

        rewrite(pkg)
