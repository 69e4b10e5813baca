"""label's single-block GPU path: the union-find forest of a block on the device
(``kernels_cuda/label.cu``, sections 1 to 5), its scans, its labels, and a block's summary (its
faces and per-line label counts, which the merges read), on the device or from SciPy's labels.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda, layout
from chunkernels.kernels.label._reference import (
    GPU_DTYPES,
    MAX_NDIM,
    OUTPUT_DTYPES,
    check_bit_depth,
    default_dtype,
    holds,
    scipy_input,
)

_TILE = 32             # LABEL_TILE_X and LABEL_TILE_Y in label.cu
_BLOCK = (32, 8)       # threads: LABEL_TILE_X x LABEL_BLOCK_Y
_THREADS = 256
_MAX_GRID = 65535
_MAX_FLAT_BLOCKS = 1 << 20
_PLANE_BITS = 40       # the backward half of a 3**4 element; bit 40 is its centre
_CROSS_MASK = (1 << 36) - 1  # LABEL_CROSS_MASK in label.cu: the offsets into other planes


# -- GPU path ---------------------------------------------------------------------------------


def structure_mask(structure: np.ndarray, shape) -> int:
    """The kernels' 40-bit mask of ``structure``'s backward offsets, seen in 4-D.

    Offsets along axes of length 1 reach no neighbour and are dropped, so the kernels skip
    them (a 3-D element on a single plane costs no cross-plane unions). Worked out once per
    structure and pattern of length-1 axes: every chunk of a Dask array asks.
    """
    structure = np.asarray(structure, dtype=bool)
    return _mask(structure.tobytes(), structure.ndim, tuple(n == 1 for n in shape))


@functools.lru_cache(maxsize=256)
def _mask(bits: bytes, ndim: int, single: tuple[bool, ...]) -> int:
    s4 = np.zeros((3,) * MAX_NDIM, dtype=bool)
    s4[(1,) * (MAX_NDIM - ndim)] = np.frombuffer(bits, dtype=bool).reshape((3,) * ndim)
    for axis, one in enumerate((True,) * (MAX_NDIM - ndim) + single):
        if one:
            s4[(slice(None),) * axis + ([0, 2],)] = False
    flat = s4.ravel()
    return sum(1 << k for k in range(_PLANE_BITS) if flat[k])


def _frame(a):
    """``a``'s shape and element strides seen in 4-D (leading axes of length 1 added)."""
    lead = MAX_NDIM - a.ndim
    return (1,) * lead + tuple(a.shape), (0,) * lead + layout.element_strides(a)


