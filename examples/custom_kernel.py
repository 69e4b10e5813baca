"""Write your own kernel: ``scaled_add``, z = a * x + y, registered with chunkernels.

The complete recipe, as it appears in docs/writing-kernels.md (which includes this file): inline
CUDA source, a stride-aware GPU dispatch, a NumPy CPU reference, registration, and use through
``chunkernels.apply`` on Dask arrays. It runs anywhere:

* NumPy chunks always (the CPU reference, block by block);
* CuPy chunks too when ``chunkernels.cuda.gpu_count() > 0`` (the CUDA kernel, compiled on first
  use), checked against the CPU reference.

    python examples/custom_kernel.py

Every result is asserted against the reference; the script exits non-zero if one is wrong.
"""

from __future__ import annotations

import math
import numbers

import dask.array as da
import numpy as np

import chunkernels
from chunkernels import cuda, layout
from chunkernels.testing import assert_close

# --8<-- [start:cuda]
SCALED_ADD_CU = r"""
// scaled_add: z = a * x + y, y broadcast to x's shape (NumPy rules). CPU reference: scaled_add_cpu.
//
// The iteration space is planned in Python by chunkernels.layout.plan_pointwise: 4 dims, outermost
// first (padded in front with size-1 dims), in z's memory order. z is freshly allocated by
// layout.empty_like, so it is contiguous in that order and its offset is the flat index i. x and
// y are arbitrary views: strides are in elements and may be negative (reversed views) or zero
// (broadcast). I is int, or long long when an offset or the grid-stride loop could pass 2**31-1.
template <typename TX, typename TY, typename TZ, typename I>
__global__ void scaled_add(const TX* __restrict__ x, const TY* __restrict__ y,
                           TZ* __restrict__ z, const TZ a, const I n,
                           const I n1, const I n2, const I n3,
                           const I xs0, const I xs1, const I xs2, const I xs3,
                           const I ys0, const I ys1, const I ys2, const I ys3)
{
    const I step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        I t = i;
        const I i3 = t % n3;  t /= n3;
        const I i2 = t % n2;  t /= n2;
        const I i1 = t % n1;
        const I i0 = t / n1;
        const TZ xv = static_cast<TZ>(x[i0 * xs0 + i1 * xs1 + i2 * xs2 + i3 * xs3]);
        const TZ yv = static_cast<TZ>(y[i0 * ys0 + i1 * ys1 + i2 * ys2 + i3 * ys3]);
        z[i] = a * xv + yv;
    }
}
"""
# --8<-- [end:cuda]


# --8<-- [start:dispatch]
MAX_DIMS = 4      # dims the kernel walks; views that keep more after collapsing are split
THREADS = 256     # threads per block
MAX_BLOCKS = 65535  # the grid-stride loop covers larger arrays


def scaled_add_gpu(x, y, *, a):
    """GPU path: CuPy views in (any strides), a new CuPy array out. No copy, no synchronisation."""
    cp = cuda.cupy()
    z = layout.empty_like(cp, x, np.result_type(x.dtype, y.dtype))  # laid out like x
    if z.size:
        _launch(z, x, cp.broadcast_to(y, x.shape), a)  # broadcasting = zero strides, no copy
    return z


