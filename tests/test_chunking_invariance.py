"""Property: a kernel's result does not depend on how its input is chunked.

Hypothesis draws an array (0 to 3 dims, sides 0 to 12, one of the four dtypes), an operand that
broadcasts to it (a trailing subset of its axes, some of them 1) and two chunkings; ``apply`` on
Dask arrays must give the CPU reference on the whole array, bit for bit, for both. Values are small
integers, so every sum is exact in every dtype and any difference is a real difference.
"""

from __future__ import annotations

from itertools import pairwise

import dask.array as da
import numpy as np
from conftest import MODES, moving_sum_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import chunkernels
from chunkernels.testing import assert_close

DTYPES = ("float32", "float64", "int32", "int64")
MAX_SIDE = 12

# The registry fixture in conftest is function-scoped; it is right for Hypothesis to share it
# across a test's examples (the test only reads the registry, or registers the same kernel).
SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def values(dtype, shape):
    return hnp.arrays(dtype, shape, elements=st.integers(-1000, 1000))


@st.composite
def partitions(draw, n):
    """Chunk sizes along an axis of length ``n``; shrinks toward a single chunk.

    At most four chunks per axis: enough for interior and edge chunks of uneven sizes, while a
    3-D example stays at 64 blocks, which keeps the test fast.
    """
    if n <= 1:
        return (n,)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=3)))
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in pairwise(bounds))


def chunkings(draw, shape):
    return tuple(draw(partitions(n)) for n in shape)


@st.composite
def broadcast_cases(draw):
    """``(x, operand, chunks_a, chunks_b, how)`` with the operand given in one of four forms."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=MAX_SIDE))
    x = draw(values(draw(st.sampled_from(DTYPES)), shape))
    how = draw(st.sampled_from(["numpy", "dask", "dask-misaligned", "scalar"]))
    if how == "scalar":
        scalar = draw(st.sampled_from([2, -3, 2.5]))
        return x, scalar, chunkings(draw, shape), chunkings(draw, shape), how
    kept = draw(st.integers(0, x.ndim))
    op_shape = tuple(draw(st.sampled_from([n, 1])) for n in shape[x.ndim - kept:])
    op = draw(values(draw(st.sampled_from(DTYPES)), op_shape))
    return x, op, chunkings(draw, shape), chunkings(draw, shape), how


def _operand(op, x_chunks, how, draw_chunks):
    """The operand as ``apply`` receives it: NumPy, Dask chunked like x, or Dask chunked its way."""
    if how in ("numpy", "scalar"):
        return op
    if how == "dask":
        lead = len(x_chunks) - op.ndim
        return da.from_array(op, chunks=tuple(x_chunks[lead + j] if n > 1 else (n,)
                                              for j, n in enumerate(op.shape)))
    return da.from_array(op, chunks=draw_chunks)


@SETTINGS
@given(case=broadcast_cases(), data=st.data())
def test_broadcast_add_is_chunking_invariant(case, data):
    x, op, chunks_a, chunks_b, how = case
    expected = np.add(x, op)  # NumPy's broadcasting and promotion, weak Python scalars included
    assert_close(chunkernels.apply(x, "broadcast_add", op), expected)
    results = []
    for chunks in (chunks_a, chunks_b):
        own = data.draw(st.tuples(*(partitions(n) for n in np.shape(op))))
        operand = _operand(op, chunks, how, own)
        z = chunkernels.apply(da.from_array(x, chunks=chunks), "broadcast_add", operand,
                              align=how == "dask-misaligned")
        assert z.dtype == expected.dtype and z.chunks == da.from_array(x, chunks=chunks).chunks
        results.append(z.compute())
        assert_close(results[-1], expected, err_msg=f"chunks {chunks}, operand {how}")
    np.testing.assert_array_equal(*results)


@st.composite
def halo_cases(draw):
    """``(x, radius, mode, chunks_a, chunks_b)``; the last axis, which has the halo, is never 0."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=MAX_SIDE))
    shape = (*shape[:-1], max(shape[-1], 1))
    x = draw(values(draw(st.sampled_from(DTYPES)), shape))
    radius = draw(st.integers(1, 4))
    mode = draw(st.sampled_from(MODES))
    return x, radius, mode, chunkings(draw, shape), chunkings(draw, shape)


@SETTINGS
@given(case=halo_cases())
def test_halo_kernel_is_chunking_invariant(moving_sum, case):
    x, radius, mode, chunks_a, chunks_b = case
    expected = moving_sum_reference(x, radius=radius, mode=mode)
    results = []
    for chunks in (chunks_a, chunks_b):
        z = chunkernels.apply(da.from_array(x, chunks=chunks), "moving_sum", radius=radius,
                              mode=mode, allow_rechunk=True)
        assert z.dtype == x.dtype
        results.append(z.compute())
        assert_close(results[-1], expected, err_msg=f"chunks {chunks}")
    np.testing.assert_array_equal(*results)
