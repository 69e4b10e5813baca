"""correlate: N-D correlation with N-D weights and scipy.ndimage's boundary modes.

Reference: ``scipy.ndimage.correlate``. This module also holds the N-D device launch
(:func:`correlate_gpu`) that convolve and scipy.signal's convolve2d run on. CUDA source:
``kernels_cuda/correlate.cu`` (boundary modes in ``kernels_cuda/boundary.cuh``).
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec
from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels._shared.filters import FilterArgumentError
from chunkernels.kernels import correlate1d

#: Filtered dims the CUDA kernel handles; other axes must have one tap (they are looped over).
MAX_FILTERED = 3
_TILE = (64, 64)    # outputs per tile along dims 1 and 2 (BY, BX in correlate.cu)


def reference(x, *, weights, origin, mode="reflect", cval=0.0, output=None):
    """CPU reference: ``scipy.ndimage.correlate``, with weights that reach beyond an axis (and
    beyond :func:`scipy_reach`) folded onto it first (:func:`~chunkernels._shared.filters.fold`)."""
    origin = list(origin)
    for axis, n in enumerate(x.shape):
        weights, origin[axis] = filters.fold(
            weights, origin[axis], n, mode, axis,
            scipy_reach(filters.reach(weights.shape[axis], origin[axis]), n, mode))
    return ndi.correlate(x, weights, output, mode, cval, origin)


def scipy_reach(reach, n, mode) -> int:
    """How far taps along an axis of ``n`` samples may reach for the CPU reference to leave them
    to SciPy's N-D filters (:data:`~chunkernels._shared.filters.SCIPY_REACH`), except in
    'reflect' mode where they reach 4n: SciPy's N-D filters map an offset that is a multiple of
    2n from -4n on to position -1 instead of 0 (its 1-D correlation is right), so those fold."""
    return 0 if mode == "reflect" and reach >= 4 * n else filters.SCIPY_REACH


def validate(ndim, weights, mode="reflect", cval=0.0, origin=0, axes=None, output=None):
    """scipy.ndimage.correlate's parameters: the weights expanded to the input's ndim (size-1
    axes for the axes not filtered) and one origin per axis."""
    weights = filters.weights_array(weights)
    axes = filters.check_axes(axes, ndim)
    if weights.ndim != len(axes):
        raise FilterArgumentError(
            f"weights.ndim ({weights.ndim}) must match len(axes) ({len(axes)}): weights of shape "
            f"{weights.shape} for an input of ndim {ndim}; give weights with one axis per "
            f"filtered axis")
    if 0 in weights.shape:
        raise FilterArgumentError(f"no filter weights given: weights of shape {weights.shape}")
    full = np.expand_dims(weights, tuple(a for a in range(ndim) if a not in axes))
    full.setflags(write=False)
    origins = [0] * ndim
    # scipy gives the weights' axes to the filtered axes in increasing order, and the origins in
    # the order axes lists them, except when every axis is filtered: then in axis order too
    order = range(ndim) if len(axes) == ndim else axes
    for ax, o in zip(order, filters.per_axis(origin, len(axes), "origin")):
        origins[ax] = filters.check_origin(o, full.shape[ax])
    if not isinstance(mode, str):
        raise FilterArgumentError(f"A sequence of modes is not supported: mode={mode!r}; N-D "
                                  f"correlate and convolve take one mode for every axis")
    return {"weights": full, "origin": tuple(origins), "mode": filters.canonical_mode(mode),
            "cval": filters.check_cval(cval), "output": filters.output_dtype(output)}


def halo(ndim, *, weights, origin, **params):
    """``weights.shape[k] // 2 + |origin[k]|`` along every axis."""
    return tuple(filters.reach(m, o) for m, o in zip(weights.shape, origin))


