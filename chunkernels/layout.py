"""Stride-aware layout planning for kernels that read views.

Dask blocks are usually views of a larger array: sliced (row strides larger than the row),
transposed or Fortran-ordered, reversed (negative strides) or broadcast (zero strides). These
helpers describe such views to a kernel without copying them:

* :func:`empty_like` allocates an output laid out like the input (NumPy's ``order='K'``);
* :func:`plan_pointwise` turns an output and its same-shape input views into a small iteration
  space: axes in the output's memory order, size-1 axes dropped, mergeable axes collapsed, element
  strides per operand, and whether 32-bit indexing is enough.

They work on NumPy and CuPy arrays alike and import neither CuPy nor CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Largest offset a 32-bit signed index can address.
INT32_MAX = 2**31 - 1


class LayoutError(ValueError):
    """A view whose strides cannot be expressed in whole elements."""


def memory_order(shape, strides) -> tuple[int, ...]:
    """Axes ordered outermost-first by the memory layout of an array with these strides.

    Broadcast (zero-stride) axes come first, then axes by decreasing ``|stride|``; ties keep C
    order. This is NumPy's ``order='K'`` and the order in which a kernel should walk the array.
    """
    def key(axis):
        s = abs(strides[axis])
        return -math.inf if s == 0 else -s

    return tuple(sorted(range(len(shape)), key=key))


def empty_like(xp, x, dtype=None):
    """An uninitialised array shaped like ``x`` whose memory follows ``x``'s axis order.

    ``xp`` is ``numpy`` or ``cupy``. A C-ordered ``x`` gives a C-ordered result, a Fortran or
    transposed ``x`` a matching layout, so that a kernel reading ``x`` and writing the result walks
    both in the same order. Strides are always positive.
    """
    return Allocation(x.shape, x.strides).empty(xp, x.dtype if dtype is None else dtype)


class Allocation:
    """How :func:`empty_like` lays out arrays like a view of ``shape`` and ``strides``.

    Kernels that plan a launch once per layout keep one, so an output costs an allocation and
    (for views not in C order) a transpose, not a new plan.
    """

    __slots__ = ("shape", "axes")

    def __init__(self, shape, strides):
        order = memory_order(shape, strides)
        self.shape = tuple(shape[a] for a in order)
        inverse = tuple(int(a) for a in np.argsort(order))
        self.axes = None if inverse == tuple(range(len(shape))) else inverse

    def empty(self, xp, dtype):
        out = xp.empty(self.shape, dtype=dtype)
        return out if self.axes is None else out.transpose(self.axes)


def element_strides(a) -> tuple[int, ...]:
    """``a.strides`` in elements (``a`` may be a NumPy or CuPy view)."""
    itemsize = a.dtype.itemsize
    out = []
    for s in a.strides:
        if s % itemsize:
            raise LayoutError(
                f"stride {s} bytes of a {a.dtype} view (strides {a.strides}) is not a whole "
                f"number of {itemsize}-byte elements; copy it first (xp.ascontiguousarray)"
            )
        out.append(s // itemsize)
    return tuple(out)


@dataclass(frozen=True)
class PointwisePlan:
    """An iteration space shared by an output and its inputs.

    Attributes
    ----------
    shape
        Extents, outermost first, after dropping size-1 axes and collapsing.
    strides
        For each array given to :func:`plan_pointwise` (output first), its element strides
        along ``shape``.
    axes
        For each dim of ``shape``, the original axes it covers (outermost first).
    index64
        Whether an offset or the element count may pass ``INT32_MAX``: use 64-bit indices.
    """

    shape: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    axes: tuple[tuple[int, ...], ...]
    index64: bool

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def vector_width(self, arrays, widest_bytes: int = 16, broadcast_ok=()) -> int:
        """Elements per aligned vector access that every array allows along the inner dim.

        ``arrays`` are the arrays given to :func:`plan_pointwise`, in the same order; those
        whose index is in ``broadcast_ok`` may also have inner stride 0 (one value replicated).
        Returns 1 when any array is misaligned, strided along the inner dim, or the inner extent
        is not a multiple of the width.
        """
        if not self.shape:
            return 1
        vec = widest_bytes // max(a.dtype.itemsize for a in arrays)
        while vec > 1:
            if self._vectorises(arrays, vec, broadcast_ok):
                return vec
            vec //= 2
        return 1

    def _vectorises(self, arrays, vec, broadcast_ok) -> bool:
        if self.shape[-1] % vec:
            return False
        for i, (a, strides) in enumerate(zip(arrays, self.strides)):
            inner = strides[-1]
            if inner == 0 and i in broadcast_ok:
                continue
            if inner != 1 or any(s % vec for s in strides[:-1]):
                return False
            if pointer(a) % (vec * a.dtype.itemsize):
                return False
        return True


def pointer(a) -> int:
    """Address of ``a``'s first element (``a[0, ..., 0]``), NumPy or CuPy."""
    data = a.data
    return data.ptr if hasattr(data, "ptr") else a.ctypes.data


