"""``apply``, ``blockwise`` and ``run_block`` on the CPU path: NumPy arrays and Dask arrays of NumPy
chunks, with the built-in ``broadcast_add`` and the user kernels of conftest (``scaled_subtract``,
pointwise; ``moving_sum``, with a halo). The GPU dispatch logic (refusal, fallback, strict,
contiguous copies) is checked with a stand-in CuPy module; the real one in the ``gpu`` tests."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
import sys
import types

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import MODES, MOVING_SUM, moving_sum_reference, random_array
from dask.base import tokenize

import chunkernels
from chunkernels import (
    AlignmentError,
    CPUFallbackWarning,
    HaloError,
    KernelResultError,
    KernelSpec,
    UnknownKernelError,
    UnsupportedBlockError,
    run_block,
)
from chunkernels._registry import _ORIGIN
from chunkernels.testing import assert_close

# -- NumPy and Dask inputs ------------------------------------------------------------------------


def test_numpy_in_numpy_out():
    x = np.arange(12.0).reshape(3, 4)
    got = chunkernels.apply(x, "broadcast_add", np.arange(4.0))
    assert type(got) is np.ndarray
    assert_close(got, x + np.arange(4.0))


def test_dask_in_lazy_dask_out():
    x = da.from_array(np.arange(24, dtype="float32").reshape(4, 6), chunks=(3, 4))
    z = chunkernels.apply(x, "broadcast_add", np.arange(6, dtype="float32"))
    assert isinstance(z, da.Array)
    assert type(z._meta) is np.ndarray and z._meta.dtype == np.float32 and z._meta.ndim == 2
    assert z.dtype == np.float32 and z.shape == x.shape and z.chunks == x.chunks
    assert_close(z.compute(), x.compute() + np.arange(6, dtype="float32"))


def test_dask_apply_builds_a_graph_without_computing():
    calls = []

    def counting(x):
        calls.append(x.shape)
        return x.copy()

    chunkernels.register(name="counting", cpu=counting)
    x = da.ones((6, 4), chunks=(2, 4))
    z = chunkernels.apply(x, "counting")
    assert calls == []  # meta is given, so Dask never calls the kernel to infer it
    z.compute()
    assert sorted(calls) == [(2, 4)] * 3


@pytest.mark.parametrize("dx, dy, expected", [
    ("int32", "int64", "int64"),
    ("int64", "float64", "float64"),
    ("float32", "float64", "float64"),
    ("int32", "float32", "float64"),
    ("float32", "float32", "float32"),
])
def test_result_dtype_is_numpy_promotion(dx, dy, expected):
    rng = np.random.default_rng(0)
    x, y = random_array(rng, (5, 6), dx), random_array(rng, (6,), dy)
    assert np.result_type(dx, dy) == expected
    assert chunkernels.apply(x, "broadcast_add", y).dtype == expected
    z = chunkernels.apply(da.from_array(x, chunks=(2, 4)), "broadcast_add",
                          da.from_array(y, chunks=4))
    assert z.dtype == expected and z._meta.dtype == expected
    assert_close(z.compute(), x + y)


@pytest.mark.parametrize("dtype, scalar", [
    ("int32", 2.5), ("float32", 2.0), ("int32", 2), ("float32", 3), ("int64", True),
    ("float32", np.float64(2.0)),  # a NumPy scalar is not weak: float64, as in NumPy 2
])
def test_scalar_operand_follows_numpy_promotion(dtype, scalar):
    x = np.arange(6, dtype=dtype).reshape(2, 3)
    expected = x + scalar
    assert_close(chunkernels.apply(x, "broadcast_add", scalar), expected)
    z = chunkernels.apply(da.from_array(x, chunks=(1, 2)), "broadcast_add", scalar)
    assert z.dtype == expected.dtype
    assert_close(z.compute(), expected)


def test_python_int_out_of_range_fails_as_in_numpy():
    x = np.ones(3, dtype="int32")
    with pytest.raises(OverflowError) as numpy_error:
        x + 2**40
    with pytest.raises(OverflowError, match=re.escape(str(numpy_error.value))):
        chunkernels.apply(x, "broadcast_add", 2**40)


def test_operand_count_is_checked():
    x = np.ones((2, 3))
    with pytest.raises(TypeError, match=r"broadcast_add takes 1 array operand\(s\) after x "
                                        r"\(other\); got 0"):
        chunkernels.apply(x, "broadcast_add")
    with pytest.raises(TypeError, match=r"got 2"):
        chunkernels.apply(x, "broadcast_add", x, x)
    chunkernels.register(name="negate", cpu=np.negative)
    with pytest.raises(TypeError,
                       match=r"negate takes 0 array operand\(s\) after x \(none\); got 1"):
        chunkernels.apply(x, "negate", x)


def test_unknown_kernel_in_apply():
    with pytest.raises(UnknownKernelError, match="did you mean 'broadcast_add'"):
        chunkernels.apply(np.ones(3), "broadcast_ad", 1.0)


@pytest.mark.parametrize("x, kind", [([1.0, 2.0], "builtins.list"), (3.0, "builtins.float"),
                                     (np.float64(3.0), "numpy.float64")])
def test_non_array_x_is_rejected(x, kind):
    with pytest.raises(TypeError, match=rf"apply takes a dask\.array\.Array, numpy\.ndarray or "
                                        rf"cupy\.ndarray; got {re.escape(kind)} \(convert it with "
                                        rf"np\.asarray"):
        chunkernels.apply(x, "broadcast_add", 1.0)


@pytest.mark.parametrize("x_shape, op_shape", [((4, 6), (5,)), ((4, 6), (4,)), ((6,), (2, 6)),
                                               ((4, 1), (4, 3)), ((), (1,))])
def test_operand_that_does_not_broadcast(x_shape, op_shape):
    x, op = np.ones(x_shape), np.ones(op_shape)
    message = (rf"broadcast_add: operand 'other' has shape {re.escape(str(op_shape))}; it needs a "
               rf"shape that broadcasts to x's shape {re.escape(str(x_shape))} without changing it")
    with pytest.raises(AlignmentError, match=message):
        chunkernels.apply(x, "broadcast_add", op)
    with pytest.raises(AlignmentError, match=message):
        chunkernels.apply(da.from_array(x), "broadcast_add", op)
    with pytest.raises(AlignmentError, match=message):
        chunkernels.apply(da.from_array(x), "broadcast_add", da.from_array(op))


def test_same_alignment_needs_equal_shapes():
    chunkernels.register(name="same_add", cpu=np.add, operands=("y",), alignment="same")
    with pytest.raises(AlignmentError, match=r"same_add: operand 'y' has shape \(6,\); it needs "
                                             r"x's shape \(4, 6\)"):
        chunkernels.apply(np.ones((4, 6)), "same_add", np.ones(6))
    got = chunkernels.apply(np.ones((4, 6)), "same_add", np.ones((4, 6)))
    assert_close(got, np.full((4, 6), 2.0))


def test_misaligned_dask_operand_error_names_axes_and_fix():
    x = da.ones((4, 6), chunks=(2, 3))
    y = da.arange(6.0, chunks=2)
    with pytest.raises(AlignmentError) as info:
        chunkernels.apply(x, "broadcast_add", y)
    message = str(info.value)
    assert "operand 'other' is chunked (2, 2, 2) along its axis 0" in message
    assert "x's axis 1, chunked (3, 3)" in message
    assert "other = other.rechunk({0: (3, 3)})" in message
    assert message.endswith("or pass align=True")


def test_align_true_rechunks_operands():
    rng = np.random.default_rng(1)
    x_np, y_np = random_array(rng, (5, 4, 6), "float64"), random_array(rng, (4, 6), "int32")
    x = da.from_array(x_np, chunks=(2, 3, 4))
    y = da.from_array(y_np, chunks=(1, 5))
    z = chunkernels.apply(x, "broadcast_add", y, align=True)
    assert z.chunks == x.chunks
    assert_close(z.compute(), x_np + y_np)


@pytest.mark.parametrize("op_shape", [(6,), (1, 6), (4, 1), (4, 6), (), (1, 1)])
def test_numpy_operand_with_dask_x(op_shape):
    rng = np.random.default_rng(2)
    x_np, y = random_array(rng, (4, 6), "float32"), random_array(rng, op_shape, "float32")
    z = chunkernels.apply(da.from_array(x_np, chunks=(3, 4)), "broadcast_add", y)
    assert z.chunks == ((3, 1), (4, 2))
    assert_close(z.compute(), x_np + y)


def test_dask_operand_with_size_one_axes():
    rng = np.random.default_rng(3)
    x_np, y_np = random_array(rng, (4, 6), "int64"), random_array(rng, (4, 1), "int64")
    z = chunkernels.apply(da.from_array(x_np, chunks=(3, 2)), "broadcast_add",
                          da.from_array(y_np, chunks=(3, 1)))
    assert_close(z.compute(), x_np + y_np)


def test_numpy_x_with_dask_operand():
    x, y = np.ones((2, 3)), da.arange(3.0, chunks=2)
    got = chunkernels.apply(x, "broadcast_add", y)
    assert type(got) is np.ndarray
    assert_close(got, x + np.arange(3.0))


@pytest.mark.parametrize("x_shape, op_shape", [((0, 6), (6,)), ((4, 0), (0,)), ((4, 0), (1,)),
                                               ((0,), ()), ((1, 6, 1), (6, 1)), ((1, 1), (1,))])
def test_empty_and_size_one_axes(x_shape, op_shape):
    x, y = np.ones(x_shape, "int32"), np.full(op_shape, 2, "float32")
    expected = x + y
    assert_close(chunkernels.apply(x, "broadcast_add", y), expected)
    z = chunkernels.apply(da.from_array(x, chunks=2), "broadcast_add", y)
    assert z.dtype == expected.dtype and z.shape == expected.shape
    assert_close(z.compute(), expected)


def test_zero_dimensional_x():
    x, y = np.array(3, "int32"), np.array(2.5)
    # NumPy's own ufuncs give a NumPy scalar for 0-d inputs; apply returns what the reference does
    assert_close(chunkernels.apply(x, "broadcast_add", y), x + y)
    z = chunkernels.apply(da.from_array(x), "broadcast_add", y)
    assert z.shape == () and z.dtype == np.float64
    assert_close(z.compute(), x + y)


# -- user kernels: pointwise ----------------------------------------------------------------------


def test_user_pointwise_kernel_end_to_end(scaled_subtract):
    assert "scaled_subtract" in chunkernels.registered()
    rng = np.random.default_rng(4)
    x_np, y = random_array(rng, (7, 5), "int32"), random_array(rng, (5,), "int64")
    expected = (x_np.astype("int64") - y) * 3
    assert_close(chunkernels.apply(x_np, "scaled_subtract", y, scale=3), expected)
    for chunks in [(7, 5), (3, 2), (1, 1), (4, 5)]:
        z = chunkernels.apply(da.from_array(x_np, chunks=chunks), "scaled_subtract", y, scale=3)
        assert z.dtype == np.int64
        assert_close(z.compute(), expected, err_msg=f"chunks {chunks}")


def test_user_kernel_is_registered_again_where_the_task_runs(scaled_subtract):
    """A worker process without the user's registration gets it from the block function (here:
    the block function as a worker unpickles it, into a process without the registration)."""
    import pickle

    f = pickle.loads(pickle.dumps(chunkernels.blockwise("scaled_subtract", scale=2)))
    chunkernels.unregister("scaled_subtract")
    assert_close(f(np.full((2, 2), 5.0), np.ones(2)), np.full((2, 2), 8.0))
    assert chunkernels.get("scaled_subtract") is f.spec
    assert f.spec == scaled_subtract and f.spec is not scaled_subtract
    assert _ORIGIN["scaled_subtract"] == "a task sent by the client"


def test_parameters_are_validated_before_the_graph_is_built(moving_sum):
    x = np.ones((3, 8))
    message = (r"mode='bogus'; expected one of "
               r"\('reflect', 'nearest', 'mirror', 'constant', 'wrap'\)")
    with pytest.raises(ValueError, match=message):
        chunkernels.apply(x, "moving_sum", mode="bogus")
    with pytest.raises(ValueError, match=message):
        chunkernels.apply(da.from_array(x, chunks=4), "moving_sum", mode="bogus")
    with pytest.raises(TypeError, match=r"unexpected parameters \['sigma'\]"):
        chunkernels.apply(da.from_array(x, chunks=4), "moving_sum", sigma=2)


# -- user kernels: halo ---------------------------------------------------------------------------

HALO_CHUNKINGS = [(3, 12), (3, 5), (2, 4), (1, 3), (3, 1), (3, (5, 5, 2)), (3, (2, 9, 1)),
                  (3, (1, 10, 1))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunks", HALO_CHUNKINGS, ids=str)
def test_halo_kernel_matches_reference_for_every_chunking(moving_sum, mode, chunks):
    rng = np.random.default_rng(5)
    x_np = random_array(rng, (3, 12), "float64")
    expected = moving_sum_reference(x_np, mode=mode)
    z = chunkernels.apply(da.from_array(x_np, chunks=chunks), "moving_sum", mode=mode)
    assert z.chunks == da.from_array(x_np, chunks=chunks).chunks
    assert_close(z.compute(), expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("radius, chunks", [(2, (2, 1)), (3, (2, 2)), (3, (1, (5, 2, 2, 3))),
                                            (5, (2, 4)), (11, (3, 5)), (7, (2, 1))], ids=str)
def test_chunks_smaller_than_the_halo_gather_from_several_neighbours(moving_sum, mode, radius,
                                                                     chunks):
    """No rechunk: each block's halo is cut from as many neighbouring chunks as it spans."""
    rng = np.random.default_rng(6)
    x_np = random_array(rng, (3, 12), "int64")
    x = da.from_array(x_np, chunks=chunks)
    z = chunkernels.apply(x, "moving_sum", radius=radius, mode=mode)
    assert z.chunks == x.chunks
    assert not any(name.startswith("rechunk") for name in z.dask.layers)
    assert_close(z.compute(), moving_sum_reference(x_np, radius=radius, mode=mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("radius, chunks", [(12, (3, 5)), (20, (2, 3))], ids=str)
def test_halo_not_smaller_than_the_array_with_allow_rechunk(moving_sum, mode, radius, chunks):
    rng = np.random.default_rng(6)
    x_np = random_array(rng, (3, 12), "int64")
    x = da.from_array(x_np, chunks=chunks)
    with pytest.raises(HaloError):
        chunkernels.apply(x, "moving_sum", radius=radius, mode=mode)
    z = chunkernels.apply(x, "moving_sum", radius=radius, mode=mode, allow_rechunk=True)
    assert z.chunks[1] == (12,)
    assert_close(z.compute(), moving_sum_reference(x_np, radius=radius, mode=mode))


def test_halo_error_when_the_halo_exceeds_the_array(moving_sum):
    x_np = np.arange(12.0).reshape(3, 4)
    x = da.from_array(x_np, chunks=(1, 2))
    with pytest.raises(HaloError) as info:
        chunkernels.apply(x, "moving_sum", radius=5)
    message = str(info.value)
    assert message.startswith(
        "moving_sum: the halo the kernel's parameters need is not smaller than the array along "
        "an axis of several chunks (axis 1: halo 5, chunks (2, 2), array 4); every block would "
        "hold that whole axis. Make it one chunk first, e.g. x = x.rechunk({1: 4}), or pass "
        "allow_rechunk=True")
    assert "axis 0" not in message  # no halo along axis 0, whatever its chunks
    suggestion = re.search(r"x = x\.rechunk\((\{.*\})\), or pass allow_rechunk=True$", message)
    fixed = x.rechunk(ast.literal_eval(suggestion.group(1)))
    assert_close(chunkernels.apply(fixed, "moving_sum", radius=5).compute(),
                 moving_sum_reference(x_np, radius=5))


def test_halo_error_for_unknown_chunk_sizes(moving_sum):
    x = da.arange(10.0, chunks=5)
    x = x[x > 2]
    with pytest.raises(HaloError, match=r"moving_sum: x has unknown chunk sizes along axis 0; call "
                                        r"x\.compute_chunk_sizes\(\) first"):
        chunkernels.apply(x, "moving_sum")
    x.compute_chunk_sizes()
    assert_close(chunkernels.apply(x, "moving_sum").compute(),
                 moving_sum_reference(np.arange(3.0, 10.0)))


def test_halo_with_a_single_chunk_needs_no_overlap(moving_sum):
    x_np = np.arange(12.0).reshape(3, 4)
    z = chunkernels.apply(da.from_array(x_np, chunks=(1, 4)), "moving_sum", radius=6)
    layers = {key[0].rsplit("-", 1)[0] for key in z.dask}
    # map_blocks only: no overlap, no trim (from_array's NumPy blocks sit in the kernel's tasks)
    assert layers - {"array"} == {"moving_sum"}
    assert_close(z.compute(), moving_sum_reference(x_np, radius=6))


def test_halo_kernel_on_numpy_and_1d(moving_sum):
    x_np = np.arange(10, dtype="int32")
    assert_close(chunkernels.apply(x_np, "moving_sum", mode="wrap"),
                 moving_sum_reference(x_np, mode="wrap"))
    z = chunkernels.apply(da.from_array(x_np, chunks=3), "moving_sum", mode="wrap")
    assert z.dtype == np.int32
    assert_close(z.compute(), moving_sum_reference(x_np, mode="wrap"))


@pytest.fixture
def weighted_moving_sum():
    """A halo kernel with an operand: the moving sum of ``x * w``."""

    def reference(x, w, *, radius=1, mode="reflect"):
        return moving_sum_reference(np.multiply(x, w), radius=radius, mode=mode)

    return chunkernels.register(dataclasses.replace(MOVING_SUM, name="weighted_moving_sum",
                                                    cpu=reference, operands=("w",)))


@pytest.mark.parametrize("mode", ["reflect", "wrap"])
def test_halo_kernel_with_operand(weighted_moving_sum, mode):
    rng = np.random.default_rng(7)
    x_np, w_np = random_array(rng, (4, 12), "float64"), random_array(rng, (4, 12), "float64")
    expected = moving_sum_reference(x_np * w_np, radius=2, mode=mode)
    x = da.from_array(x_np, chunks=(3, 4))
    for w in (w_np, da.from_array(w_np, chunks=(3, 4))):
        z = chunkernels.apply(x, "weighted_moving_sum", w, radius=2, mode=mode)
        assert_close(z.compute(), expected)
    # misaligned and too-small chunks: both fixed when allowed
    x_small = da.from_array(x_np, chunks=(3, 1))
    w_other = da.from_array(w_np, chunks=(2, 5))
    z = chunkernels.apply(x_small, "weighted_moving_sum", w_other, radius=2, mode=mode,
                          align=True, allow_rechunk=True)
    assert_close(z.compute(), expected)


def test_halo_kernel_operand_must_have_x_shape(weighted_moving_sum):
    x = da.ones((4, 12), chunks=(2, 4))
    with pytest.raises(AlignmentError, match=r"weighted_moving_sum has a halo, so operand 'w' "
                                             r"must have x's shape \(4, 12\); got \(12,\) "
                                             r"\(broadcast it first: da\.broadcast_to\(w, "
                                             r"x\.shape\)\.rechunk\(x\.chunks\)\)"):
        chunkernels.apply(x, "weighted_moving_sum", np.ones(12))


# -- blockwise ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, boundary", [("reflect", "none"), ("wrap", "periodic"),
                                            ("constant", "none")])
