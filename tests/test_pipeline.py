"""``chunkernels.pipeline``: several kernels per chunk, one halo exchange, same results as
applying them one by one."""

from __future__ import annotations

import dataclasses

import dask.array as da
import numpy as np
import pytest
from conftest import MODES, MOVING_SUM, moving_sum_reference, random_array
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_halo import BOX_SUM, box_sum_reference, dask_input

import chunkernels
from chunkernels import HaloError, UnknownKernelError
from chunkernels.testing import assert_close


def _threshold(x, *, level=0):
    return (x > level).astype(np.int32)


THRESHOLD = chunkernels.KernelSpec(
    name="above", cpu=_threshold, dtypes=("float32", "float64", "int32", "int64"),
    result_dtype=lambda x_dtype, level=0: np.dtype(np.int32),
    summary="1 where x > level, else 0 (int32)")


@pytest.fixture
def kernels(moving_sum):
    chunkernels.register(THRESHOLD)
    chunkernels.register(BOX_SUM)


def one_by_one(x, steps):
    for name, params in steps:
        x = chunkernels.apply(x, name, **params)
    return x


CHUNKINGS = [(3, 12), (3, 5), (2, 4), (1, 3), (3, 1), (3, (5, 5, 2)), (3, (2, 9, 1)), (2, 2)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunks", CHUNKINGS, ids=str)
def test_moving_sum_chained_with_itself_and_a_threshold(kernels, mode, chunks):
    steps = [("moving_sum", {"radius": 1, "mode": mode}),
             ("above", {"level": 3}),
             ("moving_sum", {"radius": 2, "mode": mode})]
    x_np = random_array(np.random.default_rng(0), (3, 12), "float64") / 100
    x = da.from_array(x_np, chunks=chunks)
    p = chunkernels.pipeline(steps)
    z = p(x)
    assert z.dtype == np.int32 and z.chunks == x.chunks
    expected = one_by_one(x_np, steps)
    assert_close(z.compute(), expected)
    assert_close(one_by_one(x, steps).compute(), expected)


def test_numpy_in_numpy_out(kernels):
    steps = [("box_sum", {"radius": (1, 2), "mode": ("wrap", "reflect")}), ("above", {})]
    x_np = random_array(np.random.default_rng(1), (7, 9), "int64")
    got = chunkernels.pipeline(steps).apply(x_np)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32
    assert_close(got, one_by_one(x_np, steps))


@pytest.mark.parametrize("chunks", [(4, 3), (2, 5), (1, 1), (9, 2), ((3, 1, 5), (6, 1, 2))],
                         ids=str)
def test_per_axis_halos_add_up(kernels, chunks):
    steps = [("box_sum", {"radius": (1, 0), "mode": ("wrap", "nearest")}),
             ("box_sum", {"radius": (2, 1), "mode": ("wrap", "mirror")}),
             ("above", {"level": 0}),
             ("box_sum", {"radius": (0, 2), "mode": ("reflect", "constant")})]
    p = chunkernels.pipeline(steps)
    assert p.depth(2) == (3, 3)
    assert p.boundary(2) == ("periodic", "none")
    x_np = random_array(np.random.default_rng(2), (9, 9), "int64")
    assert_close(p(da.from_array(x_np, chunks=chunks)).compute(), one_by_one(x_np, steps))


def test_one_exchange_for_the_whole_pipeline(kernels):
    steps = [("box_sum", {"radius": 1}), ("above", {}), ("box_sum", {"radius": 2})]
    x = dask_input(np.zeros((32, 32)), 8, held=False)  # 16 blocks, each a task
    z = chunkernels.pipeline(steps)(x)
    assert set(z.dask.layers) == {z.name, *x.dask.layers}  # the input and the pipeline
    assert len(z.dask.layers[z.name]) == 2 * 16  # a strip task and a kernel task per block
    separate = one_by_one(x, steps)
    assert len(separate.dask.layers) == len(x.dask.layers) + 3
    assert sum(len(layer) for name, layer in separate.dask.layers.items()
               if name not in x.dask.layers) == 2 * 16 + 16 + 2 * 16
    # blocks in memory: no strip tasks, one task per block
    z = chunkernels.pipeline(steps)(dask_input(np.zeros((32, 32)), 8))
    assert list(z.dask.layers) == [z.name] and len(z.dask.layers[z.name]) == 16


def test_pointwise_only_pipeline_is_one_task_per_block(kernels):
    x = da.from_array(np.arange(12.0).reshape(3, 4), chunks=2)
    z = chunkernels.pipeline(["above", ("above", {"level": 0})])(x)
    assert len(z.dask.layers[z.name]) == x.npartitions
    assert not any("overlap" in n for n in z.dask.layers)
    assert_close(z.compute(), np.ones((3, 4), np.int32) - (np.arange(12.0).reshape(3, 4) == 0))


def test_blockwise_steps_and_deterministic_keys(kernels):
    x = da.from_array(np.arange(40.0).reshape(4, 10), chunks=3)
    a = chunkernels.pipeline([chunkernels.blockwise("moving_sum", radius=2), ("above", {})])(x)
    b = chunkernels.pipeline([("moving_sum", {"radius": 2}), "above"])(x)
    c = chunkernels.pipeline([("moving_sum", {"radius": 1}), "above"])(x)
    assert a.name == b.name != c.name
    assert a.name.startswith("moving_sum+above-overlap-")
    assert_close(a.compute(), b.compute())


def test_pipelines_register_nothing(kernels):
    before = chunkernels.registered()
    chunkernels.pipeline([("moving_sum", {}), "above"])(da.zeros((4, 4), chunks=2)).compute()
    assert chunkernels.registered() == before


def test_halo_as_wide_as_the_array(kernels):
    x_np = random_array(np.random.default_rng(3), (3, 8), "int64")
    x = da.from_array(x_np, chunks=(3, 3))
    steps = [("moving_sum", {"radius": 4}), ("moving_sum", {"radius": 4})]
    p = chunkernels.pipeline(steps)
    with pytest.raises(HaloError, match=r"moving_sum\+moving_sum: the halo .* \(axis 1: halo 8, "
                                        r"chunks \(3, 3, 2\), array 8\)"):
        p(x)
    assert_close(p(x, allow_rechunk=True).compute(), one_by_one(x_np, steps))


def test_boundaries_must_agree_where_halos_meet(kernels):
    p = chunkernels.pipeline([("moving_sum", {"mode": "wrap"}), ("moving_sum", {"mode": "reflect"})])
    with pytest.raises(ValueError, match=r"pipeline moving_sum\+moving_sum: along axis 1, "
                                         r"moving_sum needs a 'periodic' boundary and moving_sum "
                                         r"a 'none' one .* or split the pipeline between them"):
        p(da.zeros((2, 6), chunks=3))
    # along an axis of one chunk no halo is exchanged: each step's own edge mode applies there,
    # as on a NumPy array
    x_np = random_array(np.random.default_rng(5), (2, 6), "int64")
    want = one_by_one(x_np, [("moving_sum", {"mode": "wrap"}), ("moving_sum", {"mode": "reflect"})])
    assert_close(p(x_np), want)
    assert_close(p(da.from_array(x_np, chunks=(1, 6))).compute(), want)
    # halos on different axes do not meet: wrap along 0 and reflect along 1 go together
    steps = [("box_sum", {"radius": (1, 0), "mode": "wrap"}),
             ("box_sum", {"radius": (0, 1), "mode": "reflect"})]
    x_np = random_array(np.random.default_rng(4), (6, 6), "int64")
    got = chunkernels.pipeline(steps)(da.from_array(x_np, chunks=2))
    assert_close(got.compute(), one_by_one(x_np, steps))


@pytest.mark.parametrize("steps, error, message", [
    ([], ValueError, r"pipeline\(\) needs at least one step"),
    ([("moving_sum", 1)], TypeError, r"pipeline step \('moving_sum', 1\) is not a kernel name, a "
                                     r"\(kernel_name, params\) pair with params a dict"),
    ([np.negative], TypeError, r"is not a kernel name"),
    (["broadcast_add"], TypeError, r"pipeline step broadcast_add takes array operands \(other\); a "
                                   r"step gets only the previous step's result"),
    (["mean_squared_error"], TypeError, r"pipeline step mean_squared_error is a reduction"),
    (["moving_sun"], UnknownKernelError, r"no kernel named 'moving_sun'; did you mean"),
    # one step, not a list of them: a name alone was read letter by letter ("no kernel 'g'")
    ("gaussian_filter", TypeError, r"^pipeline\(\) takes a list of steps; got one step, "
                                   r"'gaussian_filter': wrap it in a list, e\.g\. "
                                   r"chunkernels\.pipeline\(\['gaussian_filter'\]\)$"),
    (("gaussian_filter", {"sigma": 1.0}), TypeError, r"got one step, \('gaussian_filter', "),
    (None, TypeError, r"^pipeline\(\) takes a list of steps \(kernel names, .*; got None$"),
])
def test_step_errors(kernels, steps, error, message):
    with pytest.raises(error, match=message):
        chunkernels.pipeline(steps)


@pytest.mark.parametrize("steps", [
    ["label"],
    [("moving_sum", {"radius": 1}), ("label", {"structure": None})],
    [("zoom", {"taps": [[[0]]], "weights": [[[1.0]]]})],
    [("zoom", {})],  # its missing parameters are not what is wrong
    [chunkernels.blockwise("label")],
], ids=["label", "label-last", "zoom", "zoom-no-params", "blockwise-label"])
def test_steps_that_are_not_blockwise_are_refused_when_the_pipeline_is_built(kernels, steps):
    """Issue #20: ``pipeline(["label"])`` labelled each chunk alone, [1 0 1 0] where SciPy gives
    [1 0 2 0]; with a zoom step it failed only at compute. Both are refused before any graph."""
    name = "zoom" if "zoom" in repr(steps) else "label"
    with pytest.raises(TypeError, match=(
            rf"^pipeline step {name} is not blockwise: its result on a chunk depends on more than "
            rf"the chunk and a halo around it, or has another shape \(it plans its own Dask "
            rf"graph\), so a pipeline, which runs every step on one chunk at a time, would get it "
            rf"wrong\. End the pipeline before it and apply it to the pipeline's output: "
            rf"chunkernels\.apply\(p\(x\), '{name}', \.\.\.\)$")):
        chunkernels.pipeline(steps)
    # what the message says to do gives SciPy's labels
    d = da.from_array(np.array([1, 0, 1, 0]), chunks=2)
    np.testing.assert_array_equal(chunkernels.apply(d, "label", structure=None).compute(),
                                  [1, 0, 2, 0])


def test_parameters_are_validated_when_applied(kernels):
    p = chunkernels.pipeline([("moving_sum", {"mode": "bogus"})])
    with pytest.raises(ValueError, match=r"mode='bogus'"):
        p(da.zeros((4,), chunks=2))
    with pytest.raises(TypeError, match=r"a pipeline takes a dask.array.Array"):
        chunkernels.pipeline(["above"])([1, 2])


def test_repr(kernels):
    p = chunkernels.pipeline([("moving_sum", {"radius": 2}), "above"])
    assert repr(p) == "pipeline([blockwise('moving_sum', radius=2), blockwise('above')])"
    assert p.name == "moving_sum+above"


SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(r1=st.integers(0, 3), r2=st.integers(0, 3), mode=st.sampled_from(MODES),
       sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_pipeline_is_chunking_invariant(kernels, r1, r2, mode, sizes):
    n = sum(sizes)
    steps = [("moving_sum", {"radius": r1, "mode": mode}), ("above", {"level": 0}),
             ("moving_sum", {"radius": r2, "mode": mode})]
    x_np = random_array(np.random.default_rng(5), (2, n), "int64")
    p = chunkernels.pipeline(steps)
    got = p(da.from_array(x_np, chunks=(1, tuple(sizes))), allow_rechunk=True)
    assert_close(got.compute(), one_by_one(x_np, steps), err_msg=f"chunks {sizes}")


# -- on the GPU ---------------------------------------------------------------------------------


def _moving_sum_gpu(x, *, radius, mode):
    import cupy as cp
    from cupyx.scipy import ndimage as cndi

    return cndi.correlate1d(x, cp.ones(2 * radius + 1, dtype=x.dtype), axis=-1, mode=mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_pipeline_on_cupy_chunks(mode):
    cp = chunkernels.cuda.cupy()
    chunkernels.register(dataclasses.replace(MOVING_SUM, gpu=_moving_sum_gpu))
    chunkernels.register(dataclasses.replace(THRESHOLD, gpu=_threshold))  # NumPy code, CuPy too
    steps = [("moving_sum", {"radius": 2, "mode": mode}), ("above", {"level": 0}),
             ("moving_sum", {"radius": 1, "mode": mode})]
    x_np = random_array(np.random.default_rng(6), (16, 40), "float64")
    x = da.from_array(cp.asarray(x_np), chunks=(8, 7), asarray=False)
    got = chunkernels.pipeline(steps, strict=True)(x).compute()  # every step on the GPU
    assert chunkernels.cuda.is_cupy_array(got)
    assert_close(got, one_by_one(x_np, steps))


def test_a_tuple_of_steps_is_a_list_of_steps():
    assert [s.spec.name for s in chunkernels.pipeline(("uniform_filter", "sobel")).steps] == [
        "uniform_filter", "sobel"]
