"""label: connected components of the nonzero pixels, numbered exactly as scipy.ndimage.label.

The kernel behind :func:`chunkernels.ndimage.label`. Components are sets of nonzero pixels
joined under a symmetric ``3**ndim`` structuring element; they are numbered 1..N in raster (C)
order of each component's first pixel, as SciPy numbers them. CUDA source:
``kernels_cuda/label.cu`` (union-find whose roots are first pixels, see its header).

A label is not blockwise, so a Dask array gets its own graph (:func:`plan`), of
``2 * chunks + 2`` tasks whatever the number of labels (``3 * chunks + 2`` where it runs on a
distributed cluster, so that only the summaries travel to the merge's worker; for CuPy chunks
under a local scheduler, one task does all three steps below and each chunk's task picks its
labels, ``chunks + 2``; see :func:`_tasks` and :func:`local_shape`):

1. per chunk, a local labelling (SciPy on NumPy chunks, the CUDA kernels on CuPy chunks) and a
   small summary: the chunk's faces (first and last slice along every axis) and, for every line
   along the last axis, how many local labels start on it (:func:`summary_layout`);
2. one merge over all summaries: on their device when they all are on one
   (:func:`merge_device`), else on the host (:func:`merge`). The faces of neighbouring chunks
   give the pairs of local labels the structure connects; joined, with the per-line counts
   they give every local label its global one;
3. per chunk, from the merge, a lookup table from local to global labels, built and applied on
   the chunk's device (``label_renumber`` and ``label_lookup``, or ``label_table`` and a
   ``take`` after a host merge).
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda, layout
from chunkernels._errors import CPUFallbackWarning, UnsupportedBlockError
from chunkernels._registry import KernelSpec

#: Dims the CUDA kernels take (blocks are seen as 4-D); more dims use the CPU reference.
MAX_NDIM = 4
#: Dtypes scipy.ndimage.label reads as they are; others (float16, longdouble) are read as
#: ``x != 0``, which labels the same.
SCIPY_INPUT_DTYPES = frozenset(np.dtype(d) for d in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64"))
#: Dtypes labels can be written in: SciPy's choice (its fused output types, and bool).
OUTPUT_DTYPES = SCIPY_INPUT_DTYPES
#: Input dtypes of the GPU path; float16 is read as ``x != 0`` first (CUDA has no C++ name
#: for it here).
GPU_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64")

_TILE = 32             # LABEL_TILE_X and LABEL_TILE_Y in label.cu
_BLOCK = (32, 8)       # threads: LABEL_TILE_X x LABEL_BLOCK_Y
_THREADS = 256
_MAX_GRID = 65535
_MAX_FLAT_BLOCKS = 1 << 20
_PLANE_BITS = 40       # the backward half of a 3**4 element; bit 40 is its centre
_CROSS_MASK = (1 << 36) - 1  # LABEL_CROSS_MASK in label.cu: the offsets into other planes


class LabelError(ValueError, RuntimeError):
    """A ``label`` argument or result SciPy refuses: a structure of the wrong rank, size or
    symmetry, an output of the wrong shape, or an output dtype too small for the labels.

    A ``ValueError`` by chunkernels' rules and a ``RuntimeError`` as SciPy raises several of
    these (``AssertionError`` too, for an asymmetric structure), so code written against SciPy
    catches it unchanged.
    """


class AsymmetricStructureError(LabelError, AssertionError):
    """A structuring element that is not centrosymmetric (SciPy raises ``AssertionError``)."""


# -- arguments --------------------------------------------------------------------------------


def default_dtype(size: int) -> np.dtype:
    """SciPy's label dtype: int32, or intp from ``2**31 - 2`` elements on."""
    return np.dtype(np.intp if size >= 2**31 - 2 else np.int32)


def check_structure(structure, ndim: int) -> np.ndarray:
    """``structure`` as a read-only boolean array, checked as SciPy checks it.

    ``None`` gives ``generate_binary_structure(ndim, 1)`` (faces only).

    Raises
    ------
    LabelError
        A structure whose rank is not the input's, or whose sides are not 3.
    AsymmetricStructureError
        A structure that is not centrosymmetric.
    """
    if structure is None:
        s = ndi.generate_binary_structure(ndim, 1)
    else:
        if cuda.is_cupy_array(structure):
            structure = structure.get()
        s = np.asarray(structure, dtype=bool)
    if s.ndim != ndim:
        raise LabelError(
            f"structure and input must have equal rank: the structure has {s.ndim} dim(s) "
            f"(shape {s.shape}), the input {ndim}; pass a structure of shape {(3,) * ndim}, "
            f"e.g. scipy.ndimage.generate_binary_structure({ndim}, connectivity)")
    if any(n != 3 for n in s.shape):
        raise LabelError(f"structure dimensions must be equal to 3: got shape {s.shape}; "
                         f"pass a structure of shape {(3,) * ndim}")
    if not np.array_equal(s, s[(slice(None, None, -1),) * ndim]):
        raise AsymmetricStructureError(
            f"Structuring element is not symmetric: structure == structure[::-1, ...] fails "
            f"for {s.astype(np.uint8).tolist()}; connections must go both ways (see "
            f"scipy.ndimage.label's notes), e.g. structure | structure[::-1, ...]")
    s = np.array(s, order="C")  # a copy the caller cannot change (ascontiguousarray makes 0-d 1-d)
    s.setflags(write=False)
    return s


def check_output_dtype(dtype) -> np.dtype:
    """``dtype`` if labels can be written in it, else a ``TypeError`` naming those that can."""
    dtype = np.dtype(dtype)
    if dtype not in OUTPUT_DTYPES:
        accepted = ", ".join(sorted(d.name for d in OUTPUT_DTYPES))
        raise TypeError(f"label cannot write labels as {dtype}: the output dtype must be one "
                        f"of {accepted} (scipy.ndimage.label's output types)")
    return dtype


def holds(dtype, count: int) -> bool:
    """Whether every label up to ``count`` is exact in ``dtype`` (bool: labels become True)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return True
    if dtype.kind == "f":
        return count <= 2 ** (np.finfo(dtype).nmant + 1)
    return count <= np.iinfo(dtype).max


def check_bit_depth(count: int, dtype) -> None:
    """Raise SciPy's error when ``count`` labels do not fit in ``dtype``."""
    if not holds(dtype, count):
        raise LabelError(f"insufficient bit-depth in requested output type: {count} labels do "
                         f"not fit in {np.dtype(dtype)}; pass a wider output dtype (int32, "
                         f"int64)")


def _validate(ndim, *, structure=None, dtype=None):
    return {"structure": check_structure(structure, ndim),
            "dtype": None if dtype is None else check_output_dtype(dtype)}