def _launch(z, x, y, a):
    plan = layout.plan_pointwise(z, x, y)  # z's memory order, size-1 dims dropped, dims merged
    if plan.ndim > MAX_DIMS:  # e.g. a 5-d view stepped along two axes: one launch per slice
        axis = plan.axes[0][0]
        for k in range(z.shape[axis]):
            index = (slice(None),) * axis + (k,)
            _launch(z[index], x[index], y[index], a)
        return
    pad = MAX_DIMS - plan.ndim
    shape = (1,) * pad + plan.shape
    _, xs, ys = ((0,) * pad + s for s in plan.strides)  # element strides of z, x, y
    n = math.prod(shape)
    blocks = max(1, min(MAX_BLOCKS, -(-n // THREADS)))
    # 64-bit offsets when the plan says so, or when the loop's last `i += step` could overflow.
    index64 = plan.index64 or n + blocks * THREADS > layout.INT32_MAX
    index = np.int64 if index64 else np.int32
    expr = (f"scaled_add<{cuda.cuda_type(x.dtype)}, {cuda.cuda_type(y.dtype)}, "
            f"{cuda.cuda_type(z.dtype)}, {'long long' if index64 else 'int'}>")
    kernel = cuda.function("scaled_add", expr)  # compiled on first use, cached per device
    args = (x, y, z, z.dtype.type(a), n, *shape[1:], *xs, *ys)
    kernel((blocks,), (THREADS,), tuple(v if hasattr(v, "dtype") else index(v) for v in args))
# --8<-- [end:dispatch]


# --8<-- [start:reference]
def scaled_add_cpu(x, y, *, a):
    """CPU reference: ``a * x + y`` in NumPy's result dtype of ``x`` and ``y``."""
    dtype = np.result_type(x.dtype, y.dtype)
    return np.add(np.multiply(dtype.type(a), x, dtype=dtype), y, dtype=dtype)
# --8<-- [end:reference]


# --8<-- [start:register]
def _validate(ndim, a=None, **unknown):
    """Check and normalise the parameters once per ``apply`` call."""
    if unknown:
        raise TypeError(f"scaled_add takes one parameter, a; got {sorted(unknown)}")
    if not isinstance(a, numbers.Real) or isinstance(a, bool):
        raise TypeError(f"scaled_add needs a real scale factor: apply(x, 'scaled_add', y, a=2.0); "
                        f"got a={a!r}")
    return {"a": float(a)}


def _cases(rng):
    """Random inputs for ``chunkernels check``: the layouts Dask blocks have."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    yield f32(67, 45), (f32(45),), {"a": 2.5}                          # a row vector
    yield f32(45, 67).T, (f32(67, 1),), {"a": -1.0}                   # transposed x, column y
    yield f32(64, 130)[::-2, 3:-3], (f32(124)[::-1],), {"a": 0.5}      # stepped, reversed
    yield f32(4, 5, 6, 7, 8)[:, ::2, :, ::2], (f32(8),), {"a": 3.0}    # > 4 dims after merging
    yield rng.standard_normal((20, 30)), (f32(20, 30),), {"a": 1.5}   # float64 + float32


SPEC = chunkernels.KernelSpec(
    name="scaled_add",
    summary="a * x + y, y broadcast over x (NumPy rules); reference: numpy multiply, then add",
    cpu=scaled_add_cpu,
    gpu=scaled_add_gpu,
    kind="raw",
    code=SCALED_ADD_CU,  # inline source: a user kernel ships no file in kernels_cuda/
    entries=("scaled_add<float, float, float, int>",
             "scaled_add<double, double, double, long long>"),
    dtypes=("float32", "float64"),  # other dtypes run the CPU reference
    operands=("y",),
    alignment="broadcast",
    validate=_validate,
    cases=_cases,
)

chunkernels.register(SPEC)  # in a notebook cell you re-run, pass replace=True
# --8<-- [end:register]


def main() -> None:
    # --8<-- [start:use-cpu]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 1024), dtype=np.float32)
    y = rng.standard_normal(1024, dtype=np.float32)
    expected = scaled_add_cpu(x, y, a=2.5)

    dx = da.from_array(x, chunks=(1024, 512))  # NumPy chunks
    dy = da.from_array(y, chunks=512)          # lines up with x's last axis
    z = chunkernels.apply(dx, "scaled_add", dy, a=2.5)
    assert isinstance(z._meta, np.ndarray) and z.chunks == dx.chunks
    assert_close(z.compute(), expected)

    # The same kernel as a block function, for graphs you build yourself.
    f = chunkernels.blockwise("scaled_add", a=2.5)
    assert_close(da.map_blocks(f, dx, dy, **f.kwargs(dx, dy)).compute(), expected)

    # Operands whose chunks do not line up with x are refused before a graph is built ...
    try:
        chunkernels.apply(dx, "scaled_add", dy.rechunk(300), a=2.5)
        raise AssertionError("misaligned operand was accepted")
    except chunkernels.AlignmentError as exc:
        print(f"refused as expected: {str(exc)[:90]}...")
    # ... or rechunked on request.
    z = chunkernels.apply(dx, "scaled_add", dy.rechunk(300), a=2.5, align=True)
    assert_close(z.compute(), expected)
    print("CPU path: verified against the CPU reference (NumPy chunks)")
    # --8<-- [end:use-cpu]

    # --8<-- [start:use-gpu]
    if cuda.gpu_count() > 0:
        cp = cuda.cupy()
        gx = da.from_array(cp.asarray(x), chunks=(1024, 512), asarray=False)  # CuPy chunks
        gy = da.from_array(cp.asarray(y), chunks=512, asarray=False)
        z = chunkernels.apply(gx, "scaled_add", gy, a=2.5, strict=True)  # strict: no CPU fallback
        assert isinstance(z._meta, cp.ndarray)
        got = z.compute()
        assert isinstance(got, cp.ndarray)
        assert_close(got, expected)

        # Blocks of a reversed, transposed array are views with negative and foreign strides.
        view = cp.asarray(x)[::-1].T
        gz = chunkernels.apply(da.from_array(view, chunks=(256, 1000), asarray=False),
                               "scaled_add", cp.asarray(x[:, 0][::-1]), a=2.5, strict=True)
        assert_close(gz.compute(), scaled_add_cpu(x[::-1].T, x[:, 0][::-1], a=2.5))
        print(f"GPU path: verified against the CPU reference (CuPy chunks, "
              f"{cuda.gpu_count()} GPU(s))")
    else:
        print("GPU path: skipped (no CUDA GPU or CuPy here)")
    # --8<-- [end:use-gpu]

    # --8<-- [start:check]
    from chunkernels.check import check, format_table

    results = check(["scaled_add"])  # the spec's cases, every path this machine has
    print(format_table(results))
    assert not [r for r in results if r.status == "FAIL"], "scaled_add failed its check"
    # --8<-- [end:check]


if __name__ == "__main__":
    main()