def lowest_pointer(a) -> int:
    """Address of the element of non-empty ``a`` lowest in memory, whatever the signs of its
    strides (its first element's, :func:`pointer`, when none is negative)."""
    return pointer(a) + sum(min(0, s) * (n - 1) for s, n in zip(a.strides, a.shape))


def is_dense(a) -> bool:
    """Whether ``a``'s elements fill a run of memory without gaps, in some order: walked in
    memory order, it collapses to one axis of unit stride (C or Fortran order, every axis reversed,
    a single element)."""
    plan = plan_pointwise(a)
    return not plan.shape or (len(plan.shape) == 1 and abs(plan.strides[0][0]) == 1)


def plan_pointwise(out, *inputs) -> PointwisePlan:
    """Plan a walk over ``out`` and same-shape ``inputs`` (broadcast views allowed).

    The walk follows ``out``'s memory order, so an output from :func:`empty_like` is contiguous
    along it and collapses fully where the inputs allow.
    """
    arrays = (out, *inputs)
    for a in inputs:
        if a.shape != out.shape:
            raise ValueError(f"plan_pointwise needs same-shape arrays; got {a.shape} and {out.shape}"
                             " (broadcast inputs to the output's shape first)")
    strides = [element_strides(a) for a in arrays]
    dims = []  # [extent, [stride per array], [axes]]
    for axis in memory_order(out.shape, out.strides):
        n = out.shape[axis]
        if n == 1:
            continue
        s = [st[axis] for st in strides]
        if dims and all(prev == cur * n for prev, cur in zip(dims[-1][1], s)):
            dims[-1][0] *= n
            dims[-1][1] = s
            dims[-1][2].append(axis)
        else:
            dims.append([n, s, [axis]])
    shape = tuple(d[0] for d in dims)
    plan_strides = tuple(tuple(d[1][i] for d in dims) for i in range(len(arrays)))
    count = math.prod(shape)
    spans = (
        sum((n - 1) * abs(s) for n, s in zip(shape, st)) * a.dtype.itemsize + a.dtype.itemsize
        for a, st in zip(arrays, plan_strides)
    )
    index64 = count > INT32_MAX or max(spans, default=0) > INT32_MAX
    return PointwisePlan(shape, plan_strides, tuple(tuple(d[2]) for d in dims), index64)


def needs_index64(*arrays) -> bool:
    """Whether a kernel walking these views needs 64-bit offsets: an element count or a byte
    span (from the lowest to the highest element address) passes ``INT32_MAX``."""
    for a in arrays:
        span = sum((n - 1) * abs(s) for n, s in zip(a.shape, a.strides)) + a.dtype.itemsize
        if a.size > INT32_MAX or (a.size and span > INT32_MAX):
            return True
    return False