def test_blockwise_with_map_overlap(moving_sum, mode, boundary):
    rng = np.random.default_rng(8)
    x_np = random_array(rng, (5, 16), "float32")
    x = da.from_array(x_np, chunks=(2, 5))
    f = chunkernels.blockwise("moving_sum", radius=2, mode=mode)
    assert f.depth(2) == {0: 0, 1: 2}
    assert f.depth(3) == {0: 0, 1: 0, 2: 2}
    assert f.boundary == boundary
    kwargs = f.kwargs(x)
    assert set(kwargs) == {"dtype", "meta", "depth", "boundary"}
    assert kwargs["dtype"] == np.float32 and type(kwargs["meta"]) is np.ndarray
    assert kwargs["depth"] == {0: 0, 1: 2} and kwargs["boundary"] == boundary
    z = da.map_overlap(f, x, **kwargs)
    assert_close(z.compute(), moving_sum_reference(x_np, radius=2, mode=mode))


def test_blockwise_kwargs_use_validated_parameters(moving_sum):
    """The kernel's validation turns scipy's synonym 'grid-wrap' into 'wrap': Dask's boundary
    must follow the validated mode, or the halo at the array's edges is wrong."""
    rng = np.random.default_rng(11)
    x_np = random_array(rng, (3, 10), "int64")
    x = da.from_array(x_np, chunks=(3, 4))
    expected = moving_sum_reference(x_np, radius=2, mode="wrap")
    assert_close(chunkernels.apply(x, "moving_sum", radius=2, mode="grid-wrap").compute(), expected)
    f = chunkernels.blockwise("moving_sum", radius=2, mode="grid-wrap")
    kwargs = f.kwargs(x)
    assert kwargs["boundary"] == "periodic"
    assert_close(da.map_overlap(f, x, **kwargs).compute(), expected)


