"""Helpers for checking kernels against their CPU references (used by ``chunkernels check``,
the test suite and users testing their own kernels)."""

from __future__ import annotations

import math

import numpy as np

from chunkernels import cuda
from chunkernels._shared.cases import random_array

# random_array lives below the kernels, whose ``cases`` draw their inputs with it
__all__ = ["TOLERANCES", "assert_close", "chunkings", "graph_on_a_cluster", "random_array",
           "to_device_view"]

#: Default tolerances per result dtype kind/size: (rtol, atol). Integers compare exactly.
TOLERANCES = {"float32": (1e-6, 1e-6), "float64": (1e-12, 1e-12)}


def assert_close(actual, expected, *, rtol=None, atol=None, err_msg=""):
    """Assert ``actual`` equals ``expected`` (each NumPy or CuPy) in dtype, shape and value.

    Floats compare within :data:`TOLERANCES` for their dtype unless ``rtol``/``atol`` are given;
    integers and booleans compare exactly.
    """
    actual, expected = (a.get() if cuda.is_cupy_array(a) else np.asarray(a)
                        for a in (actual, expected))
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}. {err_msg}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}. {err_msg}"
    if expected.dtype.kind in "fc":
        r, a = TOLERANCES.get(expected.dtype.name, (1e-6, 1e-6))
        np.testing.assert_allclose(actual, expected, rtol=r if rtol is None else rtol,
                                   atol=a if atol is None else atol, err_msg=err_msg)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=err_msg)


def to_device_view(a):
    """A CuPy array with the same values *and the same strides* as NumPy array ``a``.

    ``cupy.asarray`` makes a contiguous copy of a NumPy view; this uploads the view's base buffer
    and rebuilds the view on it, so sliced, transposed, negative-stride and broadcast (zero-stride)
    layouts reach the GPU path as they are.
    """
    cp = cuda.cupy()
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    if not (base.flags.c_contiguous or base.flags.f_contiguous) or base.base is not None:
        base = np.array(a, copy=True)  # not a plain buffer we can mirror: keep the values only
        return cp.asarray(base)
    device_base = cp.asarray(base.reshape(-1, order="A") if base.ndim else base.reshape(1))
    offset = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return cp.ndarray(a.shape, a.dtype, memptr=device_base.data + offset, strides=a.strides)


def chunkings(shape, halo=0):
    """Chunkings worth checking for ``shape``: one chunk, halves, uneven thirds, and (for a halo)
    chunks smaller than the halo."""
    out = [tuple(max(n, 1) for n in shape)]
    out.append(tuple(max(1, math.ceil(n / 2)) for n in shape))
    out.append(tuple(max(1, n // 3 + 1) for n in shape))
    if halo:
        out.append(tuple(max(1, min(n, halo - 1 if halo > 1 else 1)) for n in shape))
    unique = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique


def graph_on_a_cluster(collection) -> dict:
    """The tasks of Dask ``collection`` as a distributed scheduler builds them: ``{key: task}``.

    Some of chunkernels' layers choose their shape where the graph is materialised (a local
    scheduler gets one shape, a cluster another: ``chunkernels._graph.chosen_array``);
    ``dict(collection.__dask_graph__())`` shows the local one. This serialises the graph as
    ``distributed`` does when it sends it to the scheduler, and materialises it.
    """
    import pickle

    import cloudpickle  # what distributed falls back on for functions pickle cannot name
    from dask.highlevelgraph import HighLevelGraph

    sent = pickle.loads(cloudpickle.dumps(collection.__dask_graph__()))
    # a graph object caches its dict once materialised: read the layers themselves
    return dict(HighLevelGraph(sent.layers, sent.dependencies))