def _tile_grid(shape4):
    n0, n1, n2, n3 = shape4
    return (-(-n3 // _TILE), min(_MAX_GRID, -(-n2 // _TILE)), min(_MAX_GRID, n0 * n1))


def _flat_grid(n):
    return (min(_MAX_FLAT_BLOCKS, -(-n // _THREADS)),)


class _Scan:
    """An inclusive scan of a flat device array, done in place by ``label_scan`` and
    ``label_scan_offsets`` (section 3 of label.cu) and finished where it is read: the sum up to
    element ``i`` is ``values[i] + offsets[i // seg]``. Two launches and no host work, where
    ``cupy.cumsum`` costs several times the host time.

    ``first``, a kernel taking ``(*before, values, totals, n, seg)``, replaces ``label_scan`` for
    the first pass when it makes the values on the way (``label_flatten``, the root flags).
    """

    __slots__ = ("values", "offsets", "seg")

    def __init__(self, values, first=None, before=()):
        cp = cuda.cupy()
        plan = _scan_plan(values.device.id, values.size, values.dtype)
        self.values = values
        self.offsets = cp.empty(plan.segments + 1, dtype=values.dtype)
        self.seg = plan.seg
        totals = cp.empty(plan.segments, dtype=values.dtype)
        (first or plan.scan)(plan.grid, (_SCAN_THREADS,), (*before, values, totals, *plan.sizes))
        plan.offsets(*plan.offsets_launch, (totals, self.offsets, plan.count))

    @property
    def args(self) -> tuple:
        """The kernels' three arguments for the scan: local sums, offsets, segment length."""
        return self.values, self.offsets, self.seg

    @property
    def total(self):
        """The sum of all elements, a 0-d device array."""
        return self.offsets[-1]


_SCAN_THREADS = 256    # LABEL_SCAN_THREADS in label.cu
_SCAN_TILE = 1024      # LABEL_SCAN_TILE: a segment is a whole number of them
_SCAN_SEGMENTS = 4096  # thread blocks of label_scan at most
#: Elements a segment gets at least (up to the cap on segments). Measured on an H100 for 16
#: chunks of 2048x2048: 1024 segments of 4096 pixels flatten and scan 9% faster than 4096 of
#: 1024, whose extra blocks and longer offset scan cost more than they spread.
_SCAN_PER_SEGMENT = 4096


class _ScanPlan:
    """The launches of a :class:`_Scan` of ``n`` elements of ``dtype`` on one device: segments
    of ``seg`` elements (a power of two, and whole tiles of ``_SCAN_TILE``), one thread block
    each."""

    __slots__ = ("segments", "seg", "grid", "sizes", "count", "scan", "offsets", "offsets_launch")

    def __init__(self, n, dtype):
        segments = max(1, min(_SCAN_SEGMENTS, -(-n // _SCAN_PER_SEGMENT)))
        seg = 1 << (max(1, -(-n // (segments * _SCAN_TILE))) * _SCAN_TILE - 1).bit_length()
        self.segments = max(1, -(-n // seg))
        self.seg = np.int64(seg)
        self.grid = (self.segments,)
        self.sizes = (np.int64(n), self.seg)
        self.count = np.int32(self.segments)
        ctype = cuda.cuda_type(dtype)
        self.scan = cuda.function("label", f"label_scan<{ctype}>")
        self.offsets = cuda.function("label", f"label_scan_offsets<{ctype}>")
        self.offsets_launch = ((1,), (1024,))


@functools.lru_cache(maxsize=1024)
def _scan_plan(device: int, n: int, dtype) -> _ScanPlan:
    with cuda.cupy().cuda.Device(device):
        return _ScanPlan(n, dtype)


class _ForestPlan:
    """What :class:`_Forest` launches for one block layout (device, shape, strides, dtype,
    structure, index width), or for a batch of ``batch`` blocks of that layout, worked out once:
    the compiled kernels, their grids and their scalar arguments. Dask's blocks mostly share a
    few layouts, so a block costs its allocations and its launches."""

    __slots__ = ("index", "ctype", "dims", "grid", "tiles", "tiles_args", "merge", "merge_block",
                 "merge_args", "flatten", "shape", "size", "batch", "first_axis", "summary_size",
                 "_writes", "_write_summary", "_summary")

    def __init__(self, x, structure, index64, batch=0):
        self.index = np.int64 if index64 else np.int32
        self.ctype = "long long" if index64 else "int"
        shape4, strides4 = _frame(x)
        if batch:  # the blocks are the planes along axis 0 (see label_tiles in label.cu)
            assert x.ndim < MAX_NDIM and batch <= _BATCH
            shape4 = (batch, *shape4[1:])
        self.batch = np.int32(batch)
        self.dims = tuple(self.index(n) for n in shape4)
        self.grid = _tile_grid(shape4)
        mask = np.uint64(structure_mask(structure, x.shape))
        self.tiles = cuda.function("label", f"label_tiles<{cuda.cuda_type(x.dtype)}, {self.ctype}>")
        self.tiles_args = (*self.dims, *(self.index(s) for s in strides4), mask)
        if int(mask) & _CROSS_MASK:  # joins across planes: every pixel looks
            self.merge = cuda.function("label", f"label_merge<{self.ctype}>")
            self.merge_block = _BLOCK
        else:  # within planes: only the tiles' borders
            self.merge = cuda.function("label", f"label_merge_borders<{self.ctype}>")
            self.merge_block = (_TILE, 2)
        self.merge_args = (*self.dims, mask)
        self.flatten = cuda.function("label", f"label_flatten<{self.ctype}>")
        self.shape = x.shape
        self.size = x.size
        faces, lines = summary_layout(x.shape)
        self.first_axis = np.int32(MAX_NDIM - x.ndim)
        self.summary_size = sum(faces) + lines
        self._writes = {}
        self._write_summary = None
        self._summary = None

    def write(self, out) -> tuple:
        """``label_write`` into ``out``'s dtype and strides, and those strides as arguments."""
        key = (out.dtype, out.strides)
        launch = self._writes.get(key)
        if launch is None:
            _, strides4 = _frame(out)
            launch = self._writes[key] = (
                cuda.function("label", f"label_write<{self.ctype}, {cuda.cuda_type(out.dtype)}>"),
                tuple(self.index(s) for s in strides4))
        return launch

    def write_summary(self):
        """``label_write_summary`` (compiled on first use: a whole-array label needs none)."""
        if self._write_summary is None:
            self._write_summary = cuda.function("label", f"label_write_summary<{self.ctype}>")
        return self._write_summary

    def summary(self):
        """``label_summary`` (compiled on first use)."""
        if self._summary is None:
            self._summary = cuda.function("label", f"label_summary<{self.ctype}>")
        return self._summary


_FOREST_PLANS: dict[tuple, _ForestPlan] = {}
_MAX_FOREST_PLANS = 1024
#: Blocks labelled by one launch of each kernel at most (LABEL_BATCH in label.cu: the sources
#: travel by value, one pointer each).
_BATCH = 64
#: label_tiles' sources (label_sources in label.cu): a struct of _BATCH pointers, by value.
_SOURCES = np.dtype((np.void, 8 * _BATCH))


def _forest_plan(x, structure, index64, batch=0) -> _ForestPlan:
    key = (x.device.id, x.shape, x.strides, x.dtype, structure.tobytes(), structure.shape, index64,
           batch)
    plan = _FOREST_PLANS.get(key)
    if plan is None:
        if len(_FOREST_PLANS) >= _MAX_FOREST_PLANS:
            _FOREST_PLANS.clear()
        plan = _FOREST_PLANS[key] = _ForestPlan(x, structure, index64, batch)
    return plan


def _sources(arrays) -> np.ndarray:
    """label_tiles' ``xs``: the arrays' device pointers, as one struct passed by value."""
    pointers = np.zeros(_BATCH, dtype=np.uint64)
    pointers[:len(arrays)] = [a.data.ptr for a in arrays]
    return pointers.view(_SOURCES)


class _Forest:
    """The union-find of one non-empty block on the device, or of a batch of blocks of one layout
    (:meth:`batch`): ``parent`` (every foreground pixel's root, the component's first pixel; -1
    for background), C-ordered and flat (a batch's blocks one after another), and ``rank``, a
    :class:`_Scan` of the root flags: a root's label is the number of roots up to it."""

    __slots__ = ("plan", "index", "parent", "rank")

    def __init__(self, x, structure, index64, _blocks=None):
        cp = cuda.cupy()
        if _blocks is None and x.dtype.name not in _NATIVE:
            x = x != 0
        blocks = [x] if _blocks is None else _blocks
        self.plan = plan = _forest_plan(x, structure, index64, 0 if _blocks is None else len(blocks))
        self.index = plan.index
        self.parent = cp.empty(plan.size * len(blocks), dtype=plan.index)
        plan.tiles(plan.grid, _BLOCK, (_sources(blocks), plan.batch, self.parent, *plan.tiles_args))
        plan.merge(plan.grid, plan.merge_block, (self.parent, *plan.merge_args))
        self.rank = _Scan(cp.empty(self.parent.size, dtype=plan.index), plan.flatten,
                          (self.parent,))

    @classmethod
    def batch(cls, blocks, structure, index64):
        """The forest of ``blocks`` (non-empty CuPy arrays of one layout and dtype, at most 3-D
        and :data:`_BATCH` of them), labelled by one launch of each kernel."""
        return cls(blocks[0], structure, index64, _blocks=blocks)

    def write(self, out):
        """Every pixel's label into ``out`` (any dtype of OUTPUT_DTYPES, any strides)."""
        kernel, strides = self.plan.write(out)
        kernel(self.plan.grid, _BLOCK, (self.parent, *self.rank.args, out, *self.plan.dims,
                                        *strides))
        return out

    def write_summary(self) -> list[tuple]:
        """Every pixel's label into the parent array itself, numbered from 1 in each block, and
        each block's summary (see :func:`summary_layout`); per block ``(labels in its shape,
        summary)``."""
        plan = self.plan
        count = max(1, int(plan.batch))
        summaries = cuda.cupy().empty(plan.summary_size * count, dtype=plan.index)
        plan.write_summary()(plan.grid, _BLOCK, (self.parent, *self.rank.args, summaries,
                                                 *plan.dims, plan.first_axis, plan.batch))
        if count == 1:
            return [(self.parent.reshape(plan.shape), summaries)]
        size, summary_size = plan.size, plan.summary_size
        return [(self.parent[b * size:(b + 1) * size].reshape(plan.shape),
                 summaries[b * summary_size:(b + 1) * summary_size]) for b in range(count)]

    def summaries(self) -> list:
        """Each block's summary, as :meth:`write_summary` writes it, but without writing the
        labels: the parent array stays a forest, for :meth:`_DeviceNumbering.relabel_batch` to
        write every pixel's global label in one pass."""
        plan = self.plan
        count = max(1, int(plan.batch))
        n = plan.summary_size * count
        summaries = cuda.cupy().empty(n, dtype=plan.index)
        if n:
            plan.summary()(_flat_grid(n), (_THREADS,), (self.parent, *self.rank.args, summaries,
                                                        *plan.dims, plan.first_axis, plan.batch,
                                                        np.int64(plan.summary_size)))
        return _pieces(summaries, (plan.summary_size,), count)


_NATIVE = frozenset(d for d in GPU_DTYPES if d != "float16")


def _pieces(flat, shape, count) -> list:
    """``count`` C-ordered views of ``shape``, one after another in the flat device array
    ``flat`` (made directly on its memory: slicing and reshaping cost the host more)."""
    cp = cuda.cupy()
    nbytes = math.prod(shape) * flat.itemsize
    return [cp.ndarray(shape, dtype=flat.dtype, memptr=flat.data + b * nbytes)
            for b in range(count)]


def label_device(x, structure, dtype=None, out=None):
    """Label CuPy array ``x`` on its device: ``(labels, count)`` with ``count`` a 0-d device
    array, so nothing waits for the device.

    ``out`` (a CuPy array of ``x``'s shape, any strides) receives the labels; else a C-ordered
    array of ``dtype`` (default :func:`default_dtype`) is made. Only when ``dtype`` cannot hold
    as many labels as ``x`` has pixels is the count read back, to raise :class:`LabelError` if
    it does not fit.
    """
    cp = cuda.cupy()
    if out is not None:
        dtype = out.dtype
    dtype = default_dtype(x.size) if dtype is None else np.dtype(dtype)
    if out is None:
        out = cp.empty(x.shape, dtype=dtype)
    if x.size == 0:
        return out, cp.zeros((), dtype=np.intp)
    if x.ndim == 0:
        out[...] = x != 0
        return out, (x != 0).astype(np.intp)
    index64 = x.size >= layout.INT32_MAX or layout.needs_index64(x, out)
    forest = _Forest(x, structure, index64)
    forest.write(out)
    count = forest.rank.total
    if not holds(dtype, x.size):
        check_bit_depth(int(count), dtype)
    return out, count



def dispatch(x, *, structure, dtype=None):
    """GPU path: the labels of CuPy block ``x`` (:func:`label_device`)."""
    return label_device(x, structure, dtype)[0]


def _supports(x, *, structure, dtype=None):
    if dtype is not None and np.dtype(dtype) not in OUTPUT_DTYPES:
        return False, f"output dtype {np.dtype(dtype)} is not one labels are written in"
    return True, ""


# -- a block's summary (step 1 of a chunked label) -------------------------------------------


def summary_layout(shape) -> tuple[list[int], int]:
    """Sizes in a block's summary: one per face (axis 0 first, its index-0 face then its last),
    and the number of lines along the last axis, whose label counts follow the faces."""
    faces = []
    for axis in range(len(shape)):
        size = math.prod(shape[:axis] + shape[axis + 1:])
        faces += [size, size]
    return faces, math.prod(shape[:-1])


def _summary_host(labels) -> np.ndarray:
    """A NumPy block's summary: its faces, then the labels numbered up to each line's end (the
    running maximum of the lines' maxima, as labels grow in raster order)."""
    faces, lines = summary_layout(labels.shape)
    if labels.size == 0:
        return np.zeros(sum(faces) + lines, dtype=np.int64)
    parts = []
    for axis in range(labels.ndim):
        parts += [np.take(labels, 0, axis=axis).ravel(), np.take(labels, -1, axis=axis).ravel()]
    parts.append(np.maximum.accumulate(labels.reshape(lines, -1).max(axis=1)))
    return np.concatenate(parts).astype(np.int64, copy=False)


def _local_host(block, structure):
    labels = ndi.label(scipy_input(block), structure)[0]
    return labels, _summary_host(labels)


def _index64(block) -> bool:
    """Whether the kernels index ``block`` with 64-bit integers."""
    return block.size >= layout.INT32_MAX or layout.needs_index64(block)


def _local_device(block, structure):
    """A CuPy block's local labels (in its parent array) and summary, launched, not waited on."""
    if block.size == 0:
        cp = cuda.cupy()
        faces, lines = summary_layout(block.shape)
        return cp.zeros(block.shape, dtype=np.int32), cp.zeros(sum(faces) + lines, np.int32)
    return _Forest(block, structure, _index64(block)).write_summary()[0]