def test_blockwise_kwargs_dtype_uses_validated_parameters():
    """A result dtype that depends on a parameter whose default the validation supplies."""

    def validate(ndim, precision="float32"):
        return {"precision": np.dtype(precision).name}

    chunkernels.register(name="to_float", cpu=lambda x, precision: x.astype(precision),
                         validate=validate,
                         result_dtype=lambda x_dtype, precision: np.dtype(precision))
    x = da.from_array(np.arange(6, dtype="int32"), chunks=4)
    assert chunkernels.apply(x, "to_float").dtype == np.float32
    f = chunkernels.blockwise("to_float")
    kwargs = f.kwargs(x)
    assert kwargs["dtype"] == np.float32 and kwargs["meta"].dtype == np.float32
    z = da.map_blocks(f, x, **kwargs)
    assert_close(z.compute(), np.arange(6, dtype="float32"))
    assert chunkernels.blockwise("to_float", precision="f8").kwargs(x)["dtype"] == np.float64


def test_blockwise_with_map_blocks():
    rng = np.random.default_rng(9)
    x_np, y_np = random_array(rng, (6, 8), "int32"), random_array(rng, (8,), "float64")
    x, y = da.from_array(x_np, chunks=(4, 3)), da.from_array(y_np, chunks=3)
    f = chunkernels.blockwise("broadcast_add")
    kwargs = f.kwargs(x, y)
    assert set(kwargs) == {"dtype", "meta"}
    assert kwargs["dtype"] == np.float64 and kwargs["meta"].dtype == np.float64
    assert f.dtype(np.int32, np.float64) == np.float64
    z = da.map_blocks(f, x, y, **kwargs)
    assert_close(z.compute(), x_np + y_np)


