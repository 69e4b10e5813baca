"""Periodic labelling: ``label(..., wrap_axes=...)``, as ``dask_image.ndmeasure.label`` has it.

Along a wrap axis the array is closed into a ring: its last position neighbours its first, and
a feature crossing the edge is one feature. The labels are first found as scipy finds them
(the non-periodic labels, on any backend and chunking); then the pairs of labels that touch
across a wrapped edge, through the structure's offsets, are read from the array's faces only,
joined into components on the host (a few numbers per edge pixel), and every label is mapped
through a table to its component. Components are numbered by their smallest label, the raster
order of their first pixel, so the numbering keeps scipy's rule. NumPy, CuPy (faces on the
device, one copy of the pairs to the host) and Dask arrays (the faces' chunks feed one task; a
relabelling task per chunk) run the same code.
"""

from __future__ import annotations

import itertools
import numbers

import numpy as np

from chunkernels import cuda
from chunkernels.kernels.label import LabelError, check_bit_depth


def check_wrap_axes(wrap_axes, ndim: int) -> tuple[int, ...]:
    """``wrap_axes`` (None, an axis or a sequence of axes) as sorted non-negative axes."""
    if wrap_axes is None:
        return ()
    axes = (wrap_axes,) if isinstance(wrap_axes, numbers.Integral) else tuple(wrap_axes)
    for a in axes:
        if not isinstance(a, numbers.Integral) or isinstance(a, bool) or not -ndim <= a < ndim:
            raise LabelError(f"wrap_axes must hold axes of the {ndim}-d input (from {-ndim} to "
                             f"{ndim - 1}); got wrap_axes={wrap_axes!r}")
    normal = sorted({int(a) % ndim for a in axes})
    if len(normal) != len(axes):
        raise LabelError(f"wrap_axes names an axis twice: {wrap_axes!r}")
    return tuple(normal)


def edge_pairs(shape, structure, wrap) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """``(source slices, neighbour slices)`` of the array's faces whose elements neighbour each
    other across a wrapped edge: one entry per structure offset (one of each symmetric pair)
    and per way of stepping over the edges, at least one of them wrapped."""
    out = []
    for offset in zip(*np.nonzero(structure)):
        step = [int(i) - 1 for i in offset]
        nonzero = [s for s in step if s]
        if not nonzero or nonzero[0] < 0 or not any(step[a] for a in wrap):
            continue  # the centre, the mirror of an offset already taken, or no wrapped step
        options = []
        for a, (s, n) in enumerate(zip(step, shape)):
            if s == 0:
                options.append([(slice(None), slice(None), False)])
                continue
            inside = (slice(0, n - 1), slice(1, n)) if s > 0 else (slice(1, n), slice(0, n - 1))
            ways = [(*inside, False)]
            if a in wrap:
                ways.append((slice(n - 1, n), slice(0, 1), True) if s > 0
                            else (slice(0, 1), slice(n - 1, n), True))
            options.append(ways)
        for combo in itertools.product(*options):
            if any(crosses for *_, crosses in combo):
                out.append((tuple(c[0] for c in combo), tuple(c[1] for c in combo)))
    return out


def _pairs(faces) -> np.ndarray:
    """The ``(2, n)`` label pairs of ``faces`` (source, neighbour arrays, alternating) that are
    both features, on the host."""
    found = []
    for src, dst in zip(faces[::2], faces[1::2]):
        keep = (src > 0) & (dst > 0)
        found.append(cuda.array_module(src).stack([src[keep], dst[keep]]))
    if not found:
        return np.zeros((2, 0), dtype=np.int64)
    both = cuda.array_module(found[0]).concatenate(found, axis=1)
    return np.asarray(cuda.to_host(both), dtype=np.int64)


def merge_table(pairs: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """``(table, number)``: the new label of each label ``0..count`` once the ``pairs`` are
    joined, numbered 1, 2, ... by each component's smallest label, and how many there are."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    size = count + 1
    graph = coo_matrix((np.ones(pairs.shape[1], dtype=bool), (pairs[0], pairs[1])),
                       shape=(size, size))
    number, component = connected_components(graph, directed=False)
    smallest = np.full(number, size, dtype=np.int64)
    np.minimum.at(smallest, component, np.arange(size))
    rank = np.empty(number, dtype=np.int64)
    rank[np.argsort(smallest)] = np.arange(number)  # the background (label 0) ranks 0
    return rank[component], number - 1


def wrapped(labels, count: int, structure, wrap, dtype):
    """NumPy or CuPy ``labels`` (``count`` features) joined across the wrapped edges:
    ``(labels of dtype, number)``."""
    faces = [labels[s] for pair in edge_pairs(labels.shape, structure, wrap) for s in pair]
    merged = _merge_faces(count, dtype, *faces)
    return _relabel(labels, merged), merged[1]


def wrapped_dask(labels, count, structure, wrap, dtype):
    """The same for lazy Dask ``labels`` and ``count``: a task reads the faces (the edge chunks'
    slices) and makes the table; a task per chunk maps its labels through it.

    The faces enter that task as references to their blocks, in the one graph: handed to
    ``dask.delayed`` as Dask arrays, each would be optimised on its own and carry a renamed copy
    of the labelling, which then ran once per face."""
    from chunkernels import _graph

    faces = [labels[s] for pair in edge_pairs(labels.shape, structure, wrap) for s in pair]
    name = f"label-wrap-{_graph.tokenize(labels, count, structure, wrap, dtype)}"
    tasks = _graph.Tasks()
    whole = [tasks.call(_graph.assembled,
                        tasks.items(tasks.block(f, i) for i in np.ndindex(*f.numblocks)),
                        f.numblocks)
             for f in faces]
    table = tasks.add((f"{name}-table",), _merge_faces, tasks.block(count, ()), np.dtype(dtype),
                      *whole)
    for index in np.ndindex(*labels.numblocks):
        tasks.add((name, *index), _relabel, tasks.block(labels, index), table)
    out = tasks.array(name, labels.chunks, dtype, _graph.meta(labels, dtype))
    counted = _graph.Tasks()
    counted.read(out)
    counted.add((f"{name}-count",), _number, table)
    number = counted.array(f"{name}-count", (), np.intp, np.empty((), np.intp))
    return out, number


def _merge_faces(count, dtype, *faces):
    """``(table in dtype, number)`` for labels ``0..count`` joined across the ``faces`` (pairs
    of arrays, as :func:`edge_pairs` slices them), or scipy's error where dtype is too small."""
    table, number = merge_table(_pairs(faces), int(count))
    check_bit_depth(number, dtype)
    return table.astype(dtype, copy=False), number


def _relabel(block, merged):
    """``block``'s labels through the table of :func:`_merge_faces`."""
    table = merged[0]
    return cuda.array_module(block).asarray(table)[block]


def _number(merged):
    return np.asarray(merged[1], dtype=np.intp)
