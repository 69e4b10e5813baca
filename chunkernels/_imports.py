"""Modules other threads may be importing: look them up without importing them, safely.

chunkernels asks whether CuPy, torch, Dask or distributed are in use without importing them
(an import costs up to a second, and CPU machines may lack them), by looking them up in
``sys.modules``. A module is placed there *before* its code runs, so while one thread imports
it another thread can find it half-initialised, without the names it will define: calling
``distributed.default_client`` then raised ``AttributeError: partially initialized module``
(issue #20). :func:`imported` returns a module only once its import has finished;
:func:`current_client` finds the distributed client the same way.
"""

from __future__ import annotations

import sys
from types import ModuleType


def imported(name: str) -> ModuleType | None:
    """Module ``name`` if its import has completed, else ``None``; never imports anything.

    A module still being imported (by this thread or another) counts as not imported: none of
    its objects (a CuPy array, a Dask client) can exist before its import completes, so every
    caller's answer is the same as for a module never imported.
    """
    module = sys.modules.get(name)
    if module is None:
        return None
    # importlib marks the spec while the module's code runs (the flag it checks itself, in
    # importlib._bootstrap._find_and_load, to make a second importer wait for the first)
    if getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def current_client():
    """The ``distributed.Client`` Dask would compute on now (the default client), or ``None``
    when there is none (local threads or processes).

    Asking imports nothing: without distributed imported there is no client, and importing it
    (about half a second) would slow every caller on a machine that never starts one. While
    another thread is still importing distributed there is no client either.
    """
    distributed = imported("distributed")
    if distributed is None:
        return None
    try:
        return distributed.default_client()
    except ValueError:
        return None