def test_blockwise_repr_and_unknown_kernel(moving_sum):
    assert repr(chunkernels.blockwise("moving_sum", mode="wrap", radius=2)) == (
        "blockwise('moving_sum', mode='wrap', radius=2)")
    assert repr(chunkernels.blockwise("broadcast_add")) == "blockwise('broadcast_add')"
    with pytest.raises(UnknownKernelError, match="no kernel named 'moving_summ'; did you mean "
                                                 "'moving_sum'"):
        chunkernels.blockwise("moving_summ")
    # a misspelt parameter is refused when the block function is made, not on its first block
    with pytest.raises(TypeError, match=r"gaussian_filter got unknown parameter 'sigmaa' \(did "
                                        r"you mean 'sigma'\?\)"):
        chunkernels.blockwise("gaussian_filter", sigmaa=2)


def test_blockwise_validates_parameters_per_ndim(moving_sum):
    f = chunkernels.blockwise("moving_sum", mode="bogus")
    with pytest.raises(ValueError, match="mode='bogus'"):
        f.depth(2)
    assert chunkernels.blockwise("moving_sum").params(2) == {"radius": 1, "mode": "reflect"}


def test_block_function_tokenizes_deterministically(moving_sum):
    make = chunkernels.blockwise
    assert tokenize(make("moving_sum", mode="wrap")) == tokenize(make("moving_sum", mode="wrap"))
    assert tokenize(make("moving_sum", mode="wrap", radius=2)) == tokenize(
        make("moving_sum", radius=2, mode="wrap"))
    distinct = [make("moving_sum", mode="wrap"), make("moving_sum", mode="reflect"),
                make("moving_sum", mode="wrap", strict=True), make("moving_sum"),
                make("broadcast_add")]
    assert len({tokenize(f) for f in distinct}) == len(distinct)


