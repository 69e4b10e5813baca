"""broadcast_add: ``x + other`` with ``other`` broadcast over ``x`` (NumPy rules).

The seed example of chunkernels: a 1-D array added to every row of a 2-D array, generalised to
any ndim, any view layout and the dtypes float32, float64, int32, int64 (result dtype as NumPy's).
CUDA source: ``kernels_cuda/broadcast_add.cu``.
"""

from __future__ import annotations

import math

import numpy as np

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec
from chunkernels._shared.cases import random_array

#: Dims the CUDA kernel walks after collapsing; views that keep more are split along the
#: outermost axis, one launch per slice.
MAX_NDIM = 4
_THREADS = 256
_UNROLL = 4  # rows per thread per iteration; matches UNROLL in the .cu file
_MAX_GRID_Y = 65535
_SPLIT_COLS = (1024, 512, 256, 128)  # row widths (in vectors) used to give 1-D walks rows


def reference(x: np.ndarray, other: np.ndarray) -> np.ndarray:
    """CPU reference: ``numpy.add(x, other)`` in NumPy's result dtype, laid out like ``x``."""
    return np.add(x, other, dtype=np.result_type(x.dtype, other.dtype))


def dispatch(x, other):
    """GPU path: launch ``broadcast_add`` on CuPy views without copying them.

    Interior Dask blocks share shape, strides and dtypes, so the launch (layout plan, compiled
    kernel, grid, scalar arguments) is planned once per layout and device and reused: a block then
    costs an allocation and a launch.
    """
    cp = cuda.cupy()
    key = (cp.cuda.runtime.getDevice(), x.shape, x.strides, x.dtype, other.shape, other.strides,
           other.dtype, x.data.ptr % 16, other.data.ptr % 16)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(cp, x, other)
    return plan(cp, x, other)


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096


class _Plan:
    """How to compute ``x + other`` for one layout: output allocation and kernel launch."""

    __slots__ = ("dtype", "alloc", "launch")

    def __init__(self, cp, x, other):
        self.dtype = np.result_type(x.dtype, other.dtype)
        self.alloc = layout.Allocation(x.shape, x.strides)
        out = self.alloc.empty(cp, self.dtype)
        # None: nothing to launch; "split": more than MAX_NDIM dims survive collapsing
        self.launch = None if out.size == 0 else _launch_args(out, x, cp.broadcast_to(other, x.shape))

    def __call__(self, cp, x, other):
        out = self.alloc.empty(cp, self.dtype)
        if self.launch == "split":
            _launch_split(out, x, cp.broadcast_to(other, x.shape))
        elif self.launch is not None:
            kernel, grid, block, scalars = self.launch
            kernel(grid, block, (x, other, out, *scalars))
        return out


def _launch_split(out, x, y) -> None:
    """Launch per slice along the outermost axis, for views that keep more than MAX_NDIM dims."""
    args = _launch_args(out, x, y)
    if args == "split":
        axis = layout.plan_pointwise(out, x, y).axes[0][0]
        for i in range(out.shape[axis]):
            index = (slice(None),) * axis + (i,)
            _launch_split(out[index], x[index], y[index])
    else:
        kernel, grid, block, scalars = args
        kernel(grid, block, (x, y, out, *scalars))


def _launch_args(out, x, y):
    """``(kernel, grid, block, scalar args)`` for ``out = x + y`` (same-shape views), or
    ``"split"`` when the walk keeps more than MAX_NDIM dims."""
    plan = layout.plan_pointwise(out, x, y)
    if plan.ndim > MAX_NDIM:
        return "split"
    _, xs, ys = plan.strides
    shape = plan.shape or (1,)
    xs, ys = xs or (0,), ys or (0,)
    vec = plan.vector_width((out, x, y), broadcast_ok=(2,))
    cols = shape[-1] // vec
    outer, xo, yo = list(shape[:-1]), list(xs[:-1]), list(ys[:-1])
    if not outer:  # a 1-D walk: give it rows, so each thread has several independent accesses
        for width in _SPLIT_COLS:
            if cols % width == 0 and cols >= 2 * width:
                outer, xo, yo = [cols // width], [width * vec * xs[-1]], [width * vec * ys[-1]]
                cols = width
                break
    ndim = len(outer) + 1
    pad = 3 - len(outer)
    extents = outer + [1] * pad
    xo, yo = xo + [0] * pad, yo + [0] * pad
    rows = math.prod(outer)

    index = np.int64 if plan.index64 else np.int32
    expr = (f"broadcast_add<{cuda.cuda_type(x.dtype)}, {cuda.cuda_type(y.dtype)}, "
            f"{cuda.cuda_type(out.dtype)}, {'long long' if plan.index64 else 'int'}, {ndim}, {vec}>")
    kernel = cuda.function("broadcast_add", expr)

    bx = min(_THREADS, 1 << max(cols - 1, 0).bit_length())
    by = _THREADS // bx
    grid = (-(-cols // bx), min(_MAX_GRID_Y, max(1, -(-rows // (by * _UNROLL)))))
    scalars = (rows, cols, extents[1], extents[2], *xo, xs[-1] * vec, *yo, ys[-1] * vec)
    return kernel, grid, (bx, by), tuple(index(v) for v in scalars)


def _cases(rng):
    """Random inputs for ``chunkernels check``: layouts and dtype pairs the kernel must handle."""
    for dx, dy in (("float32", "float32"), ("float64", "float32"), ("int32", "int64"),
                   ("int64", "float64")):
        x = random_array(rng, (67, 45, 6), dx)
        yield x, (random_array(rng, (45, 6), dy),), {}
        yield x.transpose(2, 0, 1), (random_array(rng, (1, 45), dy),), {}
    base = random_array(rng, (64, 130), "float32")
    yield base[::-2, 3:-3], (random_array(rng, (124,), "float32")[::-1],), {}
    yield np.asfortranarray(random_array(rng, (40, 33), "float64")), (random_array(rng, (40, 1), "float64"),), {}


SPEC = KernelSpec(
    name="broadcast_add",
    summary="x + other, other broadcast over x's leading axes (NumPy rules); reference numpy.add",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="broadcast_add.cu",
    entries=(
        "broadcast_add<float, float, float, int, 2, 4>",
        "broadcast_add<double, double, double, long long, 4, 2>",
        "broadcast_add<int, long long, long long, int, 3, 1>",
        "broadcast_add<long long, double, double, long long, 1, 1>",
    ),
    dtypes=("float32", "float64", "int32", "int64"),
    operands=("other",),
    alignment="broadcast",
    cases=_cases,
)
