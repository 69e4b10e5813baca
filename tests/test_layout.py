"""chunkernels.layout on NumPy views: the layouts Dask hands a kernel, described without copies."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from chunkernels.layout import (
    INT32_MAX,
    LayoutError,
    element_strides,
    empty_like,
    is_dense,
    lowest_pointer,
    memory_order,
    plan_pointwise,
    pointer,
)


def aligned_empty(shape, dtype, align=64):
    """An uninitialised C-contiguous array whose data pointer is a multiple of ``align`` bytes
    (NumPy only promises 16)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


C = np.zeros((3, 4, 5), dtype="float32")


# -- memory_order ---------------------------------------------------------------------------------


@pytest.mark.parametrize("a, order", [
    (C, (0, 1, 2)),
    (np.asfortranarray(C), (2, 1, 0)),
    (C.transpose(1, 2, 0), (2, 0, 1)),
    (C[::-1, :, ::-1], (0, 1, 2)),  # negative strides order by magnitude
    (np.broadcast_to(np.zeros(5), (3, 5)), (0, 1)),  # broadcast axes first
    (np.broadcast_to(np.zeros((3, 1)), (3, 5)), (1, 0)),
    (np.broadcast_to(np.zeros(()), (2, 3)), (0, 1)),  # all zero: ties keep C order
    (C[:, :1, :], (0, 1, 2)),
    (np.zeros(()), ()),
], ids=["C", "F", "transposed", "negative", "zero-inner", "zero-outer", "all-zero", "size-1",
        "0-d"])
def test_memory_order(a, order):
    assert memory_order(a.shape, a.strides) == order


# -- empty_like -----------------------------------------------------------------------------------


@pytest.mark.parametrize("a", [C, np.asfortranarray(C), C.transpose(2, 0, 1), C[::-1, ::2],
                               np.broadcast_to(np.zeros(5, "float32"), (3, 5)), np.zeros(())],
                         ids=["C", "F", "transposed", "negative-stepped", "broadcast", "0-d"])
def test_empty_like_follows_the_input_order(a):
    out = empty_like(np, a)
    assert out.shape == a.shape and out.dtype == a.dtype
    assert all(s > 0 for s in out.strides)
    dense = out.transpose(memory_order(a.shape, a.strides))
    assert dense.flags.c_contiguous  # contiguous when walked in the input's memory order
    if a.ndim and all(a.strides):
        assert memory_order(out.shape, out.strides) == memory_order(a.shape, a.strides)


def test_empty_like_fortran_in_fortran_out_and_dtype():
    f = np.asfortranarray(np.zeros((4, 6), "int32"))
    out = empty_like(np, f, dtype="float64")
    assert out.flags.f_contiguous and not out.flags.c_contiguous
    assert out.dtype == np.float64 and out.shape == (4, 6)
    assert empty_like(np, np.zeros((4, 6))).flags.c_contiguous


# -- element_strides ------------------------------------------------------------------------------


def test_element_strides():
    assert element_strides(C) == (20, 5, 1)
    assert element_strides(C[::-1, :, ::2]) == (-20, 5, 2)
    assert element_strides(np.broadcast_to(np.zeros(5), (3, 5))) == (0, 1)
    assert element_strides(np.zeros(())) == ()


def test_element_strides_rejects_partial_elements():
    field = np.zeros(4, dtype=[("a", "f8"), ("b", "i4")])["a"]  # 12-byte records, 8-byte items
    with pytest.raises(LayoutError, match=r"stride 12 bytes of a float64 view \(strides "
                                          r"\(12,\)\) is not a whole number of 8-byte elements; "
                                          r"copy it first \(xp\.ascontiguousarray\)"):
        element_strides(field)


# -- plan_pointwise -------------------------------------------------------------------------------


def test_contiguous_collapses_to_one_dim():
    out = empty_like(np, C)
    plan = plan_pointwise(out, C)
    assert plan.shape == (60,) and plan.ndim == 1
    assert plan.strides == ((1,), (1,))
    assert plan.axes == ((0, 1, 2),)
    assert not plan.index64