def _result_dtype(x_dtype, *operand_dtypes, structure=None, dtype=None):
    return np.dtype(np.int32 if dtype is None else dtype)


# -- CPU reference ----------------------------------------------------------------------------


def scipy_input(x):
    """``x`` in a dtype scipy.ndimage.label reads (others as ``x != 0``)."""
    return x if x.dtype in SCIPY_INPUT_DTYPES else x != 0


def reference(x, *, structure, dtype=None):
    """CPU reference: ``scipy.ndimage.label(x, structure, output=dtype)[0]``."""
    x = np.asarray(x)
    return ndi.label(scipy_input(x), structure, default_dtype(x.size) if dtype is None else dtype)[0]


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
#: travel by value, one pointer each), and their pixels at most: a batch's scan of root flags
#: is as large as its blocks, so the batch stays within what one block's would be under 2**26.
_BATCH = 64
_BATCH_PIXELS = 1 << 26
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


def gpu_takes(x, structure, dtype=None, *, strict=False) -> bool:
    """Whether the CUDA kernels label CuPy array ``x``; if not, raise under ``strict``, else warn
    that SciPy labels it (a host round trip)."""
    ok, reason = SPEC.check_block(x, structure=structure, dtype=dtype)
    if ok:
        return True
    if strict:
        raise UnsupportedBlockError(
            f"label: the GPU path refuses this array of shape {x.shape}: {reason}. Pass "
            f"strict=False to label it with SciPy (a host round trip)")
    warnings.warn(f"label: {reason}; labelling this array of shape {x.shape} with SciPy (copies "
                  f"it to the host and back)", CPUFallbackWarning, stacklevel=3)
    return False


def dispatch(x, *, structure, dtype=None):
    """GPU path: the labels of CuPy block ``x`` (:func:`label_device`)."""
    return label_device(x, structure, dtype)[0]


def _supports(x, *, structure, dtype=None):
    if dtype is not None and np.dtype(dtype) not in OUTPUT_DTYPES:
        return False, f"output dtype {np.dtype(dtype)} is not one labels are written in"
    return True, ""


# -- chunked: summaries, merge, relabel -------------------------------------------------------


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


