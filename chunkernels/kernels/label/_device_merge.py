"""label's merge on the device (step 2 of a chunked label, for summaries all on one device;
``kernels_cuda/label.cu``, section 8) and the relabelling of step 3 there: what the merge leaves
on the device (:class:`_DeviceNumbering`), and each block's lookup table built and applied on
its device.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from chunkernels import cuda
from chunkernels.kernels.label._forest import _BATCH, _SOURCES, _THREADS, _flat_grid, _pieces, _Scan
from chunkernels.kernels.label._host_merge import _crossing, _layout, _MergePlan, most_labels
from chunkernels.kernels.label._reference import MAX_NDIM, check_bit_depth, holds


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


#: The most bytes the merge's bitmap of nodes merged away and the scan of its words' counts may
#: take when sized by the labels the blocks can have (half their pixels, 4-connected); past it
#: they are sized by the labels the blocks have, which the host then waits for (once). Sized by
#: the bound, a 160000² image's took 4.5 GiB on each GPU worker (every worker makes the merge),
#: for 7 million labels; by the labels there are, a few MiB.
BITMAP_BYTES = 2**28
_WORD_BYTES = 4 + 8  # a word of the bitmap and its count's scan (int64)


def merge_device(plan: _MergePlan, summaries) -> _DeviceNumbering:
    """:func:`merge` for summaries on one device, done there: nothing is copied to the host and
    nothing waits for the device (unless the output dtype may be too small for the labels, or
    the bitmap below would be large).

    The numbering is the same, reached another way (see section 8 of ``label.cu``): each node's
    rank comes from a scan of the per-line counts in raster order; the nodes on chunk faces go
    into a hash table keyed by rank (a node on several face pixels takes one slot) and are
    joined across the faces by a union-find whose roots are the smallest ranks; the nodes merged
    away set their bits in a bitmap over the ranks, whose scan then gives every label. The work
    grows with the lines and the face pixels, and the bitmap with the labels there can be
    (a bit and the scan's 8 bytes per 32 of them), or, where that would pass
    :data:`BITMAP_BYTES`, with the labels the blocks have: the host waits for their count.
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
    words = launch.words
    if words * _WORD_BYTES > BITMAP_BYTES:  # sized by the nodes there are: one wait for them
        words = int(raster.total) // 32 + 1
    bits = cp.zeros(words, dtype=np.uint32)
    if launch.faces:
        at = cp.empty(launch.faces, dtype=np.int64)
        launch.face_nodes(launch.faces_grid, (_THREADS,),
                          (values, *launch.faces_args, ends, *raster.args, launch.segment, keys,
                           parent, at, launch.mask, launch.faces_n))
        for grid, low, high, dims, offsets in launch.unite:
            launch.face_unite(grid, (_THREADS,), (low, high, keys, at, parent, *dims, offsets))
        launch.face_roots(launch.roots_grid, (_THREADS,), (parent, keys, bits, launch.table_n))
    away = _Scan(cp.empty(words, dtype=np.int64), launch.popc, (bits,))
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
    they already lie so in one allocation (the summaries of a batch), else a copy, one per run
    of parts that lie end to end (a batch's). Not ``cupy.concatenate``: past 8 arrays it
    launches a kernel of its own, compiled on first use, so a first run with more blocks than
    its warm-up compiled it (165 ms on one H100)."""
    cp = cuda.cupy()
    runs = []  # [first part, size, parts] of each run of parts lying end to end in one allocation
    for part in parts:
        if runs:
            first, size, _ = run = runs[-1]
            if (part.size and size and part.dtype == first.dtype and part.flags.c_contiguous
                    and first.flags.c_contiguous and part.data.mem is first.data.mem
                    and part.data.ptr == first.data.ptr + size * first.itemsize):
                run[1] += part.size
                run[2] += 1
                continue
        runs.append([part, part.size, 1])
    views = [first.ravel() if count == 1 else
             cp.ndarray((size,), dtype=first.dtype, memptr=first.data)
             for first, size, count in runs]
    if len(views) == 1:
        return views[0]
    out = cp.empty(sum(v.size for v in views), dtype=np.result_type(*(v.dtype for v in views)))
    at = 0
    for view in views:
        out[at:at + view.size] = view
        at += view.size
    return out


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

    def __sizeof__(self) -> int:
        """Its device arrays' bytes too, which Dask's ``sizeof`` (``sys.getsizeof``) then
        reports: the scheduler's placement and the transfer counters see what it weighs."""
        return object.__sizeof__(self) + sum(a.nbytes for a in self.arrays.values())

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


