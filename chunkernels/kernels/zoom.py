"""zoom: separable spline resampling of one output block from the input region it reads.

The block kernel behind :func:`chunkernels.ndimage.zoom` and :func:`chunkernels.ndimage.resize`.
Everything that depends on the edge mode, the zoom factors, the grid mode and the block's position
in the whole array is worked out on the host, once per axis, as two small tables: for each output
index along an axis, the ``order + 1`` positions it reads along that axis of the region (``-1``:
the constant ``cval``) and their B-spline weights. The kernel then computes, for every output
element, the tensor-product sum

    out[o0, o1, ...] = sum_k0 w0[o0, k0] * sum_k1 w1[o1, k1] * ... region[t0[o0, k0], t1[o1, k1], ...]

so one compiled kernel per (dtypes, ndim, order) serves every block shape, position and mode:
uneven edge blocks never recompile. The tables are built here (:func:`zoom_tables`, from
:func:`axis_taps`) with ``scipy.ndimage.zoom``'s rules, by :func:`chunkernels.ndimage.zoom` and
:func:`chunkernels.ndimage.resize`.
CUDA source: ``kernels_cuda/zoom.cu``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from chunkernels import _graph, cuda, layout
from chunkernels._registry import KernelSpec
from chunkernels._shared.interpolation import PREPADDED, check_mode

#: Dims the CUDA kernel takes; blocks of more dims use the CPU reference.
MAX_NDIM = 4
_THREADS = 256
_MAX_GRID_Y = 65535


#: Tap values that read no coefficient: the constant ``cval`` for this tap, or for the output.
CVAL_TAP = -1
OUTSIDE = -2


# -- the tables: SciPy's geometry, vectorised ------------------------------------------------


def map_coordinate(c, n: int, mode: str):
    """SciPy's ``map_coordinate``: coordinates ``c`` (float64 array) folded into ``[0, n)``.

    Coordinates inside ``[0, n - 1]`` are unchanged; outside, ``'constant'`` gives -1 (the
    constant value) and the other modes fold them back as the C code does, truncations included.
    """
    c = np.array(c, dtype=np.float64)
    lo, hi = c < 0, c > n - 1
    if not (lo.any() or hi.any()) or mode == "grid-constant":
        return c
    if mode == "constant":
        c[lo | hi] = -1.0
        return c
    if mode == "nearest":
        c[lo], c[hi] = 0.0, n - 1.0
        return c
    if n <= 1:
        c[lo | hi] = 0.0
        return c
    v, w = c[lo], c[hi]
    if mode == "mirror":
        p = 2 * n - 2
        v = p * np.trunc(-v / p) + v
        v = np.where(v <= 1 - n, v + p, -v)
        w = w - p * np.trunc(w / p)
        w = np.where(w >= n, p - w, w)
    elif mode == "reflect":
        p = 2 * n
        v = np.where(v < -p, p * np.trunc(-v / p) + v, v)
        # SciPy keeps -in - 1 away from -1 exactly (a point at -1 would read as "outside")
        v = np.where(v < -n, v + p, np.where(v > -1e-15, 1e-15, -v) - 1)
        w = w - p * np.trunc(w / p)
        w = np.where(w >= n, p - w - 1, w)
    elif mode == "wrap":
        p = n - 1
        v = v + p * (np.trunc(-v / p) + 1)
        w = w - p * np.trunc(w / p)
    else:  # grid-wrap
        v = v + n * (np.trunc((-1 - v) / n) + 1)
        w = w - n * np.trunc(w / n)
    c[lo], c[hi] = v, w
    return c


def spline_weights(c, order: int):
    """B-spline weights of the ``order + 1`` taps around coordinates ``c``: shape ``(n, K)``.

    SciPy's ``get_spline_interpolation_weights``, with its arithmetic, so the weights agree to
    the last bit.
    """
    c = np.asarray(c, dtype=np.float64)
    x = c - np.floor(c if order & 1 else c + 0.5)
    w = np.empty(c.shape + (order + 1,))
    if order == 0:
        w[..., 0] = 1.0
        return w
    y, z = x, 1.0 - x
    if order == 1:
        w[..., 0] = 1.0 - x
    elif order == 2:
        w[..., 1] = 0.75 - x * x
        y = 0.5 - x
        w[..., 0] = 0.5 * y * y
    elif order == 3:
        w[..., 1] = (y * y * (y - 2.0) * 3.0 + 4.0) / 6.0
        w[..., 2] = (z * z * (z - 2.0) * 3.0 + 4.0) / 6.0
        w[..., 0] = z * z * z / 6.0
    elif order == 4:
        t = x * x
        w[..., 2] = t * (t * 0.25 - 0.625) + 115.0 / 192.0
        y = 1.0 + x
        w[..., 1] = y * (y * (y * (5.0 - y) / 6.0 - 1.25) + 5.0 / 24.0) + 55.0 / 96.0
        w[..., 3] = z * (z * (z * (5.0 - z) / 6.0 - 1.25) + 5.0 / 24.0) + 55.0 / 96.0
        y = 0.5 - x
        t = y * y
        w[..., 0] = t * t / 24.0
    else:
        t = y * y
        w[..., 2] = t * (t * (0.25 - y / 12.0) - 0.5) + 0.55
        t = z * z
        w[..., 3] = t * (t * (0.25 - z / 12.0) - 0.5) + 0.55
        y = y + 1.0
        w[..., 1] = y * (y * (y * (y * (y / 24.0 - 0.375) + 1.25) - 1.75) + 0.625) + 0.425
        z = z + 1.0
        w[..., 4] = z * (z * (z * (z * (z / 24.0 - 0.375) + 1.25) - 1.75) + 0.625) + 0.425
        y = 1.0 - x
        t = y * y
        w[..., 0] = y * t * t / 120.0
    # the weights add to 1: SciPy computes the last one from the others, in this order
    last = np.ones(c.shape)
    for i in range(order):
        last = last - w[..., i]
    w[..., order] = last
    return w


def axis_taps(positions, n_in: int, scale: float, *, order: int, mode: str, grid_mode: bool,
              npad: int = 0):
    """Taps and weights of output ``positions`` along one axis (SciPy's ``NI_ZoomShift``).

    Parameters
    ----------
    positions
        Output indices along the axis (any subset: one block's).
    n_in
        Length of the array read along the axis (the spline coefficients, prepadding included).
    scale
        Input distance per output step: ``(in - 1) / (out - 1)``, or ``in / out`` in grid mode.
    order, mode, grid_mode
        As ``scipy.ndimage.zoom`` takes them (``mode`` already checked).
    npad
        Samples prepadded before the axis's first input sample.

    Returns
    -------
    taps : numpy.ndarray of int64, shape (n, order + 1)
        Positions read along the axis, folded into ``[0, n_in)`` by the mode; -1 where the
        constant ``cval`` is read instead (``'grid-constant'`` taps outside); -2 on every tap
        of an output that is ``cval`` outright (outside the input under ``'constant'``).
    weights : numpy.ndarray of float64, shape (n, order + 1)
    """
    cc = input_positions(positions, scale, grid_mode) + npad
    if mode not in PREPADDED:
        cc = map_coordinate(cc, n_in, mode)
    outside = ~(cc > -1.0) if mode not in PREPADDED else np.zeros(cc.shape, bool)
    start = np.floor(cc if order & 1 else cc + 0.5).astype(np.int64) - order // 2
    taps = start[:, None] + np.arange(order + 1)
    if mode == "grid-constant":
        taps[(taps < 0) | (taps >= n_in)] = CVAL_TAP
    else:
        # SciPy folds the taps of the spline's support with the prefilter's boundary condition
        spline_mode = "mirror" if mode in ("constant", "wrap") else mode
        edge = (start < 0) | (start + order >= n_in)
        if edge.any():
            taps[edge] = map_coordinate(taps[edge], n_in, spline_mode).astype(np.int64)
    weights = spline_weights(cc, order)
    if outside.any():  # SciPy stores cval for these, whatever the other axes say
        taps[outside] = OUTSIDE
        weights[outside] = 0.0
    return taps, weights


def input_positions(positions, scale: float, grid_mode: bool) -> np.ndarray:
    """Where output ``positions`` along one axis stand in the input, in (fractional) input
    indices: SciPy's mapping of a zoom with input distance ``scale`` per output step
    (:func:`zoom_scales`), the first and last samples' centres (or, in ``grid_mode``, the
    pixels' outer edges) mapped onto each other."""
    cc = np.asarray(positions, dtype=np.float64)
    return (cc + 0.5) * scale - 0.5 if grid_mode else cc * scale


def zoom_scales(in_shape, out_shape, grid_mode: bool) -> tuple[float, ...]:
    """Input distance per output step along each axis; 1 where the output has no step."""
    scales = []
    for n_in, n_out in zip(in_shape, out_shape):
        num, den = (n_in, n_out) if grid_mode else (n_in - 1, n_out - 1)
        scales.append(num / den if den != 0 else 1.0)
    return tuple(scales)


def zoom_tables(in_shape, out_shape, *, order=3, mode="constant", grid_mode=False, npad=0):
    """Per-axis taps and weights of a whole zoom from ``in_shape`` to ``out_shape``.

    ``npad`` is the prepadding on each side of every axis: the taps then index an array of
    ``in_shape + 2 * npad``. The tables are computed once per set of arguments (a zoom repeated
    on volumes of one shape, a training loop's resize, costs no host work here) and are
    read-only.
    """
    return _zoom_tables(tuple(int(n) for n in in_shape), tuple(int(n) for n in out_shape),
                        int(order), check_mode(mode), bool(grid_mode), int(npad))


@functools.lru_cache(maxsize=256)
def _zoom_tables(in_shape, out_shape, order, mode, grid_mode, npad):
    taps, weights = [], []
    for n_in, n_out, scale in zip(in_shape, out_shape, zoom_scales(in_shape, out_shape, grid_mode)):
        t, w = axis_taps(np.arange(n_out), n_in + 2 * npad, scale, order=order, mode=mode,
                         grid_mode=grid_mode, npad=npad)
        t.flags.writeable = w.flags.writeable = False
        taps.append(t)
        weights.append(w)
    return tuple(taps), tuple(weights)


# -- one block: the CPU reference and the GPU path ----------------------------------------------


def reference(region, *, taps, weights, cval=0.0, dtype=None, chunks=None):
    """CPU reference: SciPy's sum, term by term in its order, in float64 (complex128).

    Each term is the coefficient times the weights of axes 0, 1, ... in turn, the terms added
    with the last axis's taps varying fastest, as ``NI_ZoomShift`` adds them, so results agree
    with SciPy to the last bit. An axis whose taps are all ``OUTSIDE`` makes the output ``cval``
    outright (SciPy's ``'constant'`` mode beyond the edge). ``chunks`` (the output chunking of a
    Dask result) plays no part on one block.
    """
    region = np.asarray(region)
    dtype = np.dtype(region.dtype if dtype is None else dtype)
    ndim = region.ndim
    work = np.complex128 if region.dtype.kind == "c" or dtype.kind == "c" else np.float64
    coefficients = region.astype(work, copy=False)
    if any((t < 0).any() for t in taps):
        # one extra slot of cval at the end of every axis: negative taps read it
        coefficients = np.pad(coefficients, [(0, 1)] * ndim, constant_values=cval)

    def along(axis, column):
        return column.reshape((-1,) + (1,) * (ndim - 1 - axis))

    out_shape = tuple(len(t) for t in taps)
    acc = np.zeros(out_shape, dtype=work)
    for combo in np.ndindex(*(t.shape[1] for t in taps)):
        index = tuple(along(a, np.maximum(taps[a][:, k], CVAL_TAP)) for a, k in enumerate(combo))
        term = coefficients[index]
        for a, k in enumerate(combo):
            term = term * along(a, weights[a][:, k])
        acc += term
    outside = np.zeros(out_shape, dtype=bool)
    for a, t in enumerate(taps):
        outside |= along(a, t[:, 0] == OUTSIDE)
    acc[outside] = cval
    return cast_result(acc, dtype)


def cast_result(values, dtype):
    """``values`` (float64 or complex128) in ``dtype`` the way SciPy's interpolators store them.

    Integers round half away from zero (unsigned: negatives become 0) and clip to the dtype's
    range; booleans truncate, as SciPy's C cast to ``npy_bool`` does (true from 1 up);
    floats and complex convert directly.
    """
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return values.astype(dtype)
    if dtype.kind == "b":
        return np.abs(values) >= 1
    info = np.iinfo(dtype)
    if dtype.kind == "u":
        rounded = np.where(values > 0, values + 0.5, 0.0)
    else:
        rounded = np.where(values > 0, values + 0.5, values - 0.5)
    with np.errstate(invalid="ignore"):
        return np.clip(rounded, info.min, info.max).astype(dtype)


def dispatch(region, *, taps, weights, cval=0.0, dtype=None, chunks=None):
    """GPU path: one thread per output element, threads along the output's last axis.

    The region is read in place through its strides; the tables travel to the device in two
    small copies. Accumulation is in float32 for float32 regions zoomed into float32 (the spline
    coefficients the zoom makes from float32 data) and in float64 otherwise, so that integer
    outputs round as SciPy's float64 sums do.
    """
    cp = cuda.cupy()
    dtype = np.dtype(region.dtype if dtype is None else dtype)
    out_shape = tuple(int(t.shape[0]) for t in taps)
    out = cp.empty(out_shape, dtype=dtype)
    if out.size == 0:
        return out
    ndim = region.ndim
    k = int(taps[0].shape[1])
    wdtype = np.float32 if region.dtype == np.float32 and dtype == np.float32 else np.float64
    cval_taps = any(bool((t < 0).any()) for t in taps)
    tap_table, weight_table = _device_tables(taps, weights, wdtype)
    rows_offset = np.cumsum([0, *out_shape[:-1]])

    strides = layout.element_strides(region) if region.size else (0,) * ndim
    span = sum((n - 1) * abs(s) for n, s in zip(region.shape, strides)) + 1
    if wdtype == np.float32 and ndim > 1 and k >= 3 and SEPARABLE:
        return _separable(region, out, strides, span, tap_table, weight_table, rows_offset, k,
                          cval_taps, cval)
    index64 = max(span * region.dtype.itemsize, out.nbytes) > layout.INT32_MAX
    index = np.int64 if index64 else np.int32
    expr = (f"zoom<{cuda.cuda_type(region.dtype)}, {cuda.cuda_type(dtype)}, "
            f"{cuda.cuda_type(wdtype)}, {'long long' if index64 else 'int'}, {ndim}, {k - 1}, "
            f"{'true' if cval_taps else 'false'}>")
    kernel = cuda.function("zoom", expr)

    lead = list(out_shape[:-1]) + [1] * (MAX_NDIM - ndim)
    rows = math.prod(out_shape[:-1])
    cols = out_shape[-1]
    s = list(strides) + [0] * (MAX_NDIM - ndim)
    r = [int(v) for v in rows_offset] + [0] * (MAX_NDIM - ndim)
    bx = min(_THREADS, 1 << max(cols - 1, 0).bit_length())
    bx = max(bx, 32)
    by = _THREADS // bx
    grid = (-(-cols // bx), min(_MAX_GRID_Y, -(-rows // by)))
    scalars = tuple(index(v) for v in (rows, cols, lead[1], lead[2], *s, *r))
    kernel(grid, (bx, by), (region, out, tap_table, weight_table, *scalars, np.float64(cval)))
    return out


def _device_tables(taps, weights, wdtype):
    """The concatenated tap (int32) and weight (``wdtype``) tables of every axis, on the device:
    a repeated zoom (the same shapes and factors, or the same output block of a recomputed
    graph) uploads nothing."""
    return (cuda.device_constant(np.concatenate([np.ravel(t) for t in taps]), np.int32),
            cuda.device_constant(np.concatenate([np.ravel(w) for w in weights]), wdtype))


#: float32 zooms of spline order 2 and up run as one 1-D pass per axis (``zoom_pass``) rather
#: than one nested sum per output (``zoom``): the same sums, in far less time for the larger
#: volumes (256³ → 512³ cubic on an H100: 2.98 ms against 4.51, prefilter included; linear
#: stays nested, 0.88 ms against 1.23 ms in passes). A switch for tests and benchmarks.
SEPARABLE = True


def _separable(region, out, strides, span, taps, weights, rows_offset, k, cval_taps, cval):
    """The float32 zoom as ``ndim`` passes of ``zoom_pass``, the last axis first, each into a
    C-contiguous float32 array (the last into ``out``); see ``kernels_cuda/zoom.cu``."""
    cp = cuda.cupy()
    ndim = region.ndim
    # pass `axis` writes the input's leading axes and the output's from `axis` on
    sizes = [math.prod(region.shape[:axis]) * math.prod(out.shape[axis:]) for axis in range(ndim)]
    index64 = max(span, *sizes) * 4 > layout.INT32_MAX
    index = np.int64 if index64 else np.int32
    itype = "long long" if index64 else "int"
    cv = "true" if cval_taps else "false"
    r = [index(v) for v in rows_offset] + [index(0)] * (MAX_NDIM - ndim)
    src, src_strides, shape = region, list(strides), list(region.shape)
    for axis in range(ndim - 1, -1, -1):
        shape[axis] = out.shape[axis]
        dst = out if axis == 0 else cp.empty(shape, dtype=np.float32)
        kernel = cuda.function("zoom", f"zoom_pass<{cuda.cuda_type(src.dtype)}, "
                                       f"{cuda.cuda_type(out.dtype)}, {itype}, {ndim}, {axis}, "
                                       f"{k - 1}, {cv}>")
        n = dst.size
        extents = list(shape[1:]) + [1] * (MAX_NDIM - ndim)  # e1..e3: C order past axis 0
        padded_strides = src_strides + [0] * (MAX_NDIM - ndim)
        grid = min(-(-n // _THREADS), 1 << 30)
        kernel((grid,), (_THREADS,), (src, dst, taps, weights, index(n),
                                      *(index(e) for e in extents),
                                      *(index(v) for v in padded_strides), *r, np.float64(cval)))
        src = dst
        src_strides = [int(v) for v in np.cumprod([1, *shape[:0:-1]])[::-1]]
    return out


# -- Dask: one task per output block, reading only the input it needs --------------------------

#: A gap wider than this between the positions an output block reads along an axis splits the
#: read in two (the far end of a periodic axis, say) instead of reading everything between.
_MAX_GAP = 16


def default_chunks(taps, in_chunks):
    """Output chunks that follow the input's: a boundary where the outputs' centre tap crosses an
    input chunk boundary, so each output block reads about one input block plus the support."""
    chunks = []
    for t, ic in zip(taps, in_chunks):
        centre = t[:, t.shape[1] // 2]
        bounds = np.cumsum(ic)[:-1]
        # outputs reading cval only, or folded back from the far end, do not move the boundary
        cuts = [int(np.count_nonzero((centre >= 0) & (centre < b))) for b in bounds]
        edges = sorted({0, len(t), *cuts})
        chunks.append(tuple(int(b - a) for a, b in zip(edges[:-1], edges[1:])) or (0,))
    return tuple(chunks)


def _axis_reads(t, in_chunks):
    """Which input blocks one output block reads along one axis, and its taps into their union.

    Returns ``(segments, local)``: ``segments`` lists ``(block index, slice)`` in the order the
    region concatenates them; ``local`` are the taps renumbered into the region (-1 kept).
    """
    used = np.unique(t[t >= 0])
    if used.size == 0:  # every tap reads cval: take one sample, so the region is not empty
        used = np.zeros(1, dtype=np.int64)
    splits = np.nonzero(np.diff(used) > _MAX_GAP)[0] + 1
    runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(used, splits)]
    bounds = np.concatenate([[0], np.cumsum(in_chunks)])
    segments, run_starts, run_offsets, offset = [], [], [], 0
    for lo, hi in runs:
        run_starts.append(lo)
        run_offsets.append(offset)
        offset += hi - lo
        first = int(np.searchsorted(bounds, lo, side="right")) - 1
        for j in range(first, len(in_chunks)):
            a, b = max(lo, int(bounds[j])), min(hi, int(bounds[j + 1]))
            if a >= b:
                if bounds[j] >= hi:
                    break
                continue
            segments.append((j, slice(a - int(bounds[j]), b - int(bounds[j]))))
    run_starts, run_offsets = np.array(run_starts), np.array(run_offsets)
    which = np.searchsorted(run_starts, t, side="right") - 1
    local = np.where(t >= 0, run_offsets[which] + t - run_starts[which], t)
    return segments, local


def _assemble(parts, segments):
    """The region: the blocks' slices, concatenated axis by axis (a view when there is one)."""
    grid = list(np.ndindex(*(len(s) for s in segments)))  # C order: the last axis fastest
    pieces = [part[tuple(segments[a][i][1] for a, i in enumerate(ix))]
              for part, ix in zip(parts, grid)]
    return _graph.assembled(pieces, [len(s) for s in segments])


class _BlockPlan:
    """What one output block's task needs besides the input blocks: the slices it takes of them
    (per axis, ``(block index, slice)`` pairs) and the kernel's parameters (local taps)."""

    __slots__ = ("segments", "params")

    def __init__(self, segments, params):
        self.segments = segments
        self.params = params


def _block_task(strict, plan, *parts):
    """Task body: assemble the region from the input blocks, then run the kernel on it."""
    from chunkernels._dispatch import run_block

    region = _assemble(parts, plan.segments)
    return run_block(SPEC, region, (), plan.params, strict=strict)


def dask_graph(x, *, strict=False, taps, weights, cval=0.0, dtype=None, chunks=None):
    """The zoom of a Dask array: one task per output block, which reads only the input blocks
    (and within them only the slices) its taps touch."""
    import dask.array as da

    from chunkernels import _graph

    out_shape = tuple(len(t) for t in taps)
    dtype = np.dtype(x.dtype if dtype is None else dtype)
    if chunks is None:
        chunks = default_chunks(taps, x.chunks)
    chunks = da.core.normalize_chunks(chunks, out_shape, dtype=dtype)
    name = "zoom-" + _graph.tokenize(x, taps, weights, cval, dtype, chunks, strict)
    bounds = [np.concatenate([[0], np.cumsum(c)]).astype(np.int64) for c in chunks]
    reads = [[_axis_reads(t[lo:hi], x.chunks[a]) for lo, hi in zip(b[:-1], b[1:])]
             for a, (t, b) in enumerate(zip(taps, bounds))]
    tasks = _graph.Tasks()
    tasks.read(x)  # referenced, never inlined: several output blocks read one input block
    for index in np.ndindex(*(len(c) for c in chunks)):
        per_axis = [reads[a][i] for a, i in enumerate(index)]
        segments = tuple(segs for segs, _ in per_axis)
        params = {"taps": tuple(local for _, local in per_axis),
                  "weights": tuple(w[b[i]:b[i + 1]] for w, b, i in zip(weights, bounds, index)),
                  "cval": cval, "dtype": dtype}
        refs = [tasks.ref((x.name, *(segments[a][i][0] for a, i in enumerate(ix))))
                for ix in np.ndindex(*(len(s) for s in segments))]
        tasks.add((name, *index), _block_task, strict, _BlockPlan(segments, params), *refs)
    return tasks.array(name, chunks, dtype, _graph.meta(x, dtype))


def _validate(ndim, *, taps, weights, cval=0.0, dtype=None, chunks=None):
    taps = tuple(np.asarray(t) for t in taps)
    weights = tuple(np.asarray(w, dtype=np.float64) for w in weights)
    if len(taps) != ndim or len(weights) != ndim:
        raise ValueError(f"zoom: taps and weights need one table per axis of the region "
                         f"(ndim={ndim}); got {len(taps)} and {len(weights)}")
    for axis, (t, w) in enumerate(zip(taps, weights)):
        if t.ndim != 2 or t.shape != w.shape or t.shape[1] != taps[0].shape[1]:
            raise ValueError(f"zoom: axis {axis}: taps {t.shape} and weights {w.shape} must be "
                             f"(n_out, order + 1) tables with the same order on every axis")
        if t.dtype.kind not in "iu":
            raise TypeError(f"zoom: axis {axis}: taps must be integers; got {t.dtype}")
    if taps and not 1 <= taps[0].shape[1] <= 6:
        raise ValueError(f"zoom: {taps[0].shape[1]} taps per axis; spline orders 0..5 take 1..6")
    return {"taps": taps, "weights": weights, "cval": cval,
            "dtype": None if dtype is None else np.dtype(dtype), "chunks": chunks}


def _result_dtype(x_dtype, *, dtype=None, **_):
    return np.dtype(x_dtype if dtype is None else dtype)


def _result_shape(shape, *, taps, **_):
    """The output region: one output per row of each axis' tap table."""
    return tuple(len(t) for t in taps)


def _supports(region, *, taps, weights, cval=0.0, dtype=None, chunks=None):
    out = np.dtype(region.dtype if dtype is None else dtype)
    if out.name not in _GPU_DTYPES:
        return False, f"output dtype {out.name} has no GPU path (it takes {', '.join(_GPU_DTYPES)})"
    if isinstance(cval, complex):
        return False, "a complex cval needs complex arithmetic, which the GPU path lacks"
    for axis, t in enumerate(taps):
        if t.size and int(t.max()) >= region.shape[axis]:
            return False, f"axis {axis}: a tap reads position {int(t.max())} of {region.shape[axis]}"
    return True, ""


def _cases(rng):
    """Random regions and tables for ``chunkernels check``: zooms of every order and mode."""
    for dtype, order, mode in (("float32", 3, "mirror"), ("float64", 1, "constant"),
                               ("float64", 5, "grid-wrap"), ("int16", 0, "nearest"),
                               ("uint8", 1, "reflect"), ("float32", 2, "grid-constant")):
        shape = (9, 14, 5)
        region = rng.random(shape).astype(dtype) if dtype.startswith("float") else \
            rng.integers(0, 100, size=shape).astype(dtype)
        taps, weights = zoom_tables(shape, (13, 7, 5), order=order, mode=mode,
                                    grid_mode=mode.startswith("grid"))
        yield region, (), {"taps": taps, "weights": weights, "cval": 0.5, "dtype": dtype}


_GPU_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
               "int64", "uint64", "bool")

SPEC = KernelSpec(
    name="zoom",
    summary="one output block of a separable spline resampling (zoom, resize) from per-axis "
            "tap/weight tables; reference scipy.ndimage.zoom",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="zoom.cu",
    entries=(
        "zoom<float, float, float, int, 3, 3, false>",
        "zoom<float, float, float, int, 3, 1, false>",
        "zoom<double, double, double, long long, 2, 5, true>",
        "zoom<unsigned char, unsigned char, double, int, 2, 0, false>",
        "zoom<short, short, double, int, 4, 1, true>",
        "zoom<double, float, double, int, 1, 2, false>",
        "zoom<float, bool, double, int, 3, 3, true>",
        "zoom_pass<float, float, int, 3, 2, 3, false>",
        "zoom_pass<float, float, int, 3, 0, 3, true>",
        "zoom_pass<float, float, long long, 2, 1, 2, true>",
        "zoom_pass<float, float, int, 4, 0, 5, false>",
    ),
    dtypes=_GPU_DTYPES,
    ndim=(1, MAX_NDIM),
    validate=_validate,
    result_dtype=_result_dtype,
    result_shape=_result_shape,
    supports=_supports,
    cases=_cases,
    dask_graph=dask_graph,
    rtol=1e-5,
)
