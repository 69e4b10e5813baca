"""correlate1d: a 1-D correlation along one axis, with scipy.ndimage's boundary modes.

Reference: ``scipy.ndimage.correlate1d``. This module also holds the separable pass that every
separable filter runs on the GPU (:func:`pass_gpu`: gaussian_filter, uniform_filter, sobel,
prewitt, laplace, gaussian_laplace, gaussian_gradient_magnitude, convolve1d), the device-side
helpers they share, and the fields of their specs they share (:func:`separable_spec`). CUDA
source: ``kernels_cuda/correlate1d.cu`` (boundary modes in ``kernels_cuda/boundary.cuh``).
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec
from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels._shared.filters import FilterArgumentError

#: Dtypes the CUDA kernels read and write; others (float16, complex) take the CPU reference.
GPU_DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64")
_GPU_DTYPE_SET = frozenset(np.dtype(d) for d in GPU_DTYPES)

_BLOCK = (32, 8)    # threads; matches TC and blockDim.y in correlate1d.cu
_TILE_N = 64        # outputs per tile along the axis (OY * blockDim.y)
_PITCH = 33         # shared tile pitch (TC + 1)
_MAX_GRID_YZ = 65535
_DEFAULT_SMEM = 48 * 1024


def reference(x, *, weights, axis=-1, mode="reflect", cval=0.0, origin=0, output=None):
    """CPU reference: ``scipy.ndimage.correlate1d``, with weights that reach beyond the axis and
    beyond :data:`~chunkernels._shared.filters.SCIPY_REACH` folded onto it first
    (:func:`~chunkernels._shared.filters.fold`)."""
    weights, origin = filters.fold(weights, origin, x.shape[axis], mode,
                                   least=filters.SCIPY_REACH)
    return ndi.correlate1d(x, weights, axis, output, mode, cval, origin)


def validate(ndim, weights, axis=-1, mode="reflect", cval=0.0, origin=0, output=None):
    """scipy.ndimage.correlate1d's parameters, checked and normalised."""
    weights = filters.weights_array(weights)
    if weights.ndim != 1 or weights.shape[0] < 1:
        raise FilterArgumentError(f"no filter weights given: correlate1d needs a non-empty 1-D "
                                  f"weights array; got shape {weights.shape}")
    return {"weights": weights, "axis": filters.check_axis(axis, ndim),
            "mode": filters.canonical_mode(mode), "cval": filters.check_cval(cval),
            "origin": filters.check_origin(origin, weights.shape[0]),
            "output": filters.output_dtype(output)}


def halo(ndim, *, weights, axis, origin, **params):
    """``len(weights) // 2 + |origin|`` along ``axis``."""
    return filters.depth_along(ndim, {axis: filters.reach(len(weights), origin)})


def dispatch(x, *, weights, axis, mode, cval, origin, output):
    """GPU path: one separable pass (:func:`pass_gpu`), the weights folded as the reference's."""
    weights, origin = filters.fold(weights, origin, x.shape[axis], mode)
    return pass_gpu(x, weights, axis, mode, cval, origin,
                    filters.result_dtype(x.dtype, output=output))


def supports(x, *, weights, axis, origin=0, output=None, **params):
    """The CUDA pass takes real weights, the GPU dtypes, and a tile that fits in shared memory."""
    out_dtype = filters.result_dtype(x.dtype, output=output, weights=weights)
    taps = filters.folded_taps(len(weights), origin, x.shape[axis])
    return gpu_supports(x, out_dtype, weights=weights,
                        smem=pass_smem(taps, accumulator(x.dtype, out_dtype).itemsize))


