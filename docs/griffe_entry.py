"""Griffe extension for the API pages: the public functions' signatures as callers use them.

chunkernels' public functions are wrapped by ``chunkernels.interop.array_entry``, which decides
the array kind of each call and hands it to the function as its first parameter (after
``self``), ``kind``; that parameter is no part of the public signature (``inspect.signature``
leaves it out). Griffe reads the source, so this extension removes it from every function
decorated with ``array_entry`` before mkdocstrings renders the signature.

Loaded by mkdocstrings through ``extensions: [docs/griffe_entry.py]`` in mkdocs.yml.
"""

from __future__ import annotations

from typing import Any

import griffe


class HideEntryKind(griffe.Extension):
    """Drop the ``kind`` parameter that ``array_entry`` fills in."""

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        decorated = any(str(d.value).split("(")[0].rsplit(".", 1)[-1] == "array_entry"
                        for d in func.decorators)
        if decorated and "kind" in func.parameters:
            del func.parameters["kind"]