class _LocalLabels:
    """Task body of step 1: ``block -> (local labels, summary)``; NumPy blocks use SciPy, CuPy
    blocks the CUDA kernels (or, for blocks they refuse, SciPy with a warning)."""

    def __init__(self, structure, strict):
        self.structure = structure
        self.strict = strict

    def __call__(self, block):
        if not cuda.is_cupy_array(block):
            return _local_host(np.asarray(block), self.structure)
        with block.device:
            if gpu_takes(block, self.structure, strict=self.strict):
                return _local_device(block, self.structure)
            labels, summary = _local_host(block.get(), self.structure)
            return cuda.cupy().asarray(labels), cuda.cupy().asarray(summary)

    def many(self, blocks) -> tuple[list[tuple], list[tuple]]:
        """``[self(block) for block in blocks]``, CuPy blocks of one layout (device, shape,
        strides, dtype; at most 3-D) labelled together, a batch (:meth:`_Forest.batch`) taking
        one launch of each kernel where a block alone would take as many: what a task that
        labels many blocks costs the host grows with their layouts, not their number.

        Returns ``(results, batches)``. A batch's blocks are left as a forest: their results are
        ``(None, summary)``, and ``batches`` holds ``(forest, the blocks' indices)`` for
        :meth:`_DeviceNumbering.relabel_batch`, or :meth:`_Forest.write_summary` for their local
        labels."""
        results = [None] * len(blocks)
        by_layout, takes = {}, {}
        for i, block in enumerate(blocks):
            if cuda.is_cupy_array(block) and block.size:
                key = (block.device.id, block.shape, block.strides, block.dtype)
                ok = takes.get(key)
                if ok is None:  # asked once per layout
                    ok = takes[key] = (block.ndim < MAX_NDIM and block.dtype.name in _NATIVE
                                       and not _index64(block)
                                       and SPEC.check_block(block, structure=self.structure)[0])
                if ok:
                    by_layout.setdefault(key, []).append(i)
                    continue
            results[i] = self(block)  # alone, or on the host (with a warning, or refused)
        batches = []
        for key, members in by_layout.items():
            per_batch = max(1, min(_BATCH, _BATCH_PIXELS // blocks[members[0]].size))
            for start in range(0, len(members), per_batch):
                chunk = members[start:start + per_batch]
                with blocks[chunk[0]].device:
                    forest = _Forest.batch([blocks[i] for i in chunk], self.structure, False)
                    for i, summary in zip(chunk, forest.summaries()):
                        results[i] = (None, summary)
                batches.append((forest, chunk))
        return results, batches

    def __dask_tokenize__(self):
        return ("chunkernels-label-local", self.structure.tobytes(), self.strict)


class _MergePlan:
    """What the merge task knows besides the summaries: the array's shape and chunks, the
    structure and the output dtype."""

    __slots__ = ("shape", "chunks", "structure", "dtype")

    def __init__(self, shape, chunks, structure, dtype):
        self.shape = tuple(shape)
        self.chunks = tuple(tuple(c) for c in chunks)
        self.structure = structure
        self.dtype = np.dtype(dtype)


def _host_summaries(summaries) -> np.ndarray:
    """The blocks' summaries one after the other, as one int64 NumPy array.

    Summaries on a device are joined there and come back in one copy per device: a copy per
    block would cost a device synchronisation and a transfer's fixed cost each.
    """
    parts = list(summaries)
    on_device: dict[int, list[int]] = {}
    for i, s in enumerate(parts):
        if cuda.is_cupy_array(s):
            on_device.setdefault(s.device.id, []).append(i)
    for members in on_device.values():
        with parts[members[0]].device:
            joined = cuda.cupy().concatenate([parts[i] for i in members]).get()
        if len(members) == len(parts):
            return joined.astype(np.int64, copy=False)
        cuts = np.cumsum([parts[i].size for i in members[:-1]])
        for i, piece in zip(members, np.split(joined, cuts)):
            parts[i] = piece
    return np.concatenate(parts).astype(np.int64, copy=False)


class _Block:
    """One block of the chunk grid: for each axis, the block's extent along the other axes and
    where its two faces lie in the joined summaries."""

    __slots__ = ("faces", "regions")

    def __init__(self, shape, start, at):
        ndim = len(shape)
        self.regions = [tuple(slice(start[a], start[a] + shape[a]) for a in range(ndim) if a != axis)
                        for axis in range(ndim)]
        sizes, _ = summary_layout(shape)
        cuts = list(itertools.accumulate(sizes, initial=at))
        self.faces = [[(cuts[2 * axis + side], cuts[2 * axis + side + 1], _drop(shape, axis))
                       for side in (0, 1)] for axis in range(ndim)]

    def face(self, values, axis, side):
        """Face ``side`` (0 first, 1 last) along ``axis``, as an array over the other axes."""
        lo, hi, shape = self.faces[axis][side]
        return values[lo:hi].reshape(shape)


class _Layout:
    """Where everything of a chunk grid is, in the joined summaries and in raster order: the
    blocks (C order over the grid); the *slots* (a block's lines along the last axis, block
    after block), the first slot of every block and where each slot's label count lies in the
    joined summaries; and each slot's place in the table of (line of the array, chunk along the
    last axis) whose C order is raster order."""

    def __init__(self, shape, chunks):
        self.grid = tuple(len(c) for c in chunks)
        self.strides = [math.prod(self.grid[a + 1:]) for a in range(len(shape))]
        starts = [tuple(itertools.accumulate(c, initial=0)) for c in chunks]
        table = np.arange(math.prod(shape[:-1]) * self.grid[-1]).reshape(
            shape[:-1] + self.grid[-1:])
        self.blocks, first, ends_at, segment = [], [0], [], []
        at = 0
        for index in itertools.product(*(range(g) for g in self.grid)):
            bshape = tuple(c[i] for c, i in zip(chunks, index))
            block = _Block(bshape, tuple(s[i] for s, i in zip(starts, index)), at)
            lines = summary_layout(bshape)[1]
            at = block.faces[-1][1][1]  # the end of the last face: the line counts follow
            ends_at.append(np.arange(at, at + lines))
            segment.append(table[block.regions[-1] + (index[-1],)].reshape(-1))
            at += lines
            first.append(first[-1] + lines)
            self.blocks.append(block)
        self.first = np.array(first)
        self.heads = self.first[:-1][self.first[:-1] < self.first[1:]]  # blocks' first slots
        self.ends_at = np.concatenate(ends_at)
        self.segment = np.concatenate(segment)
        self.segments = table.size
        self.shape = tuple(shape)
        self.chunks = tuple(tuple(c) for c in chunks)
        self._planes = None
        self._device = {}
        self._most = {}
        self.launches = {}  # merge_device's, per device, structure and dtypes

    @property
    def faces(self):
        """Every face pixel of every block (blocks in C order, faces in summary order), as
        ``(where it lies in the joined summaries, its block)``; and, per axis, its boundaries'
        faces as two stacks of planes of face pixel indices (:func:`_face_planes`), ``None``
        along an axis with fewer than two non-empty slabs. Worked out on first use."""
        if self._planes is None:
            self._planes = _face_planes(self)
        return self._planes

    def most_nodes(self, structure) -> int:
        """The most labels the blocks can have together (:func:`most_labels` of each): a bound
        on the nodes' ranks."""
        key = (structure.tobytes(), structure.shape)
        most = self._most.get(key)
        if most is None:
            most = self._most[key] = sum(
                most_labels(structure, tuple(c[i] for c, i in zip(self.chunks, index)))
                for index in itertools.product(*(range(g) for g in self.grid)))
        return most

    def on_device(self):
        """The arrays :func:`merge_device` reads, on the current device (uploaded once)."""
        cp = cuda.cupy()
        device = cp.cuda.runtime.getDevice()
        arrays = self._device.get(device)
        if arrays is None:
            face_at, face_block, planes = self.faces
            head = np.zeros(len(self.ends_at), dtype=np.uint8)
            head[self.heads] = 1
            arrays = self._device[device] = {
                "ends_at": cp.asarray(self.ends_at, dtype=np.int64),
                "head": cp.asarray(head),
                "segment": cp.asarray(self.segment, dtype=np.int64),
                "first": cp.asarray(self.first, dtype=np.int64),
                "face_at": cp.asarray(face_at, dtype=np.int64),
                "face_block": cp.asarray(face_block, dtype=np.int64),
                "planes": [None if p is None else tuple(cp.asarray(s, dtype=np.int64) for s in p)
                           for p in planes]}
        return arrays


def _face_planes(layout):
    """:attr:`_Layout.faces`: where the face pixels lie, and the planes they tile.

    Along each axis, the last faces of the chunks before each boundary (``low``) and the first
    faces of those after it (``high``) tile planes of the whole array, one per boundary: the
    planes hold the indices of those face pixels, stacked along a first axis. Shifted views of
    the two stacks then pair the pixels the structure joins across every boundary at once,
    corners and edges of chunks included.
    """
    spans = [(lo, hi) for block in layout.blocks for sides in block.faces for lo, hi, _ in sides]
    face_at = np.concatenate([np.arange(lo, hi) for lo, hi in spans] or [np.zeros(0, np.int64)])
    # spans come 2 * ndim per block
    face_block = np.repeat(np.arange(len(spans)) // (2 * len(layout.shape)),
                           [hi - lo for lo, hi in spans])
    index = np.full(int(face_at[-1]) + 1 if len(face_at) else 0, -1, dtype=np.int64)
    index[face_at] = np.arange(len(face_at))
    planes = []
    for axis in range(len(layout.shape)):
        filled = [i for i, n in enumerate(layout.chunks[axis]) if n > 0]
        if len(filled) < 2:
            planes.append(None)
            continue
        stacks = []
        for slabs, side in ((filled[:-1], 1), (filled[1:], 0)):
            stack = np.empty((len(slabs),) + (_drop(layout.shape, axis) or (1,)), dtype=np.int64)
            rests = list(itertools.product(*(range(g) for g in _drop(layout.grid, axis))))
            for t, i in enumerate(slabs):
                for rest in rests:
                    b = sum(n * s for n, s in zip(rest[:axis] + (i,) + rest[axis:],
                                                  layout.strides))
                    block = layout.blocks[b]
                    lo, hi, shape = block.faces[axis][side]
                    stack[(t,) + block.regions[axis]] = index[lo:hi].reshape(shape)
            stacks.append(stack)
        planes.append(tuple(stacks))
    return face_at, face_block, planes


@functools.lru_cache(maxsize=4)
def _layout(shape, chunks) -> _Layout:
    """The layout of a chunk grid, made once per grid: images of a series chunked alike share
    it. (It holds a few integers per line of the array, so only the last few are kept.)"""
    return _Layout(shape, chunks)


def merge(plan: _MergePlan, summaries):
    """Global numbering from the blocks' summaries (in C order over the chunk grid).

    Every local label is a *node*, numbered block after block, label after label. Raster order
    of first pixels is, for labels on different lines, the order of the lines; on one line, the
    order of the chunks along the last axis; within one chunk and line (a *slot*), the order of
    the local labels. So the per-line counts alone give every node its *rank*, its place in
    raster order among all nodes. Neighbouring faces give the edges; in each connected
    component the member of smallest rank is the representative and the others are *merged
    away* into it. A node that is not merged away gets as its global label one plus the number
    of such nodes of smaller rank; a merged-away node its representative's label.

    Nothing here walks the labels one by one: the work grows with the lines and the face
    pixels. What a block needs to number its own labels (:func:`_table`) is, per line, the
    shift from local to global label (for labels with no merged-away label before them on
    their line), and its merged-away local labels with their global labels.

    Returns ``(per block (numbering, merged away, labels), number of labels)``: ``numbering``
    is one int64 array, the shifts of the block's lines, then its merged-away local labels
    (increasing), then their global labels.
    """
    layout = _layout(plan.shape, plan.chunks)
    values = _host_summaries(summaries)
    ends = values[layout.ends_at]  # per slot, the block's labels up to the line's end
    count = ends.copy()
    count[1:] -= ends[:-1]
    count[layout.heads] = ends[layout.heads]
    slot_end = np.cumsum(count)  # nodes up to the slot's end
    offsets = np.concatenate([[0], slot_end])[layout.first]  # first node of each block, then all
    # node n of slot s has rank n + rank0[s] - (first node of s)
    shift = _raster_scan(layout, count) - (slot_end - count)
    merged, value = _merged_away(plan, layout, values, offsets, slot_end, shift)
    total = int(offsets[-1]) - len(merged)
    check_bit_depth(total, plan.dtype)
    away = np.bincount(np.searchsorted(slot_end, merged, side="right"), minlength=len(count))
    # per slot: global = local + base - (the block's merged-away local labels below it)
    base = _raster_scan(layout, count - away) - (ends - count) + np.cumsum(away) - away
    cut = np.searchsorted(merged, offsets)
    out = []
    for b in range(len(layout.blocks)):
        lo, hi = cut[b], cut[b + 1]
        numbering = np.concatenate([base[layout.first[b]:layout.first[b + 1]] - lo,
                                    merged[lo:hi] - (offsets[b] - 1), value[lo:hi]])
        out.append((numbering, int(hi - lo), int(offsets[b + 1] - offsets[b])))
    return out, total


def _raster_scan(layout, count) -> np.ndarray:
    """Per slot, the sum of ``count`` over the slots before it in raster order."""
    table = np.zeros(layout.segments, dtype=np.int64)
    table[layout.segment] = count
    return (np.cumsum(table) - table)[layout.segment]


def _merged_away(plan, layout, values, offsets, slot_end, shift):
    """The nodes merged away (increasing) and their global labels."""
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    u, v = _face_pairs(plan, layout, values, offsets)
    if not len(u):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # the graph on the nodes that touch another chunk (members), numbered in node order
    touching = np.zeros(int(offsets[-1]), dtype=bool)
    touching[u] = touching[v] = True
    member = np.flatnonzero(touching)
    index = np.empty(len(touching), dtype=np.intp)
    index[member] = np.arange(len(member))
    graph = coo_array((np.ones(len(u), np.int8), (index[u], index[v])),
                      shape=(len(member), len(member)))
    count, component = connected_components(graph, directed=False)
    # each component's representative: its member of smallest rank
    rank = member + shift[np.searchsorted(slot_end, member, side="right")]
    lead = np.full(count, rank.max())
    np.minimum.at(lead, component, rank)
    into = lead[component]
    away = rank != into
    return member[away], into[away] + 1 - np.searchsorted(np.sort(rank[away]), into[away])


def _face_pairs(plan, layout, values, offsets):
    """Pairs of nodes the structure joins across chunk boundaries, as two arrays (the faces'
    planes of :func:`_face_planes`, read as nodes; -1 is the background)."""
    face_at, face_block, planes = layout.faces
    labels = values[face_at]
    nodes = np.where(labels > 0, offsets[face_block] - 1 + labels, -1)
    u, v = [], []
    for axis, crossing in enumerate(_crossing(plan.structure)):
        if planes[axis] is None or not crossing:
            continue
        low, high = (nodes[p] for p in planes[axis])
        for o in crossing:
            a = low[(slice(None),) + tuple(slice(max(0, -d), n - max(0, d))
                                           for d, n in zip(o, low.shape[1:]))]
            b = high[(slice(None),) + tuple(slice(max(0, d), n - max(0, -d))
                                            for d, n in zip(o, low.shape[1:]))]
            both = (a >= 0) & (b >= 0)
            a, b = a[both], b[both]
            if a.size > 1:  # a boundary repeats its pairs along runs: drop the repeats
                new = np.ones(a.size, dtype=bool)
                new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
                a, b = a[new], b[new]
            u.append(a)
            v.append(b)
    if not u:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(u), np.concatenate(v)


def _crossing(structure) -> list[list[tuple[int, ...]]]:
    """Per axis, the structure's offsets that cross a boundary along it (from a pixel before the
    boundary to one after), as offsets within the plane of the other axes."""
    steps = np.argwhere(structure) - 1
    return [[tuple(np.delete(o, axis)) or (0,) for o in steps if o[axis] == 1]
            for axis in range(structure.ndim)]


def _drop(shape, axis):
    return shape[:axis] + shape[axis + 1:]


def _table(ends, numbering, merged, labels, dtype) -> np.ndarray:
    """A block's lookup table, local label -> global label (entry 0: the background), from its
    line counts ``ends`` (labels numbered up to each line's end) and its part of the merge.

    The label ``l`` first met on line ``i`` is ``l + shift[i] - (merged-away labels below l)``,
    unless it is merged away itself. ``label_table`` in label.cu computes the same on a device.
    """
    lines = len(numbering) - 2 * merged
    shift, away, into = (numbering[:lines], numbering[lines:lines + merged],
                         numbering[lines + merged:])
    value = np.arange(1, labels + 1) + np.repeat(shift, np.diff(ends, prepend=0))
    if merged:
        below = np.zeros(labels, dtype=np.int64)
        below[away - 1] = 1
        value -= np.cumsum(below) - below
        value[away - 1] = into
    table = np.empty(labels + 1, dtype=dtype)
    table[0] = 0
    table[1:] = value  # bool tables: every label is True
    return table


def _table_device(ends, numbering, merged, labels, dtype):
    """:func:`_table` on the device of ``ends`` (a view of a device summary): one copy of the
    block's numbering to the device, one launch."""
    cp = cuda.cupy()
    lines = len(numbering) - 2 * merged
    numbering = cp.asarray(numbering)
    table = cp.empty(labels + 1, dtype=dtype)
    kernel = cuda.function("label", f"label_table<{cuda.cuda_type(ends.dtype)}, "
                                    f"{cuda.cuda_type(dtype)}>")
    kernel(_flat_grid(labels + 1), (_THREADS,),
           (ends, np.int64(lines), numbering[:lines], numbering[lines:lines + merged],
            numbering[lines + merged:], np.int64(merged), table, np.int64(labels)))
    return table


def merge_device(plan: _MergePlan, summaries) -> _DeviceNumbering:
    """:func:`merge` for summaries on one device, done there: nothing is copied to the host and
    nothing waits for the device (unless the output dtype may be too small for the labels).

    The numbering is the same, reached another way (see section 8 of ``label.cu``): each node's
    rank comes from a scan of the per-line counts in raster order; the nodes on chunk faces go
    into a hash table keyed by rank (a node on several face pixels takes one slot) and are
    joined across the faces by a union-find whose roots are the smallest ranks; the nodes merged
    away set their bits in a bitmap over the ranks, whose scan then gives every label. The work
    grows with the lines and the face pixels, and the bitmap with the labels there can be.
    """
    cp = cuda.cupy()
    values = _joined(summaries)
    launch = _merge_launches(plan, values.dtype)
    ends = cp.empty(launch.slots, dtype=np.int64)
    raster = cp.zeros(launch.segments, dtype=np.int64)
    if launch.slots:
        launch.fill_slots(launch.slots_grid, (_THREADS,), (values, *launch.slots_args, ends, raster,
                                                           launch.slots_n))
    raster = _Scan(raster)  # per slot of the table, the labels up to its end
    keys = cp.empty(launch.table, dtype=np.int64)
    keys.data.memset_async(0xFF, keys.nbytes)  # LABEL_EMPTY
    parent = cp.empty(launch.table, dtype=np.int64)
    bits = cp.zeros(launch.words, dtype=np.uint32)
    if launch.faces:
        at = cp.empty(launch.faces, dtype=np.int64)
        launch.face_nodes(launch.faces_grid, (_THREADS,),
                          (values, *launch.faces_args, ends, *raster.args, launch.segment, keys,
                           parent, at, launch.mask, launch.faces_n))
        for grid, low, high, dims, offsets in launch.unite:
            launch.face_unite(grid, (_THREADS,), (low, high, keys, at, parent, *dims, offsets))
        launch.face_roots(launch.roots_grid, (_THREADS,), (parent, keys, bits, launch.table_n))
    away = _Scan(cp.empty(launch.words, dtype=np.int64), launch.popc, (bits,))
    total = raster.total - away.total
    if not launch.holds:
        check_bit_depth(int(total), plan.dtype)
    return _DeviceNumbering(plan, ends, raster, keys, parent, launch.mask, bits, away, total)


class _MergeLaunches:
    """What :func:`merge_device` launches for a chunk grid, a structure, an output dtype and
    summaries of one dtype on the current device, worked out once: kernels, grids, the layout's
    device arrays, the sizes of the hash table and the bitmap, and their scalar arguments."""

    def __init__(self, plan, dtype):
        layout = _layout(plan.shape, plan.chunks)
        device = layout.on_device()
        ctype = cuda.cuda_type(dtype)
        self.slots = len(layout.ends_at)
        self.slots_n, self.slots_grid = np.int64(self.slots), _flat_grid(self.slots)
        self.slots_args = (device["ends_at"], device["head"], device["segment"])
        self.segments = layout.segments
        self.segment = device["segment"]
        self.fill_slots = cuda.function("label", f"label_slots<{ctype}>")
        self.faces = len(device["face_at"])
        self.faces_n, self.faces_grid = np.int64(self.faces), _flat_grid(self.faces)
        self.faces_args = (device["face_at"], device["face_block"], device["first"])
        self.table = 1 << max(1, 2 * self.faces - 1).bit_length()  # twice the faces at least
        self.table_n, self.roots_grid = np.int64(self.table), _flat_grid(self.table)
        self.mask = np.uint64(self.table - 1)
        self.words = -(-layout.most_nodes(plan.structure) // 32) + 1
        self.face_nodes = cuda.function("label", f"label_face_nodes<{ctype}>")
        self.face_unite = cuda.function("label", "label_face_unite")
        self.face_roots = cuda.function("label", "label_face_roots")
        self.popc = cuda.function("label", "label_scan_popc<long long>")
        self.unite = []
        for planes, offsets in zip(device["planes"], _unite_masks(plan.structure)):
            if planes is None or not offsets or not planes[0].size:
                continue
            low, high = planes
            dims = (low.shape[0],) + (1,) * (MAX_NDIM - low.ndim) + low.shape[1:]
            self.unite.append((_flat_grid(low.size), low, high,
                               tuple(np.int64(n) for n in dims), offsets))
        self.holds = holds(plan.dtype, math.prod(plan.shape))


def _merge_launches(plan, dtype) -> _MergeLaunches:
    """:class:`_MergeLaunches` for ``plan`` on the current device, kept with the grid's layout
    (:func:`_layout`) per structure and dtypes."""
    layout = _layout(plan.shape, plan.chunks)
    key = (cuda.cupy().cuda.runtime.getDevice(), plan.structure.tobytes(), plan.structure.shape,
           plan.dtype, np.dtype(dtype))
    launch = layout.launches.get(key)
    if launch is None:
        launch = layout.launches[key] = _MergeLaunches(plan, dtype)
    return launch


def _joined(parts):
    """The device arrays ``parts`` end to end, as one flat array: a view of their memory when
    they already lie so in one allocation (the summaries of a batch), else a copy."""
    cp = cuda.cupy()
    first = parts[0]
    at = first.data.ptr
    for part in parts:
        if (part.dtype != first.dtype or not part.flags.c_contiguous
                or part.data.mem is not first.data.mem or part.data.ptr != at):
            return cp.concatenate([p.ravel() for p in parts])
        at += part.nbytes
    return cp.ndarray((sum(p.size for p in parts),), dtype=first.dtype, memptr=first.data)


def most_labels(structure, shape) -> int:
    """The most labels a block of ``shape`` can have under ``structure``: a label starts at its
    first pixel, so at most one per pixel, or one per run of pixels along the last axis when
    the structure joins neighbours there (half the line at most, rounded up)."""
    size = math.prod(shape)
    if not size or not structure[(1,) * (len(shape) - 1) + (2,)]:
        return size
    return size // shape[-1] * ((shape[-1] + 1) // 2)


def _unite_masks(structure) -> list[np.uint32]:
    """Per axis, ``label_face_unite``'s mask of the structure's offsets across a boundary."""
    structure = np.ascontiguousarray(structure, dtype=bool)
    return _unite_masks_of(structure.tobytes(), structure.shape)


@functools.lru_cache(maxsize=64)
def _unite_masks_of(raw: bytes, shape) -> list[np.uint32]:
    structure = np.frombuffer(raw, dtype=bool).reshape(shape)
    return [np.uint32(_plane_offsets(c)) for c in _crossing(structure)]


def _plane_offsets(crossing) -> int:
    """``label_face_unite``'s mask of plane offsets (up to 3-D, leading zeros added)."""
    mask = 0
    for o in crossing:
        o = (0,) * (MAX_NDIM - 1 - len(o)) + tuple(o)
        mask |= 1 << ((o[0] + 1) * 9 + (o[1] + 1) * 3 + o[2] + 1)
    return mask


class _DeviceNumbering:
    """What :func:`merge_device` leaves on the device for the relabel tasks: per slot the labels
    up to its line's end (``ends``) and the scan, in raster order, of the labels starting on
    each slot (``raster``); the hash table of face nodes (``keys``, their ranks, and ``parent``,
    their roots; ``mask`` + 1 slots), the bitmap of the nodes merged away and the scan of its
    words' counts (``away``); and the number of labels (a 0-d device array)."""

    def __init__(self, plan, ends, raster, keys, parent, mask, bits, away, total):
        self.shape, self.chunks = plan.shape, plan.chunks
        self.arrays = {"ends": ends, "raster": raster.values, "raster_offsets": raster.offsets,
                       "keys": keys, "parent": parent, "bits": bits, "away": away.values,
                       "away_offsets": away.offsets}
        self.segs = (np.int64(raster.seg), np.int64(away.seg))
        self.mask = mask
        self.total = total
        self.structure = plan.structure
        self._copies = {}

    def merged(self, a) -> tuple:
        """The renumbering kernels' arguments for the merge (label_merged in label.cu), from
        the arrays ``a`` (:meth:`_here`)."""
        return (a["keys"], a["parent"], self.mask, a["bits"], a["away"], a["away_offsets"],
                self.segs[1])

    def _here(self) -> dict:
        """The arrays on the current device: copied there (once) if they are elsewhere."""
        cp = cuda.cupy()
        device = cp.cuda.runtime.getDevice()
        if self.arrays["ends"].device.id == device:
            return self.arrays
        if device not in self._copies:
            self._copies[device] = {k: cp.asarray(v) for k, v in self.arrays.items()}
        return self._copies[device]

    def relabel(self, b, labels, dtype):
        """Block ``b``'s labels (C-ordered local labels on the current device) in the global
        numbering, as a new array of ``dtype``: its lookup table from local to global labels
        (``label_renumber``: entries ``0..most_labels(structure, shape)``, those past its labels
        unset, since the host does not know how many it has), then one lookup per pixel."""
        cp = cuda.cupy()
        plan = _relabel_plan(labels.device.id, self.shape, self.chunks, b, labels.shape,
                             labels.dtype, np.dtype(dtype), most_labels(self.structure, labels.shape))
        a = self._here()
        table = cp.empty(plan.table_size, dtype=dtype)
        plan.renumber(plan.renumber_grid, (_THREADS,),
                      (a["ends"], a["raster"], a["raster_offsets"], self.segs[0], plan.segment,
                       plan.s0, plan.lines, *self.merged(a), table, plan.bound))
        out = cp.empty(labels.shape, dtype=dtype)
        if labels.size:
            plan.lookup(plan.lookup_grid, (_THREADS,), (labels, table, out, plan.size))
        return out


    def relabel_batch(self, forest, members, dtype) -> list:
        """The blocks ``members`` of the grid, labelled together as ``forest`` (a batch,
        :meth:`_LocalLabels.many`), in the global numbering: one table for the batch, indexed by
        a root's rank in it (``label_renumber_batch``), then every pixel through it
        (``label_write_through``), into the parent array itself when ``dtype`` is its dtype.
        Per block a C-ordered view of the result."""
        cp = cuda.cupy()
        plan = forest.plan
        device = forest.parent.device.id
        count = len(members)
        launch = _batch_relabel_plan(device, self.shape, self.chunks, tuple(members), plan.ctype,
                                     np.dtype(dtype), most_labels(self.structure, plan.shape))
        a = self._here()
        table = cp.empty(launch.table_size, dtype=dtype)
        launch.renumber(launch.renumber_grid, (_THREADS,),
                        (a["ends"], a["raster"], a["raster_offsets"], self.segs[0], launch.segment,
                         launch.first, launch.blocks, *forest.rank.args, np.int64(plan.size),
                         *self.merged(a), table, launch.bound))
        n = forest.parent.size
        out = forest.parent if forest.parent.dtype == dtype else cp.empty(n, dtype=dtype)
        launch.write(_flat_grid(-(-n // 4)), (_THREADS,), (forest.parent, *forest.rank.args,
                                                            table, out, np.int64(n)))
        return _pieces(out, plan.shape, count)


class _BatchRelabelPlan:
    """What :meth:`_DeviceNumbering.relabel_batch` launches for a batch of blocks of a chunk grid
    on one device, worked out once per grid and batch."""

    __slots__ = ("renumber", "renumber_grid", "segment", "first", "blocks", "bound",
                 "table_size", "write")

    def __init__(self, device, shape, chunks, members, ctype, dtype, bound):
        arrays = _layout(shape, chunks).on_device()
        self.segment, self.first = arrays["segment"], arrays["first"]
        blocks = np.zeros(_BATCH, dtype=np.int64)
        blocks[:len(members)] = members
        self.blocks = blocks.view(_SOURCES)
        self.bound = np.int64(bound)
        self.table_size = len(members) * bound + 1
        per_block = max(1, 4 * cuda.sm_count(device) // len(members))
        self.renumber_grid = (min(_flat_grid(bound)[0], per_block), len(members))
        otype = cuda.cuda_type(dtype)
        self.renumber = cuda.function("label", f"label_renumber_batch<{ctype}, {otype}>")
        self.write = cuda.function("label", f"label_write_through<{ctype}, {otype}>")


@functools.lru_cache(maxsize=256)
def _batch_relabel_plan(device, shape, chunks, members, ctype, dtype, bound) -> _BatchRelabelPlan:
    with cuda.cupy().cuda.Device(device):
        return _BatchRelabelPlan(device, shape, chunks, members, ctype, dtype, bound)


class _RelabelPlan:
    """What :meth:`_DeviceNumbering.relabel` launches for block ``b`` of a chunk grid on one
    device, worked out once per grid: the kernels, grids and scalar arguments."""

    __slots__ = ("renumber", "renumber_grid", "segment", "s0", "lines", "bound", "table_size",
                 "lookup", "lookup_grid", "size")

    def __init__(self, device, shape, chunks, b, bshape, labels_dtype, dtype, bound):
        grid = _layout(shape, chunks)
        s0, s1 = grid.first[b], grid.first[b + 1]
        self.segment = grid.on_device()["segment"]
        self.s0, self.lines = np.int64(s0), np.int64(s1 - s0)
        self.bound, self.table_size = np.int64(bound), bound + 1
        self.renumber_grid = (min(_flat_grid(bound + 1)[0], 4 * cuda.sm_count(device)),)
        self.renumber = cuda.function("label", f"label_renumber<{cuda.cuda_type(dtype)}>")
        size = math.prod(bshape)
        self.size = np.int64(size)
        self.lookup_grid = _flat_grid(size)
        self.lookup = cuda.function("label", f"label_lookup<{cuda.cuda_type(labels_dtype)}, "
                                             f"{cuda.cuda_type(dtype)}>")


@functools.lru_cache(maxsize=1024)
def _relabel_plan(device, shape, chunks, b, bshape, labels_dtype, dtype, bound) -> _RelabelPlan:
    with cuda.cupy().cuda.Device(device):
        return _RelabelPlan(device, shape, chunks, b, bshape, labels_dtype, dtype, bound)


def _on_one_device(summaries) -> bool:
    """Whether every summary is a CuPy array, all on one device."""
    devices = {s.device.id if cuda.is_cupy_array(s) else None for s in summaries}
    return len(devices) == 1 and None not in devices


def _summary_of(local):
    return local[1]


def _merge_task(plan, results):
    """Step 2 from the local results (labels, summary) or the summaries alone."""
    summaries = [r[1] if isinstance(r, tuple) else r for r in results]
    if len(plan.shape) <= MAX_NDIM and _on_one_device(summaries):
        with summaries[0].device:
            return merge_device(plan, summaries)
    return merge(plan, summaries)


def _relabel(local, merged, b, dtype):
    """Step 3: block ``b``'s local labels through its lookup table, on the labels' device."""
    labels, summary = local
    if isinstance(merged, _DeviceNumbering):
        with labels.device:
            return merged.relabel(b, cuda.cupy().ascontiguousarray(labels), dtype)
    numbering, away, count = merged[0][b]
    lines = len(numbering) - 2 * away
    ends = summary[len(summary) - lines:]
    if cuda.is_cupy_array(labels):
        cp = cuda.cupy()
        with labels.device:
            if cuda.is_cupy_array(summary):
                table = _table_device(ends, numbering, away, count, dtype)
            else:  # a block labelled on the host (empty, or refused by the kernels)
                table = cp.asarray(_table(ends, numbering, away, count, dtype))
            return cp.take(table, labels)
    return _table(ends, numbering, away, count, dtype)[labels]


def _count(merged):
    total = merged.total if isinstance(merged, _DeviceNumbering) else merged[1]
    return np.asarray(int(total), dtype=np.intp)


def _label_blocks(plan: _MergePlan, local, dtype, blocks):
    """Steps 1 to 3 in one task: ``(every block's labels, the merge, the number of labels)``,
    the number an ``int`` or a :class:`_HostNumber`. Blocks labelled in a batch get their global
    labels in one pass over the batch when the merge was made on their device; else (blocks on
    several devices, merged on the host) their local labels are written and relabelled block by
    block, as the others are."""
    results, batches = local.many(blocks)
    merged = _merge_task(plan, results)
    number = _HostNumber(merged.total) if isinstance(merged, _DeviceNumbering) else merged[1]
    out = [None] * len(blocks)
    for forest, members in batches:
        with forest.parent.device:
            if isinstance(merged, _DeviceNumbering):
                for b, labels in zip(members, merged.relabel_batch(forest, members, dtype)):
                    out[b] = labels
            else:
                for b, local_result in zip(members, forest.write_summary()):
                    results[b] = local_result
    return [_relabel(r, merged, b, dtype) if out[b] is None else out[b]
            for b, r in enumerate(results)], merged, number


class _HostNumber:
    """The number of labels (a 0-d device array) on its way to the host: copied to pinned
    memory without waiting, behind the merge and ahead of the relabelling, so that reading it
    (``int``) waits for the merge alone, and Dask's work after the count task overlaps the
    relabelling on the device."""

    __slots__ = ("value", "done")

    def __init__(self, total):
        import cupyx

        cp = cuda.cupy()
        self.value = cupyx.empty_pinned((), dtype=total.dtype)
        with total.device:
            stream = cp.cuda.get_current_stream()
            cp.cuda.runtime.memcpyAsync(self.value.ctypes.data, total.data.ptr, total.nbytes,
                                        cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
            self.done = cp.cuda.Event(disable_timing=True)
            self.done.record(stream)

    def __int__(self) -> int:
        self.done.synchronize()
        return int(self.value)


def _pick(labelled, b):
    """Block ``b``'s labels from the result of :func:`_label_blocks`."""
    return labelled[0][b]


def _count_labelled(labelled, blocks):
    """The number of labels from the result of :func:`_label_blocks`. ``blocks`` (the chunks'
    labels, unused) make the scheduler run it after every pick: reading the number waits for
    the device (up to the merge), and the picks then need not wait for it."""
    return np.asarray(int(labelled[2]), dtype=np.intp)


def plan(x, structure, dtype=None, *, strict=False):
    """The labels of Dask array ``x`` and their number, as two lazy Dask arrays sharing one graph.

    The labels have ``x``'s chunks and array type (NumPy or CuPy chunks); the number is a 0-d
    NumPy-backed array. ``structure`` is checked (:func:`check_structure`); ``dtype`` defaults
    to :func:`default_dtype` of the whole array. The graph's shape is chosen where it runs
    (:func:`chunkernels._graph.chosen_array`, :func:`_tasks`).
    """
    from chunkernels import _graph

    dtype = default_dtype(x.size) if dtype is None else np.dtype(dtype)
    xp = cuda.array_module(x)
    if x.ndim == 0:  # one pixel: label it as a 1-D array of one
        labels, count = plan(x[None], check_structure(None, 1), dtype, strict=strict)
        return labels[0], count
    name = "label-" + _graph.tokenize(x, structure, dtype, strict)
    source = _graph.BlockSource(x)
    dependencies = [] if source.held is not None else [x]
    args = (name, source, x.numblocks, _MergePlan(x.shape, x.chunks, structure, dtype),
            _LocalLabels(structure, strict), dtype)
    local = local_shape(xp)
    labels = _graph.chosen_array(
        name, local=functools.partial(_tasks, *args, local),
        cluster=functools.partial(_tasks, *args, "per block, summaries"), chunks=x.chunks,
        dtype=dtype, meta=_graph.meta(x, dtype), dependencies=dependencies)
    count_name = f"{name}-count"
    count = _graph.chosen_array(
        count_name, local=functools.partial(_count_tasks, name, x.numblocks, local),
        cluster=functools.partial(_count_tasks, name, x.numblocks, "per block"), chunks=(),
        dtype=np.intp, meta=np.empty((), dtype=np.intp), dependencies=[labels])
    return labels, count


def local_shape(xp) -> str:
    """The shape of the label's graph under a local scheduler (:func:`_tasks`): ``"one task"``
    for CuPy blocks, ``"per block"`` for NumPy blocks (labelled by SciPy, which releases the
    GIL, in parallel)."""
    return "one task" if xp is not np else "per block"


def _tasks(name, source, numblocks, merge_plan, local, dtype, shape) -> dict:
    """The label's tasks, in one of three shapes:

    * ``"one task"``: steps 1 to 3 in one task (:func:`_label_blocks`), each chunk's task
      picking its labels: CuPy blocks under a local scheduler. Their labelling only queues
      kernels, and blocks of one layout share each launch (a batch, :meth:`_LocalLabels.many`),
      so a task per block would add Dask's handling of a task, which costs the host more than
      the launches, once per block and buy no parallelism; the summaries and the merge stay on
      the device either way;
    * ``"per block"``: a local labelling per block, one merge, a relabel per block: NumPy blocks
      under a local scheduler, labelled by SciPy in parallel;
    * ``"per block, summaries"``: the same, with a task per block that keeps only its summary,
      so that on a cluster only the summaries travel to the merge's worker, not every chunk's
      labels.
    """
    from chunkernels import _graph

    tasks = _graph.Tasks()
    merge_key = (f"{name}-merge",)
    indices = list(np.ndindex(*numblocks))
    if shape == "one task":
        merged = tasks.add(merge_key, _label_blocks, merge_plan, local, dtype,
                           tasks.items(source.arg(index) for index in indices))
        for b, index in enumerate(indices):
            tasks.add((name, *index), _pick, merged, b)
        return tasks.graph
    locals_ = [tasks.add((f"{name}-local", *index), local, source.arg(index))
               for index in indices]
    merged_from = locals_
    if shape == "per block, summaries":
        merged_from = [tasks.add((f"{name}-summary", *index), _summary_of, ref)
                       for index, ref in zip(indices, locals_)]
    merged = tasks.add(merge_key, _merge_task, merge_plan, tasks.items(merged_from))
    for b, (index, ref) in enumerate(zip(indices, locals_)):
        tasks.add((name, *index), _relabel, ref, merged, b, dtype)
    return tasks.graph


def _count_tasks(name, numblocks, shape) -> dict:
    """The task giving the number of labels, for the labels' tasks of ``shape``
    (:func:`_tasks`)."""
    from chunkernels import _graph

    tasks = _graph.Tasks()
    merged = tasks.ref((f"{name}-merge",))
    if shape == "one task":
        picks = tasks.items(tasks.ref((name, *index)) for index in np.ndindex(*numblocks))
        tasks.add((f"{name}-count",), _count_labelled, merged, picks)
    else:
        tasks.add((f"{name}-count",), _count, merged)
    return tasks.graph


def dask_graph(x, *, strict=False, structure, dtype=None):
    """The labels of a Dask array (:func:`plan`'s first result)."""
    return plan(x, structure, dtype, strict=strict)[0]


# -- chunkernels check --------------------------------------------------------------------------


def _cases(rng):
    """Random binary images for ``chunkernels check``: densities around percolation, every
    connectivity of 2-D and 3-D, a 1-D line, integer and float data, a negative-stride view."""
    for density, connectivity in ((0.3, 1), (0.59, 1), (0.45, 2)):
        x = rng.random((61, 47)) < density
        yield x, (), {"structure": ndi.generate_binary_structure(2, connectivity)}
    for connectivity in (1, 2, 3):
        x = (rng.random((13, 17, 11)) < 0.3).astype(np.uint8)
        yield x, (), {"structure": ndi.generate_binary_structure(3, connectivity)}
    yield (rng.random(200) < 0.5).astype(np.float32), (), {"structure": None}
    base = rng.integers(0, 3, size=(40, 50)).astype(np.int16)
    yield base[::-2, 3:-4], (), {"structure": np.ones((3, 3), bool), "dtype": "int64"}


SPEC = KernelSpec(
    name="label",
    summary="connected components of the nonzero pixels under a symmetric 3**ndim structure, "
            "numbered in raster order of their first pixels; reference scipy.ndimage.label",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="label.cu",
    entries=(
        "label_tiles<bool, int>",
        "label_tiles<unsigned char, int>",
        "label_tiles<float, long long>",
        "label_tiles<double, int>",
        "label_merge<int>",
        "label_merge<long long>",
        "label_merge_borders<int>",
        "label_merge_borders<long long>",
        "label_flatten<int>",
        "label_flatten<long long>",
        "label_scan<int>",
        "label_scan<long long>",
        "label_scan_offsets<int>",
        "label_scan_offsets<long long>",
        "label_write<int, int>",
        "label_write<int, bool>",
        "label_write<long long, double>",
        "label_write_summary<int>",
        "label_write_summary<long long>",
        "label_table<int, int>",
        "label_table<int, bool>",
        "label_table<int, unsigned char>",
        "label_table<long long, double>",
        "label_table<long long, long long>",
        "label_slots<int>",
        "label_slots<long long>",
        "label_face_nodes<int>",
        "label_face_nodes<long long>",
        "label_face_unite",
        "label_scan_popc<long long>",
        "label_face_roots",
        "label_renumber<int>",
        "label_renumber<bool>",
        "label_renumber<long long>",
        "label_renumber<double>",
        "label_lookup<int, int>",
        "label_lookup<int, bool>",
        "label_lookup<long long, long long>",
        "label_lookup<int, double>",
        "label_summary<int>",
        "label_summary<long long>",
        "label_renumber_batch<int, int>",
        "label_renumber_batch<int, bool>",
        "label_renumber_batch<int, long long>",
        "label_renumber_batch<int, double>",
        "label_write_through<int, int>",
        "label_write_through<int, bool>",
        "label_write_through<int, long long>",
        "label_write_through<int, double>",
    ),
    dtypes=GPU_DTYPES,
    ndim=(0, MAX_NDIM),
    validate=_validate,
    result_dtype=_result_dtype,
    supports=_supports,
    cases=_cases,
    dask_graph=dask_graph,
    halo_rule="none (not blockwise: per-chunk labels, one merge of the faces, a relabel)",
)