def test_apply_graph_names_are_deterministic(moving_sum):
    x = da.from_array(np.arange(24.0).reshape(4, 6), chunks=(2, 3))
    names = {mode: chunkernels.apply(x, "moving_sum", mode=mode).name
             for mode in ("wrap", "reflect")}
    assert chunkernels.apply(x, "moving_sum", mode="wrap").name == names["wrap"]
    assert names["wrap"] != names["reflect"]
    add = [chunkernels.apply(x, "broadcast_add", y).name for y in (1.0, 1.0, 2.0)]
    assert add[0] == add[1] != add[2]


def test_results_survive_dask_optimisation_and_persist(moving_sum):
    x_np = np.arange(40.0).reshape(4, 10)
    z = chunkernels.apply(da.from_array(x_np, chunks=(2, 3)), "moving_sum", mode="wrap")
    (persisted,) = dask.persist(z, scheduler="sync")
    assert_close(persisted.compute(), moving_sum_reference(x_np, mode="wrap"))


# -- run_block ------------------------------------------------------------------------------------


def test_run_block_on_empty_block_returns_empty_result_dtype():
    spec = chunkernels.get("broadcast_add")
    for shape in [(0, 3), (3, 0), (0,)]:
        out = run_block(spec, np.empty(shape, "int32"), (np.empty(shape[-1:], "float64"),))
        assert type(out) is np.ndarray and out.shape == shape and out.dtype == np.float64


def test_run_block_passes_parameters_to_the_reference(scaled_subtract):
    out = run_block(scaled_subtract, np.full(3, 5.0), (np.ones(3),), {"scale": 4})
    assert_close(out, np.full(3, 16.0))