def dispatch(x, *, weights, origin, mode, cval, output):
    """GPU path: the N-D tile kernel, the weights folded as the reference's."""
    weights, origin = filters.fold_all(weights, origin, x.shape, mode)
    starts = [-(m // 2 + o) for m, o in zip(weights.shape, origin)]
    out_dtype = filters.result_dtype(x.dtype, output=output)
    return correlate_gpu(x, weights, starts, x.shape, mode, cval, out_dtype,
                         correlate1d.accumulator(x.dtype, out_dtype))


def supports(x, *, weights, origin, mode="reflect", output=None, **params):
    """The tile kernel: real weights, at most three filtered axes, a tile that fits (of the
    weights folded where they reach beyond an axis)."""
    out_dtype = filters.result_dtype(x.dtype, output=output, weights=weights)
    weights, _ = filters.fold_all(weights, origin, x.shape, mode)
    return nd_supports(x, weights, out_dtype, correlate1d.accumulator(x.dtype, out_dtype))


def nd_supports(x, weights, out_dtype, acc_dtype):
    """``(ok, reason)`` for :func:`correlate_gpu`."""
    plan = _plan(x, weights.shape)
    if plan is None:
        return False, (f"weights of shape {weights.shape} filter more than {MAX_FILTERED} axes; "
                       f"the GPU kernel filters at most {MAX_FILTERED}")
    return correlate1d.gpu_supports(x, out_dtype, weights=weights,
                                    smem=_smem(plan[2], np.dtype(acc_dtype).itemsize))


def _plan(x, taps):
    """``(order, looped, taps3)`` for a launch on ``x``, or ``None`` if the kernel cannot take it.

    ``order``: axes outermost-first in memory (dim 2 of the kernel is the innermost); ``looped``:
    positions in that order of single-tap axes taken one slice at a time so that three remain;
    ``taps3``: the kernel's three weight extents.
    """
    order = layout.memory_order(x.shape, x.strides)
    ordered = [taps[a] for a in order]
    looped = []
    for pos, m in enumerate(ordered):
        if len(ordered) - len(looped) <= MAX_FILTERED:
            break
        if m == 1:
            looped.append(pos)
    if len(ordered) - len(looped) > MAX_FILTERED:
        return None
    kept = [m for pos, m in enumerate(ordered) if pos not in looped]
    return order, looped, (1,) * (MAX_FILTERED - len(kept)) + tuple(kept)


def _smem(taps3, itemsize: int) -> int:
    """Shared memory of one correlate_nd tile: the input tile and one plane of weights."""
    _, m1, m2 = taps3
    return ((_TILE[0] + m1 - 1) * (_TILE[1] + m2 - 1) + m1 * m2) * itemsize


def correlate_gpu(x, weights, starts, out_shape, mode, cval, out_dtype, acc_dtype, *, flip=False):
    """``out[p] = sum_k w[k] * x~[p + starts + k]`` on the device, ``x~`` extended by ``mode``;
    ``w`` is ``weights``, reversed along every axis when ``flip`` (a convolution).

    ``x`` is a non-empty CuPy view of any strides and ``weights`` a host or CuPy array of the
    same ndim (size-1 axes where nothing is filtered; CuPy weights are rearranged on the device,
    one small copy per call, without a synchronising host copy); the result, of ``out_shape``,
    is laid out in ``x``'s memory order (C order for integer results of double sums, which are
    summed in scipy's order). Beyond three filtered axes, single-tap axes (same extent in and
    out) are looped over. The launches are planned once per layout and parameters (:class:`_NDPlan`):
    interior Dask blocks and repeated calls share them.
    """
    cp = cuda.cupy()
    if np.dtype(out_dtype).kind in "biu" and np.dtype(acc_dtype) == np.float64 and \
            not x.flags.c_contiguous:
        # integer results are summed in scipy's order, the taps in C order of the weights, which
        # the kernel walks in the data's memory order: the data must be in C order too
        x = cp.ascontiguousarray(x)
    key = (cp.cuda.runtime.getDevice(), x.shape, x.strides, x.dtype.str, weights.shape,
           tuple(starts), tuple(out_shape), mode, np.dtype(out_dtype).str,
           np.dtype(acc_dtype).str)
    plan = _ND_PLANS.get(key)
    if plan is None:
        if len(_ND_PLANS) >= _MAX_ND_PLANS:
            _ND_PLANS.clear()
        plan = _ND_PLANS[key] = _NDPlan(cp, x, weights.shape, starts, out_shape, mode,
                                        out_dtype, acc_dtype)
    return plan(cp, x, weights, flip, cval)


_ND_PLANS: dict[tuple, _NDPlan] = {}
_MAX_ND_PLANS = 4096


class _NDPlan:
    """The launches of :func:`correlate_gpu` for one layout and set of parameters: the output's
    allocation, the compiled kernel, and per launch its views, grid and scalars. A call then
    costs the allocation, the weights (reused while the same read-only host array comes back)
    and the launches. An empty output has no launches (and no kernel)."""

    __slots__ = ("order", "identity", "alloc_shape", "axes", "out_dtype", "acc", "taps3",
                 "kernel", "smem", "launches", "_weights", "_fill")

    def __init__(self, cp, x, taps, starts, out_shape, mode, out_dtype, acc_dtype):
        order, looped, taps3 = _plan(x, taps)
        self.order = tuple(int(a) for a in order)
        self.identity = self.order == tuple(range(x.ndim))
        self.alloc_shape = tuple(out_shape[a] for a in order)
        inverse = tuple(int(a) for a in np.argsort(order))
        self.axes = None if self.identity else inverse
        self.out_dtype = np.dtype(out_dtype)
        self.acc = np.dtype(acc_dtype)
        self.taps3 = taps3
        self._weights = (None, False, None)  # the last weights, whether flipped, device copy
        self._fill = (None, None)            # the last (type, cval) and its value to sum
        self.launches = []
        # correlation commutes with permuting the axes of x, out, weights and starts together
        alloc = cp.empty(self.alloc_shape, dtype=out_dtype)
        if alloc.size == 0:
            return
        out = alloc if self.axes is None else alloc.transpose(self.axes)
        xt = x.transpose(order)
        keep = [pos for pos in range(x.ndim) if pos not in looped]
        st = [0] * (MAX_FILTERED - len(keep)) + [starts[order[pos]] for pos in keep]
        index = np.int64 if layout.needs_index64(x, out) else np.int32
        self.kernel = cuda.function("correlate", f"correlate_nd<{cuda.cuda_type(x.dtype)}, "
                                    f"{cuda.cuda_type(out.dtype)}, {cuda.cuda_type(self.acc)}, "
                                    f"{'long long' if index is np.int64 else 'int'}>")
        self.smem = _smem(taps3, self.acc.itemsize)
        correlate1d.launchable(self.kernel, self.smem)
        pad = (None,) * (MAX_FILTERED - len(keep))
        for at in np.ndindex(*(x.shape[order[pos]] for pos in looped)):
            pick = [slice(None)] * x.ndim
            for pos, i in zip(looped, at):
                pick[pos] = i
            pick = tuple(pick)
            xv, ov = xt[pick][pad], alloc[pick][pad]
            p0, p1, p2 = ov.shape
            grid = (-(-p2 // _TILE[1]), min(65535, -(-p1 // _TILE[0])), min(65535, p0))
            scalars = (*map(np.int32, taps3),
                       *map(index, xv.shape), *map(index, layout.element_strides(xv)),
                       *map(index, ov.shape), *map(index, layout.element_strides(ov)),
                       *map(index, st), np.int32(filters.MODES.index(mode)))
            # a launch without looped axes reads x and writes the allocation from their first
            # element: the arrays themselves carry the addresses, no view is needed per call
            self.launches.append((pick if looped else None, pad, grid, scalars))

    def __call__(self, cp, x, weights, flip, cval):
        alloc = cp.empty(self.alloc_shape, dtype=self.out_dtype)
        out = alloc if self.axes is None else alloc.transpose(self.axes)
        if not self.launches:
            return out
        w = self._device_weights(cp, weights, flip)
        fill = self._fill_value(cval)
        for pick, pad, grid, scalars in self.launches:
            if pick is None:  # x and the allocation start at the view's first element
                xv, ov = x, alloc
            else:
                xv = (x if self.identity else x.transpose(self.order))[pick][pad]
                ov = alloc[pick][pad]
            self.kernel(grid, (32, 8), (xv, ov, w, *scalars, fill), shared_mem=self.smem)
        return out

    def _device_weights(self, cp, weights, flip):
        """The weights as the kernel reads them: in the sum's type, C-ordered planes of
        (m1, m2) taps in x's memory order, on the device."""
        seen, seen_flip, w = self._weights
        if weights is seen and flip == seen_flip:
            return w
        view = weights[(slice(None, None, -1),) * weights.ndim] if flip else weights
        if cuda.is_cupy_array(weights):
            # one device copy, reversed, transposed and C-ordered, per call: CuPy arrays cannot
            # be made read-only, so nothing tells that the same array still holds the same taps
            return cp.ascontiguousarray(view.transpose(self.order), dtype=self.acc).reshape(
                self.taps3)
        w = cuda.device_constant(np.transpose(view, self.order).reshape(self.taps3), self.acc)
        if correlate1d.frozen(weights):
            self._weights = (weights, flip, w)
        return w

    def _fill_value(self, cval):
        """``cval`` in the sum's type, through an array: a uint64 fill value wraps into an
        int64 accumulator, as the sums do. The last Python number's conversion is kept."""
        if type(cval) not in (bool, int, float, complex):
            return np.asarray(cval).astype(self.acc)[()]
        key = (type(cval), cval)
        seen, fill = self._fill
        if seen != key:
            fill = np.asarray(cval).astype(self.acc)[()]
            self._fill = (key, fill)
        return fill


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (37, 29), "float64")
    w = rng.standard_normal((5, 4))
    for mode in filters.MODES:
        yield x, (), {"weights": w, "mode": mode, "cval": 0.5, "origin": (1, -2)}
    yield random_array(rng, (20, 9, 10), "float32").transpose(2, 0, 1)[:, ::-1], (), {
        "weights": rng.standard_normal((3, 2, 3)), "mode": "wrap"}
    yield random_array(rng, (40, 30), "int32"), (), {"weights": rng.standard_normal(3), "axes": (1,)}
    # weights reaching beyond the array: folded onto it
    yield random_array(rng, (4, 5), "float64"), (), {"weights": rng.standard_normal((13, 11)),
                                                     "mode": "wrap", "origin": (2, -1)}


SPEC = KernelSpec(
    name="correlate",
    summary="N-D correlation with N-D weights, scipy.ndimage modes; reference scipy.ndimage.correlate",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="correlate.cu",
    entries=(
        "correlate_nd<float, float, float, int>",
        "correlate_nd<double, double, double, long long>",
        "correlate_nd<unsigned char, unsigned char, double, int>",
        "correlate_nd<int, int, long long, int>",
    ),
    dtypes=correlate1d.GPU_DTYPES,
    halo=halo,
    halo_rule="weights.shape[k] // 2 + |origin[k]| per axis",
    boundary=filters.boundary,
    result_dtype=filters.result_dtype,
    supports=supports,
    validate=validate,
    cases=cases,
)