def gpu_supports(x, out_dtype, *, weights=None, smem=0):
    """``(ok, reason)`` shared by every filter's GPU path: dtypes, real weights, shared memory."""
    if np.dtype(out_dtype) not in _GPU_DTYPE_SET:
        return False, (f"the output dtype is {np.dtype(out_dtype).name}; the GPU path writes "
                       f"{', '.join(GPU_DTYPES)}")
    if weights is not None and _dtype_of(weights).kind == "c":
        return False, "complex weights are computed by the CPU reference"
    if smem > max_smem():
        return False, (f"the filter needs {smem} bytes of shared memory per tile; this device "
                       f"allows {max_smem()} (a smaller filter, or the CPU reference)")
    return True, ""


def _dtype_of(a) -> np.dtype:
    """The dtype of an array (NumPy or CuPy, read without a copy) or of a sequence."""
    return a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype


def accumulator(x_dtype, out_dtype) -> np.dtype:
    """float32 sums for float32 data (the GPU's fast path), float64 otherwise, as scipy sums."""
    if np.dtype(x_dtype) == np.float32 and np.dtype(out_dtype) == np.float32:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def pass_smem(m: int, itemsize: int) -> int:
    """Shared memory of one correlate1d_pass tile for ``m`` taps."""
    return ((_TILE_N + m) * _PITCH + m) * itemsize


@functools.cache
def _smem_limit(device: int) -> int:
    attrs = cuda.cupy().cuda.Device(device).attributes
    return int(attrs.get("MaxSharedMemoryPerBlockOptin", _DEFAULT_SMEM))


def max_smem() -> int:
    """Dynamic shared memory a block may opt into on the current device."""
    return _smem_limit(cuda.cupy().cuda.runtime.getDevice())


def launchable(kernel, smem: int):
    """``kernel`` allowed to use ``smem`` bytes of dynamic shared memory (above 48 KiB needs an
    opt-in per function, a driver call made once per function and size)."""
    key = (cuda.cupy().cuda.runtime.getDevice(), kernel)
    if smem > _OPTED_IN.get(key, _DEFAULT_SMEM):
        kernel.max_dynamic_shared_size_bytes = smem
        _OPTED_IN[key] = smem
    return kernel


_OPTED_IN: dict[tuple, int] = {}  # (device, kernel) -> dynamic shared memory it may use


def symmetry(weights) -> int:
    """scipy's classification of 1-D weights (``NI_Correlate1D``), which picks its summation order:
    1 symmetric, -1 antisymmetric (odd lengths, within DBL_EPSILON), 0 otherwise.

    Cached by value: every block of a filter asks it of the same weights.
    """
    return _symmetry(np.ascontiguousarray(weights, dtype=np.float64).tobytes())


@functools.lru_cache(maxsize=1024)
def _symmetry(raw: bytes) -> int:
    weights = np.frombuffer(raw, dtype=np.float64)
    if len(weights) % 2 == 0:
        return 0
    h = len(weights) // 2
    left, right = weights[h - 1::-1] if h else weights[:0], weights[h + 1:]
    eps = np.finfo(np.float64).eps
    if np.all(np.abs(right - left) <= eps):
        return 1
    if np.all(np.abs(right + left) <= eps):
        return -1
    return 0


def pass_gpu(x, weights, axis, mode, cval, origin, out_dtype, divisor=1.0):
    """``scipy.ndimage.correlate1d(x, weights, axis, out_dtype, mode, cval, origin)`` on the device.

    ``x`` is a CuPy view of any strides; the result is a new array laid out like ``x``.
    ``divisor`` divides each sum before it is stored (uniform_filter's mean). The launches are
    planned once per layout, filter length and parameters (:class:`_PassPlan`): interior Dask
    blocks share them, so a block costs an allocation and its launches.
    """
    cp = cuda.cupy()
    out_dtype = np.dtype(out_dtype)
    key = (cp.cuda.runtime.getDevice(), x.shape, x.strides, x.dtype, out_dtype, axis,
           len(weights), origin, mode)
    plan = _PASS_PLANS.get(key)
    if plan is None:
        if len(_PASS_PLANS) >= _MAX_PASS_PLANS:
            _PASS_PLANS.clear()
        plan = _PASS_PLANS[key] = _PassPlan(cp, x, len(weights), axis, mode, origin, out_dtype)
    return plan(cp, x, weights, cval, divisor)