class _FakeDeviceArray(np.ndarray):
    """A NumPy array that chunkernels takes for a CuPy array (see ``fake_cupy``)."""

    @property
    def device(self):
        return contextlib.nullcontext()


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in ``cupy`` module whose arrays are NumPy arrays, to drive the GPU branch of
    ``run_block`` (acceptance, fallback, strict, contiguous copies) on a machine without a GPU."""
    module = types.ModuleType("cupy")
    module.ndarray = _FakeDeviceArray
    module.asarray = lambda a, dtype=None: np.asarray(a, dtype=dtype).view(_FakeDeviceArray)
    module.asnumpy = np.asarray
    module.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(_FakeDeviceArray)
    module.empty = lambda shape, dtype: np.empty(shape, dtype).view(_FakeDeviceArray)
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


@pytest.fixture
def gpu_spec():
    """A kernel whose "GPU path" records the layouts it is given; it refuses odd row lengths."""
    seen = {"gpu": [], "cpu": []}

    def gpu(x, other):
        seen["gpu"].append((type(x), type(other), x.flags.c_contiguous))
        return np.subtract(x, other).view(_FakeDeviceArray)

    def cpu(x, other):
        seen["cpu"].append((type(x), type(other)))
        return np.subtract(x, other)

    spec = KernelSpec(name="fake_sub", cpu=cpu, gpu=gpu, operands=("other",), ndim=(1, 2),
                      supports=lambda x, other: (x.shape[-1] % 2 == 0, "rows of odd length"))
    return spec, seen


def test_gpu_block_goes_to_the_gpu_path(fake_cupy, gpu_spec):
    spec, seen = gpu_spec
    x = fake_cupy.asarray(np.arange(8.0).reshape(2, 4))
    out = run_block(spec, x, (np.ones(4),), strict=True)  # a host operand is moved to the device
    assert type(out) is _FakeDeviceArray
    assert_close(np.asarray(out), np.arange(8.0).reshape(2, 4) - 1)
    assert seen == {"gpu": [(_FakeDeviceArray, _FakeDeviceArray, True)], "cpu": []}


def test_gpu_path_gets_views_as_they_are_unless_contiguous(fake_cupy, gpu_spec):
    spec, seen = gpu_spec
    x = fake_cupy.asarray(np.arange(8.0).reshape(2, 4)).T.T[:, ::-2]
    run_block(spec, x, (np.ones(2),))
    assert seen["gpu"][-1][2] is False
    run_block(dataclasses.replace(spec, contiguous=True), x, (np.ones(2),))
    assert seen["gpu"][-1][2] is True


@pytest.mark.parametrize("x, reason", [
    (np.ones((2, 4), "float16"), "x has dtype float16; the GPU path takes float32, float64"),
    (np.ones((2, 2, 4)), r"x has ndim=3; the GPU path takes 1\.\.2"),
    (np.ones((2, 3)), "rows of odd length"),
])
def test_refused_gpu_block_falls_back_or_raises_under_strict(fake_cupy, gpu_spec, x, reason):
    spec, seen = gpu_spec
    block, other = fake_cupy.asarray(x), np.ones(x.shape[-1], x.dtype)
    shape = re.escape(str(x.shape))
    with pytest.warns(CPUFallbackWarning, match=rf"fake_sub: {reason}; computing this block of "
                                                rf"shape {shape} with the CPU reference"):
        out = run_block(spec, block, (other,))
    assert type(out) is _FakeDeviceArray  # back on the device
    assert_close(np.asarray(out), x - other)
    assert seen == {"gpu": [], "cpu": [(np.ndarray, np.ndarray)]}  # the reference gets host arrays
    with pytest.raises(UnsupportedBlockError, match=rf"fake_sub: the GPU path refuses this block "
                                                    rf"of shape {shape}: {reason}\. "
                                                    rf".*strict=False"):
        run_block(spec, block, (other,), strict=True)


def test_cpu_only_kernel_on_a_gpu_block(fake_cupy, scaled_subtract):
    x = fake_cupy.asarray(np.full((2, 2), 3.0))
    with pytest.warns(CPUFallbackWarning, match="scaled_subtract has no GPU implementation"):
        out = chunkernels.apply(x, "scaled_subtract", np.ones(2), scale=2)
    assert type(out) is _FakeDeviceArray
    assert_close(np.asarray(out), np.full((2, 2), 4.0))
    with pytest.raises(UnsupportedBlockError, match="scaled_subtract has no GPU implementation"):
        chunkernels.apply(x, "scaled_subtract", np.ones(2), strict=True)


def test_empty_gpu_block_launches_nothing(fake_cupy, gpu_spec):
    spec, seen = gpu_spec
    out = run_block(spec, fake_cupy.asarray(np.ones((0, 4), "float16")), (np.ones(4),), strict=True)
    assert type(out) is _FakeDeviceArray and out.shape == (0, 4) and out.dtype == np.float64
    assert seen == {"gpu": [], "cpu": []}


@pytest.mark.gpu
def test_user_kernel_on_cupy_blocks(scaled_subtract):
    """The real thing: CuPy chunks of a CPU-only user kernel fall back per block, warning."""
    import cupy as cp

    rng = np.random.default_rng(10)
    x_np, y_np = random_array(rng, (6, 8), "float32"), random_array(rng, (8,), "float32")
    x = da.from_array(cp.asarray(x_np), chunks=(4, 3), asarray=False)
    z = chunkernels.apply(x, "scaled_subtract", cp.asarray(y_np), scale=2)
    assert type(z._meta) is cp.ndarray
    with pytest.warns(CPUFallbackWarning, match="no GPU implementation"):
        got = z.compute(scheduler="sync")
    assert type(got) is cp.ndarray
    assert_close(got, (x_np - y_np) * 2)


# -- every block's result is checked against the spec ---------------------------------------------


def _crop_to_int8(x):
    """Issue #20's misbehaving reference: 3 rows of int8, whatever it is given."""
    return x[:3].astype(np.int8)