def test_fortran_collapses_in_memory_order():
    f = np.asfortranarray(C)
    plan = plan_pointwise(empty_like(np, f), f)
    assert plan.shape == (60,) and plan.axes == ((2, 1, 0),) and plan.strides == ((1,), (1,))


def test_sliced_view_keeps_two_dims():
    x = np.zeros((5, 20), "float32")[:, 2:10]
    plan = plan_pointwise(empty_like(np, x), x)
    assert plan.shape == (5, 8)
    assert plan.strides == ((8, 1), (20, 1))
    assert plan.axes == ((0,), (1,))


def test_transposed_view_is_walked_in_memory_order():
    x = C.transpose(1, 2, 0)  # shape (4, 5, 3): memory order is axis 2, 0, 1
    out = empty_like(np, x)
    plan = plan_pointwise(out, x)
    assert plan.shape == (60,) and plan.axes == ((2, 0, 1),) and plan.strides == ((1,), (1,))
    # a C-ordered output is walked in its own order: only its axes 0 and 1 merge for x too
    plan = plan_pointwise(np.empty(x.shape, x.dtype), x)
    assert plan.shape == (20, 3) and plan.axes == ((0, 1), (2,))
    assert plan.strides == ((3, 1), (1, 20))


def test_negative_strides_are_kept():
    a = np.zeros((4, 5))
    plan = plan_pointwise(np.empty((4, 5)), a[::-1])
    assert plan.shape == (4, 5) and plan.strides == ((5, 1), (-5, 1))
    plan = plan_pointwise(np.empty((4, 5)), a[::-1, ::-1])  # fully reversed still collapses
    assert plan.shape == (20,) and plan.strides == ((1,), (-1,))
    plan = plan_pointwise(np.empty(7), np.zeros(14)[::-2])
    assert plan.shape == (7,) and plan.strides == ((1,), (-2,))


def test_broadcast_zero_strides():
    row = np.broadcast_to(np.arange(5.0), (4, 5))
    plan = plan_pointwise(np.empty((4, 5)), row)
    assert plan.shape == (4, 5) and plan.strides == ((5, 1), (0, 1))
    scalar = np.broadcast_to(np.float64(1), (4, 5))
    plan = plan_pointwise(np.empty((4, 5)), scalar)
    assert plan.shape == (20,) and plan.strides == ((1,), (0,))
    column = np.broadcast_to(np.arange(4.0)[:, None], (4, 5))
    plan = plan_pointwise(np.empty((4, 5)), column)
    assert plan.shape == (4, 5) and plan.strides == ((5, 1), (1, 0))


def test_size_one_axes_are_dropped():
    a = np.zeros((3, 1, 4, 1))
    plan = plan_pointwise(empty_like(np, a), a)
    assert plan.shape == (12,) and plan.axes == ((0, 2),)
    single = np.zeros((1, 1))
    plan = plan_pointwise(single, single)
    assert plan.shape == () and plan.strides == ((), ()) and plan.axes == ()
    assert plan.vector_width((single, single)) == 1
    zero_d = np.zeros(())
    assert plan_pointwise(zero_d).shape == ()


def test_shapes_must_match():
    with pytest.raises(ValueError, match=r"plan_pointwise needs same-shape arrays; got \(5,\) "
                                         r"and \(4, 5\) \(broadcast inputs to the output's shape "
                                         r"first\)"):
        plan_pointwise(np.empty((4, 5)), np.zeros(5))


def test_index64_when_the_element_count_passes_int32():
    huge = np.broadcast_to(np.zeros(1, "float32"), (2**16, 2**16))  # 2**32 elements, one in memory
    plan = plan_pointwise(huge)
    assert plan.shape == (2**32,) and plan.strides == ((0,),)
    assert plan.index64
    fits = plan_pointwise(np.broadcast_to(np.zeros(1, "float32"), (2**15, 2**16 - 1)))
    assert fits.shape == (INT32_MAX - 2**15 + 1,) and not fits.index64