_PASS_PLANS: dict[tuple, _PassPlan] = {}
_MAX_PASS_PLANS = 4096


class _PassPlan:
    """One separable pass for one layout: the output's allocation, the accumulator, and per
    launch the path of indices to its views, the compiled kernel, the grid and the scalars
    (``cval`` and the divisor are given per call)."""

    __slots__ = ("alloc", "out_dtype", "acc", "smem", "launches", "_weights")

    def __init__(self, cp, x, m, axis, mode, origin, out_dtype):
        self.alloc = layout.Allocation(x.shape, x.strides)
        self.out_dtype = out_dtype
        out = self.alloc.empty(cp, out_dtype)
        self.acc = accumulator(x.dtype, out.dtype)
        self.smem = pass_smem(m, self.acc.itemsize)
        self.launches = []
        self._weights = (None, None, 0)  # the last host weights, their device copy, symmetry
        if x.size == 0:
            return
        index = np.int64 if layout.needs_index64(x, out) else np.int32
        expr_head = (f"correlate1d_pass<{cuda.cuda_type(x.dtype)}, {cuda.cuda_type(out.dtype)}, "
                     f"{cuda.cuda_type(self.acc)}, {'long long' if index is np.int64 else 'int'}")
        scalars = (np.int32(m), np.int32(m // 2 + origin))
        code = np.int32(filters.MODES.index(mode))
        for path, geometry in _pass_views(x, out, axis):
            n, sxa, soa, ncol, sxc, soc, e0, e1, sx0, sx1, so0, so1 = geometry
            fast = "true" if abs(soa) == 1 and n > 1 else "false"
            kernel = launchable(cuda.function("correlate1d", f"{expr_head}, {fast}>"), self.smem)
            grid = (-(-ncol // _BLOCK[0]), min(_MAX_GRID_YZ, -(-n // _TILE_N)),
                    min(_MAX_GRID_YZ, e0 * e1))
            self.launches.append((path, kernel, grid, (*scalars, *map(index, geometry), code)))

    def __call__(self, cp, x, weights, cval, divisor):
        out = self.alloc.empty(cp, self.out_dtype)
        if not self.launches:
            return out
        w, sym = self._device_weights(weights)
        tail = (self.acc.type(cval), self.acc.type(divisor), np.int32(sym))
        for path, kernel, grid, scalars in self.launches:
            xv, ov = x, out
            for index in path:
                xv, ov = xv[index], ov[index]
            kernel(grid, _BLOCK, (xv, ov, w, *scalars, *tail), shared_mem=self.smem)
        return out

    def _device_weights(self, weights):
        """``weights`` on the device and their symmetry; the same read-only array as the last
        call's (every block of a filter passes the same cached weights) reuses both."""
        seen, w, sym = self._weights
        if weights is seen:
            return w, sym
        w, sym = cuda.device_constant(weights, self.acc), symmetry(weights)
        if frozen(weights):
            self._weights = (weights, w, sym)
        return w, sym


def frozen(a) -> bool:
    """Whether NumPy array ``a`` and the memory it views are read-only: its values cannot change."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is None


def _pass_views(x, out, axis, path=()):
    """``(path, geometry)`` of the launches covering ``x`` for a pass along ``axis``.

    The columns are the innermost axis in memory other than ``axis`` (so loads and stores are
    coalesced along the axis itself when it is innermost, along the columns otherwise); the
    remaining axes are collapsed into at most two outer dims, and views that keep more are split
    along the outermost of them: ``path`` lists the indices that take a launch's views of ``x``
    and ``out``, one after another (empty: the whole arrays).
    """
    xs, os_ = layout.element_strides(x), layout.element_strides(out)
    order = [a for a in layout.memory_order(out.shape, out.strides) if out.shape[a] > 1]
    others = [a for a in order if a != axis]
    col = others[-1] if others else None
    rest = [a for a in range(x.ndim) if a not in (axis, col)]
    pick = tuple(0 if a in (axis, col) else slice(None) for a in range(x.ndim))
    plan = layout.plan_pointwise(out[pick], x[pick])
    if plan.ndim > 2:
        split = rest[plan.axes[0][0]]
        for i in range(x.shape[split]):
            index = (slice(None),) * split + (i,)
            yield from _pass_views(x[index], out[index], axis - (axis > split), (*path, index))
        return
    shape = (1,) * (2 - plan.ndim) + plan.shape
    so = (0,) * (2 - plan.ndim) + plan.strides[0]
    sx = (0,) * (2 - plan.ndim) + plan.strides[1]
    ncol = 1 if col is None else x.shape[col]
    sxc = 0 if col is None else xs[col]
    soc = 0 if col is None else os_[col]
    yield path, (x.shape[axis], xs[axis], os_[axis], ncol, sxc, soc, shape[0], shape[1],
                 sx[0], sx[1], so[0], so[1])


def cases(rng):
    """Random inputs for ``chunkernels check``: modes, origins, layouts, integer data."""
    w5 = rng.standard_normal(5)
    x = random_array(rng, (37, 29), "float64")
    for mode in filters.MODES:
        yield x, (), {"weights": w5, "axis": 0, "mode": mode, "cval": 0.5}
    yield random_array(rng, (23, 31), "float32"), (), {"weights": rng.standard_normal(4), "origin": -2}
    yield random_array(rng, (8, 9, 10), "float32").transpose(2, 0, 1)[::-1], (), {"weights": w5, "axis": 1, "mode": "wrap"}
    yield random_array(rng, (40, 30), "uint8", nonnegative=True), (), {"weights": [0.25, 0.5, 0.25], "axis": 1}
    # weights reaching beyond the axis: folded onto it
    yield random_array(rng, (5, 7), "float64"), (), {"weights": rng.standard_normal(31), "axis": 0,
                                                     "mode": "nearest", "origin": 6}


#: Instantiations of the separable pass that CI compiles with nvcc (tests/test_nvcc.py): all of
#: them for correlate1d, the first two for each other filter made of its passes (the same source).
PASS_ENTRIES = (
    "correlate1d_pass<float, float, float, int, true>",
    "correlate1d_pass<float, float, float, int, false>",
    "correlate1d_pass<double, double, double, long long, true>",
    "correlate1d_pass<unsigned char, unsigned char, double, int, false>",
    "correlate1d_pass<long long, unsigned long long, double, int, true>",
)


def separable_spec(**fields) -> KernelSpec:
    """The spec of a filter made of :func:`pass_gpu` passes: the fields every such filter shares,
    and ``fields``, the filter's own (which replace a shared one where given: sobel's boundary,
    correlate1d's entries).

    Shared: raw kernels from ``correlate1d.cu`` and two of its instantiations for CI to
    compile, the dtypes the passes read and write, scipy.ndimage's output dtype and the Dask
    boundary of scipy.ndimage's modes.
    """
    shared = {"kind": "raw", "source": "correlate1d.cu", "entries": PASS_ENTRIES[:2],
              "dtypes": GPU_DTYPES, "boundary": filters.boundary,
              "result_dtype": filters.result_dtype}
    return KernelSpec(**{**shared, **fields})


SPEC = separable_spec(
    name="correlate1d",
    summary="1-D correlation along an axis, scipy.ndimage modes; reference scipy.ndimage.correlate1d",
    cpu=reference,
    gpu=dispatch,
    entries=PASS_ENTRIES,
    ndim=(1, None),
    halo=halo,
    halo_rule="len(weights) // 2 + |origin| along axis",
    stack=filters.stacked_axis,
    supports=supports,
    validate=validate,
    cases=cases,
)