CROPPING = KernelSpec(name="cropping", cpu=_crop_to_int8, dtypes=("float64",))


def test_a_result_of_another_shape_and_dtype_than_declared_raises_naming_both():
    """Issue #20: the Dask result was declared (20, 24) float64 and computed to (3, 24) int8."""
    chunkernels.register(CROPPING)
    x = np.zeros((20, 24))
    z = chunkernels.apply(da.from_array(x, chunks=(10, 24)), "cropping")
    assert (z.shape, z.dtype) == ((20, 24), np.float64)  # what the spec declares
    message = (r"^kernel 'cropping': its CPU reference returned shape \(3, 24\) int8 for a block "
               r"of shape \(10, 24\) float64, where the kernel's spec declares shape \(10, 24\) "
               r"float64 \(the Dask array is built with what the spec declares, so its chunks "
               r"would not match it\)\. Make the CPU reference return that, or declare what it "
               r"returns: KernelSpec\(result_dtype=\.\.\., result_shape=\.\.\.\)")
    with pytest.raises(KernelResultError, match=message + r"\nchunkernels: raised by kernel "
                                                          r"'cropping' on block \([01], 0\)$"):
        z.compute(scheduler="sync")
    with pytest.raises(KernelResultError, match=message.replace("10, 24", "20, 24") + "$"):
        chunkernels.apply(x, "cropping")  # NumPy in, NumPy out: checked the same
    assert issubclass(KernelResultError, chunkernels.KernelSpecError)


@pytest.mark.parametrize("fields, got", [
    ({"cpu": lambda x: x.astype(np.float32)}, r"shape \(4, 6\) float32"),        # dtype only
    ({"cpu": lambda x: x[:, :5]}, r"shape \(4, 5\) float64"),                      # shape only
    ({"cpu": lambda x: x, "result_dtype": lambda x_dtype: np.dtype(np.int32)},   # the spec lies
     r"shape \(4, 6\) float64"),
    ({"cpu": lambda x: x, "result_shape": lambda shape: (shape[0], shape[1] + 2)},
     r"shape \(4, 6\) float64"),
])
def test_each_mismatch_is_caught_on_every_block(fields, got):
    spec = KernelSpec(name="liar", **fields)
    with pytest.raises(KernelResultError, match=rf"'liar': its CPU reference returned {got} "):
        run_block(spec, np.zeros((4, 6)))
    chunkernels.register(spec)
    with pytest.raises(KernelResultError, match=rf"'liar': its CPU reference returned {got} "):
        chunkernels.apply(da.zeros((8, 6), chunks=(4, 6)), "liar").compute()


def test_a_declared_result_shape_is_the_one_checked():
    """A kernel whose result is not shaped like its block says so with ``result_shape``."""
    spec = KernelSpec(name="trim", cpu=lambda x: x[1:-1],
                      result_shape=lambda shape: (shape[0] - 2, *shape[1:]))
    assert run_block(spec, np.zeros((5, 3))).shape == (3, 3)
    assert spec.out_shape((5, 3)) == (3, 3)
    assert chunkernels.get("zoom").out_shape((4, 4), {"taps": (np.zeros((7, 2)),) * 2}) == (7, 7)
    with pytest.raises(chunkernels.KernelSpecError, match="result_shape must be a function"):
        KernelSpec(name="k", cpu=np.negative, result_shape=(3, 3))


def test_the_gpu_dispatch_and_the_cpu_fallback_are_checked(fake_cupy):
    spec = KernelSpec(name="gpu_liar", cpu=lambda x: x[:1], gpu=lambda x: x.astype(np.float32),
                      ndim=(1, 2), supports=lambda x: (x.shape[-1] % 2 == 0, "odd rows"))
    even, odd = fake_cupy.asarray(np.zeros((2, 4))), fake_cupy.asarray(np.zeros((2, 3)))
    with pytest.raises(KernelResultError, match=r"'gpu_liar': its GPU dispatch returned shape "
                                                r"\(2, 4\) float32 for a block of shape \(2, 4\) "
                                                r"float64, where the kernel's spec declares shape "
                                                r"\(2, 4\) float64"):
        run_block(spec, even)
    with pytest.warns(CPUFallbackWarning), pytest.raises(
            KernelResultError, match=r"'gpu_liar': its CPU reference returned shape \(1, 3\) "):
        run_block(spec, odd)
    tuple_spec = dataclasses.replace(spec, gpu=lambda x: (x, 1))
    with pytest.raises(KernelResultError, match=r"GPU dispatch returned a builtins\.tuple, not "
                                                r"an array for a block"):
        run_block(tuple_spec, even)


def test_reductions_partials_are_not_checked_as_results():
    x = np.arange(12.0).reshape(3, 4)
    got = chunkernels.apply(da.from_array(x, chunks=2), "mean_squared_error", x + 1).compute()
    assert got == pytest.approx(1.0)


