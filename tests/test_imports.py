"""Modules looked up without importing them: one still being imported by another thread counts
as not imported (issue #20: ``distributed`` found half-initialised in ``sys.modules``)."""

from __future__ import annotations

import importlib.machinery
import types

import numpy as np
import pytest

from chunkernels import cuda, interop, skimage_backend
from chunkernels._imports import imported
from chunkernels._kind import NUMPY


def _half_imported(name: str) -> types.ModuleType:
    """A module as ``sys.modules`` holds it while its code still runs: none of its names yet."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    module.__spec__._initializing = True  # what importlib sets until the module's code ends
    return module


@pytest.mark.parametrize("name", ["cupy", "torch", "dask.array", "distributed"])
def test_a_module_being_imported_is_not_imported_yet(monkeypatch, name):
    half = _half_imported(name)
    monkeypatch.setitem(__import__("sys").modules, name, half)
    assert imported(name) is None
    half.__spec__._initializing = False  # its import ended
    assert imported(name) is half


def test_a_module_never_imported_is_none_and_stays_unimported():
    import sys

    assert imported("chunkernels_no_such_module") is None
    assert "chunkernels_no_such_module" not in sys.modules
    assert imported("numpy") is np


def test_array_checks_while_cupy_torch_or_dask_are_half_imported(monkeypatch):
    """Before the fix each of these raised AttributeError (``cupy.ndarray``, ``torch.Tensor``,
    ``dask.array.Array`` not defined yet) in a thread that met the module mid-import."""
    import sys

    for name in ("cupy", "torch", "dask.array"):
        monkeypatch.setitem(sys.modules, name, _half_imported(name))
    x = np.zeros(3)
    assert cuda.is_cupy_array(x) is False
    assert cuda.array_module(x) is np
    assert interop.is_tensor(x) is False
    assert skimage_backend._array_kind(x) == NUMPY
    assert skimage_backend._array_kind([1, 2]) is None