@pytest.mark.parametrize("stride, index64", [(INT32_MAX + 1, True), (2**31 - 8, False)])
def test_index64_when_the_byte_span_passes_int32(stride, index64):
    # two float32 elements `stride` bytes apart: a span of stride + 4 bytes (nothing is read)
    x = as_strided(np.zeros(2, "float32"), shape=(2,), strides=(stride,))
    plan = plan_pointwise(np.empty(2, "float32"), x)
    assert plan.strides == ((1,), (stride // 4,))
    assert plan.index64 is index64


def test_vector_width_aligned_contiguous():
    out, x = aligned_empty((4, 8), "float32"), aligned_empty((4, 8), "float32")
    plan = plan_pointwise(out, x)
    assert plan.vector_width((out, x)) == 4  # 16 bytes of float32
    out64, x64 = aligned_empty((4, 8), "float64"), aligned_empty((4, 8), "float64")
    assert plan_pointwise(out64, x64).vector_width((out64, x64)) == 2
    # the widest dtype sets the width
    mixed = aligned_empty((4, 8), "float64")
    assert plan_pointwise(out, x, mixed).vector_width((out, x, mixed)) == 2


def test_vector_width_odd_inner_extent():
    base = aligned_empty((4, 8), "float32")
    x = base[:, :7]
    out = aligned_empty((4, 7), "float32")
    plan = plan_pointwise(out, x)
    assert plan.shape == (4, 7)
    assert plan.vector_width((out, x)) == 1
    odd = aligned_empty((7,), "float32")
    assert plan_pointwise(odd).vector_width((odd,)) == 1


def test_vector_width_misaligned_offset():
    base = aligned_empty((36,), "float32")
    out = aligned_empty((32,), "float32")
    assert plan_pointwise(out, base[:32]).vector_width((out, base[:32])) == 4
    assert plan_pointwise(out, base[1:33]).vector_width((out, base[1:33])) == 1  # 4-byte offset
    assert plan_pointwise(out, base[2:34]).vector_width((out, base[2:34])) == 2  # 8-byte aligned


def test_vector_width_outer_strides_must_keep_alignment():
    base = aligned_empty((4, 10), "float32")
    x = base[:, :8]  # rows 40 bytes apart: the second row starts misaligned for 16-byte vectors
    out = aligned_empty((4, 8), "float32")
    assert plan_pointwise(out, x).vector_width((out, x)) == 2


def test_vector_width_broadcast_operand():
    out, x = aligned_empty((4, 8), "float32"), aligned_empty((4, 8), "float32")
    column = np.broadcast_to(aligned_empty((4, 1), "float32"), (4, 8))  # inner stride 0
    plan = plan_pointwise(out, x, column)
    assert plan.strides[2] == (1, 0)
    assert plan.vector_width((out, x, column)) == 1
    assert plan.vector_width((out, x, column), broadcast_ok=(2,)) == 4
    strided = aligned_empty((4, 16), "float32")[:, ::2]  # inner stride 2: never vectorised
    plan = plan_pointwise(out, strided)
    assert plan.vector_width((out, strided), broadcast_ok=(1,)) == 1


@pytest.mark.parametrize("view, dense", [
    (lambda a: a, True),                      # C order
    (lambda a: a.T, True),                    # Fortran order
    (lambda a: a[::-1, ::-1], True),          # reversed: the same memory, read backwards
    (lambda a: a[:, ::-1], False),            # no gap, but rows run backwards, the block
                                              # forwards: not one run (read as a walk)
    (lambda a: a[1:2, 3:4], True),            # one element
    (lambda a: a[1:3], True),                 # whole rows
    (lambda a: a[:, 1:3], False),             # a gap after each row's piece
    (lambda a: a[::2], False),
])
def test_a_dense_view_and_its_lowest_address(view, dense):
    base = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    a = view(base)
    assert is_dense(a) is dense
    # the lowest element address: the smallest of every element's
    addresses = [pointer(base) + base.itemsize * int(v) for v in a.ravel()]
    assert lowest_pointer(a) == min(addresses)