def test_the_result_dtype_is_worked_out_once_per_dtype_not_per_block(moving_sum, monkeypatch):
    """The check runs on every block; the dtype it checks against is cached by the block
    function, so a graph of many blocks asks the spec once."""
    calls = []
    spec = dataclasses.replace(MOVING_SUM, result_dtype=lambda *d, **p: calls.append(d) or d[0])
    fn = chunkernels.BlockFunction(spec, {"radius": 1})
    for _ in range(5):
        fn(np.zeros((3, 4)))
    fn(np.zeros((3, 4), np.float32))
    assert calls == [(np.dtype(np.float64),), (np.dtype(np.float32),)]


# -- the graph of a zero-halo kernel --------------------------------------------------------------


def _dependencies(z):
    """What each task of ``z``'s own layer depends on."""
    return {key: set(task.dependencies) for key, task in z.dask.layers[z.name].items()}


@pytest.mark.parametrize("y_shape, y_chunks", [((6,), 3), ((1, 6), (1, 3)), ((4, 6), (2, 3))])
def test_in_memory_blocks_go_into_the_tasks(y_shape, y_chunks):
    rng = np.random.default_rng(0)
    x_np, y_np = rng.random((4, 6)), rng.random(y_shape)
    x, y = dask.persist(da.from_array(x_np, chunks=(2, 3)), da.from_array(y_np, chunks=y_chunks),
                        scheduler="sync")
    z = chunkernels.apply(x, "broadcast_add", y)
    # only the kernel's tasks, none depending on anything: the blocks are in them
    assert set(dict(z.__dask_graph__())) == set(_dependencies(z))
    assert _dependencies(z) == {key: set() for key in dask.core.flatten(z.__dask_keys__())}
    f = chunkernels.blockwise("broadcast_add")
    plain = da.map_blocks(f, x, y, name=z.name, **f.kwargs(x, y))
    assert z.__dask_keys__() == plain.__dask_keys__()
    assert (z.chunks, z.dtype, type(z._meta), z._meta.ndim) == (
        plain.chunks, plain.dtype, type(plain._meta), plain._meta.ndim)
    for scheduler in ("sync", "threads"):
        got = z.compute(scheduler=scheduler)
        np.testing.assert_array_equal(got, plain.compute(scheduler=scheduler))
        np.testing.assert_array_equal(got, x_np + y_np)
    (persisted,) = dask.persist(z, scheduler="threads", chunksize=4)
    np.testing.assert_array_equal(persisted.compute(), x_np + y_np)


def test_lazy_inputs_stay_nodes_of_the_graph():
    rng = np.random.default_rng(1)
    x_np, y_np = rng.random((4, 6)), rng.random(6)
    x = da.from_array(x_np, chunks=(2, 3)) * 2  # lazy: its blocks are tasks still to run
    y = da.from_array(y_np, chunks=3)  # in memory: goes into the tasks
    z = chunkernels.apply(x, "broadcast_add", y)
    assert _dependencies(z) == {
        (z.name, i, j): {(x.name, i, j)} for i in range(2) for j in range(2)}
    # x's graph and the kernel's tasks; y nowhere
    assert {key[0] for key in dict(z.__dask_graph__())} == {z.name} | {
        key[0] for key in dict(x.__dask_graph__())}
    np.testing.assert_array_equal(z.compute(scheduler="threads"), 2 * x_np + y_np)


def test_reduction_over_in_memory_blocks():
    rng = np.random.default_rng(2)
    a_np, b_np = rng.random((6, 5)), rng.random((6, 5))
    a, b = dask.persist(da.from_array(a_np, chunks=(2, 5)), da.from_array(b_np, chunks=(2, 5)),
                        scheduler="sync")
    z = chunkernels.apply(a, "mean_squared_error", b)
    assert all(key[0].startswith("mean_squared_error") for key in dict(z.__dask_graph__()))
    assert_close(z.compute(), np.mean((a_np - b_np) ** 2))


def test_blocks_persisted_on_a_cluster_stay_references():
    """A distributed scheduler's persisted blocks are futures: the tasks keep referring to them."""
    distributed = pytest.importorskip("distributed")
    x_np = np.arange(24.0).reshape(4, 6)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=None):
        x = da.from_array(x_np, chunks=(2, 3)).persist()
        z = chunkernels.apply(x, "broadcast_add", np.arange(6.0))
        assert _dependencies(z)[(z.name, 1, 1)] == {(x.name, 1, 1)}
        np.testing.assert_array_equal(z.compute(), x_np + np.arange(6.0))


def test_run_block_takes_a_kernels_name_and_refuses_what_is_not_a_block():
    x, y = np.ones((2, 3)), np.arange(3.0)
    np.testing.assert_array_equal(chunkernels.run_block("broadcast_add", x, (y,)), x + y)
    with pytest.raises(TypeError, match=r"run_block takes a KernelSpec or a registered kernel's "
                                        r"name; got int 3"):
        chunkernels.run_block(3, x, (y,))
    with pytest.raises(TypeError, match=r"operands must be a tuple of the operand blocks, e\.g\. "
                                        r"\(y,\); got ndarray"):
        chunkernels.run_block("broadcast_add", x, y)  # once iterated row by row
    with pytest.raises(TypeError, match=r"takes a NumPy or CuPy block; got list"):
        chunkernels.run_block("broadcast_add", [[1.0, 2.0, 3.0]], (y,))
