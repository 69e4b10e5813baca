"""label's merge on the host (step 2 of a chunked label, for summaries on the host or on
several devices): the layout of a chunk grid in the joined summaries (:class:`_Layout`, which
the merge on the device reads too), the global numbering from the summaries' faces and line
counts, and each block's lookup table from local to global labels.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from chunkernels import cuda
from chunkernels.kernels.label._forest import summary_layout
from chunkernels.kernels.label._reference import check_bit_depth


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



def most_labels(structure, shape) -> int:
    """The most labels a block of ``shape`` can have under ``structure``: a label starts at its
    first pixel, so at most one per pixel, or one per run of pixels along the last axis when
    the structure joins neighbours there (half the line at most, rounded up)."""
    size = math.prod(shape)
    if not size or not structure[(1,) * (len(shape) - 1) + (2,)]:
        return size
    return size // shape[-1] * ((shape[-1] + 1) // 2)


