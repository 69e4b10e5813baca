"""label against scipy.ndimage.label, value for value: SciPy's own label tests (test_label01..13,
the output variants, the structuring-element table, gh-3025), dask-image's label cases, random
images of several densities (percolation included) in 1-D to 4-D under every connectivity and
custom symmetric structures, chunkings down to one pixel and two-pixel slabs (corners and edges
of chunks included), view layouts, empty and size-1 axes, 0-d arrays, output arrays and dtypes,
the errors SciPy raises, and chunking invariance drawn by Hypothesis. CPU and GPU paths alike;
numbering must be identical, not merely equivalent."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from dask.sizeof import sizeof
from filtercheck import backends, device, layouts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkernels
from chunkernels import CPUFallbackWarning, cuda, layout, ndimage
from chunkernels.kernels import label as label_kernel
from chunkernels.kernels.label import _device_merge, _forest, _host_merge
from chunkernels.kernels.label import _graph as label_graph
from chunkernels.ndimage import LabelError
from chunkernels.testing import assert_close, chunkings, graph_on_a_cluster, to_device_view

#: SciPy's test dtypes (scipy/ndimage/tests/__init__.py ``types``).
TYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32",
         "float64")
DENSITIES = (0.0, 0.2, 0.45, 0.59, 0.8, 1.0)


def expected_labels(x, structure=None, output=None):
    """scipy.ndimage.label, reading dtypes SciPy refuses (float16) as ``x != 0``."""
    x = np.asarray(x)
    return ndi.label(label_kernel.scipy_input(x), structure, output)


def label_chunkings(shape):
    """Chunkings for ``shape``: one chunk, halves, uneven thirds, slabs of 2 along each axis in
    turn, and (small arrays) one pixel per chunk."""
    out = chunkings(shape)
    for axis, n in enumerate(shape):
        slab = tuple(min(2, m) if a == axis else max(m, 1) for a, m in enumerate(shape))
        if n > 2 and slab not in out:
            out.append(slab)
    if 0 < math.prod(shape) <= 400:
        out.append((1,) * len(shape))
    return out


def check(backend, x, structure=None, chunks=None, whole=True):
    """``ndimage.label`` equals SciPy's on the whole array and on Dask arrays of ``chunks``."""
    expected, n = expected_labels(x, structure)
    if whole:
        got, count = ndimage.label(device(backend, x), structure)
        assert type(got).__module__.split(".")[0] == backend
        assert isinstance(count, int) and count == n
        assert_close(got, expected, err_msg="whole array")
    for c in label_chunkings(x.shape) if chunks is None else chunks:
        dx = da.from_array(device(backend, x), chunks=c, asarray=False)
        got, count = ndimage.label(dx, structure)
        assert type(got._meta).__module__.split(".")[0] == backend
        assert got.chunks == dx.chunks and got.dtype == expected.dtype
        assert count.shape == () and count.dtype == np.intp
        labels, number = dask.compute(got, count)
        assert int(number) == n, f"chunks {c}: {int(number)} labels, scipy {n}"
        assert_close(labels, expected, err_msg=f"chunks {c}")


def structures(ndim):
    """Every ``generate_binary_structure(ndim, c)`` and symmetric structures reaching across
    chunk edges and corners only."""
    out = [ndi.generate_binary_structure(ndim, c) for c in range(1, ndim + 1)]
    if ndim >= 2:
        diagonal = np.zeros((3,) * ndim, bool)
        diagonal[(0,) * ndim] = diagonal[(2,) * ndim] = True
        anti = np.zeros((3,) * ndim, bool)
        anti[(0,) * (ndim - 1) + (2,)] = anti[(2,) * (ndim - 1) + (0,)] = True
        line = np.zeros((3,) * ndim, bool)
        line[(1,) * (ndim - 1)] = True  # along the last axis only
        out += [diagonal, anti, line, diagonal | anti | ndi.generate_binary_structure(ndim, 1)]
    out.append(np.zeros((3,) * ndim, bool))  # no neighbours: every pixel its own label
    return out


# -- SciPy's tests, ported ---------------------------------------------------------------------

S22 = ndi.generate_binary_structure(2, 2)
LABEL08_IN = [[1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0],
              [1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0]]
SCIPY_CASES = {
    "label03": (np.ones([1]), None, [1], 1),
    "label04": (np.zeros([1]), None, [0], 0),
    "label05": (np.ones([5]), None, [1, 1, 1, 1, 1], 1),
    "label06": (np.array([1, 0, 1, 1, 0, 1]), None, [1, 0, 2, 2, 0, 3], 3),
    "label07": (np.zeros((6, 6)), None, np.zeros((6, 6)), 0),
    "label08": (np.array(LABEL08_IN), None,
                [[1, 0, 0, 0, 0, 0], [0, 0, 2, 2, 0, 0], [0, 0, 2, 2, 2, 0], [3, 3, 0, 0, 0, 0],
                 [3, 3, 0, 0, 0, 0], [0, 0, 0, 4, 4, 0]], 4),
    "label09": (np.array(LABEL08_IN), S22,
                [[1, 0, 0, 0, 0, 0], [0, 0, 2, 2, 0, 0], [0, 0, 2, 2, 2, 0], [2, 2, 0, 0, 0, 0],
                 [2, 2, 0, 0, 0, 0], [0, 0, 0, 3, 3, 0]], 3),
    "label10": (np.array([[0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 0],
                          [0, 0, 0, 0, 0, 0]]), S22,
                [[0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]], 1),
}


@backends
@pytest.mark.parametrize("name", list(SCIPY_CASES))
def test_scipy_label_cases(backend, name):
    data, structure, want, n = SCIPY_CASES[name]
    got, count = ndimage.label(device(backend, data), structure)
    assert count == n
    assert_close(got, np.asarray(want, dtype=np.int32))
    check(backend, data, structure)


@backends
@pytest.mark.parametrize("dtype", TYPES)
def test_scipy_label11_to_13_every_type(backend, dtype):
    label12 = [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1], [0, 0, 1, 0, 1, 1], [0, 0, 1, 1, 1, 1],
               [0, 0, 0, 1, 1, 0]]
    label13 = [[1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1], [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1],
               [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]
    for data, n in ((LABEL08_IN, 4), (label12, 1), (label13, 1)):
        x = np.array(data, dtype=dtype)
        got, count = ndimage.label(device(backend, x))
        assert count == n
        assert_close(got, ndi.label(x)[0])
        check(backend, x, chunks=[(2, 3), (1, 1)], whole=False)


@backends
@pytest.mark.parametrize("dtype", TYPES)
def test_scipy_label11_inplace(backend, dtype):
    data = device(backend, np.array(LABEL08_IN, dtype=dtype))
    assert ndimage.label(data, output=data) == 4
    assert_close(data, ndi.label(np.array(LABEL08_IN))[0].astype(dtype))


@backends
@pytest.mark.parametrize("dtype", TYPES + ("bool",))
def test_scipy_output_typed_and_dtype(backend, dtype):
    data = device(backend, np.ones([5]))
    output = device(backend, np.zeros([5], dtype=dtype))
    assert ndimage.label(data, output=output) == 1
    assert_close(output, np.ones(5, dtype=dtype))
    got, count = ndimage.label(data, output=dtype)
    assert got.dtype == dtype and count == 1
    assert_close(got, np.ones(5, dtype=dtype))
    got, count = ndimage.label(da.from_array(data, chunks=2, asarray=False), output=dtype)
    assert got.dtype == dtype
    assert_close(got.compute(), np.ones(5, dtype=dtype))


@backends
def test_scipy_output_wrong_size(backend):
    for t in TYPES:
        with pytest.raises(ValueError, match="output shape not correct"):
            ndimage.label(device(backend, np.ones([5])), output=device(backend, np.zeros([10], t)))


SCIPY_DATA = Path(ndi.__file__).parent / "tests" / "data"


@backends
@pytest.mark.skipif(not (SCIPY_DATA / "label_inputs.txt").exists(),
                    reason="scipy's test data is not installed")
def test_scipy_structuring_elements_table(backend):
    data = np.loadtxt(SCIPY_DATA / "label_inputs.txt").reshape((-1, 7, 7))
    strels = np.loadtxt(SCIPY_DATA / "label_strels.txt").reshape((-1, 3, 3))
    results = np.loadtxt(SCIPY_DATA / "label_results.txt").reshape((-1, 7, 7))
    r = 0
    for d in data:
        for s in strels:
            got = ndimage.label(device(backend, d), s)[0]
            assert_close(got, results[r].astype(np.int32), err_msg=f"input/strel pair {r}")
            chunked = ndimage.label(da.from_array(device(backend, d), chunks=(3, 2), asarray=False),
                                    s)[0]
            assert_close(chunked.compute(), results[r].astype(np.int32))
            r += 1


@backends
def test_scipy_gh_issue_3025(backend):
    d = np.zeros((60, 320))
    d[:, :257] = 1
    d[:, 260:] = 1
    d[36, 257] = d[35, 258] = d[35, 259] = 1
    assert ndimage.label(device(backend, d), np.ones((3, 3)))[1] == 1
    check(backend, d, np.ones((3, 3)), chunks=[(60, 258), (20, 64), (7, 3)], whole=False)


@backends
def test_swirl(backend):
    """cupyx's special case: one spiral, each ring touching the next only at its end."""
    n = 13
    x = np.zeros((n, n), dtype=np.int64)
    top, left, bottom, right = 0, 0, n - 1, n - 1
    while top <= bottom and left <= right:
        x[top, left:right + 1] = 1
        x[top:bottom + 1, right] = 1
        if top + 2 <= bottom:
            x[bottom, left:right + 1] = 1
        if left + 2 <= right and top + 2 <= bottom:
            x[top + 2:bottom + 1, left] = 1
        top, left, bottom, right = top + 2, left + 2, bottom - 2, right - 2
    check(backend, x)


# -- dask-image's label cases (with numbering identical, not merely equivalent) -----------------

@backends
@pytest.mark.parametrize("seed, prob, shape, chunks, connectivity", [
    (42, 0.4, (15, 16), (15, 16), 1),
    (42, 0.4, (15, 16), (4, 5), 1),
    (42, 0.4, (15, 16), (4, 5), 2),
    (42, 0.4, (15, 16), (8, 5), 1),
    (42, 0.4, (15, 16), (8, 5), 2),
    (42, 0.3, (10, 8, 6), (5, 4, 3), 1),
    (42, 0.3, (10, 8, 6), (5, 4, 3), 2),
    (42, 0.3, (10, 8, 6), (5, 4, 3), 3),
])
def test_dask_image_cases(backend, seed, prob, shape, chunks, connectivity):
    a = np.random.default_rng(seed).random(shape) < prob
    s = ndi.generate_binary_structure(a.ndim, connectivity)
    expected, n = ndi.label(a, s)
    labels, count = ndimage.label(da.from_array(device(backend, a), chunks=chunks, asarray=False), s)
    assert labels.dtype == expected.dtype and labels.shape == expected.shape
    assert int(count.compute()) == n
    assert_close(labels.compute(), expected)


# -- random images --------------------------------------------------------------------------------

@backends
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("shape", [(57,), (23, 29), (9, 11, 10)])
def test_random_images_every_structure(backend, density, shape):
    rng = np.random.default_rng(int(density * 100) + len(shape))
    x = rng.random(shape) < density
    for s in structures(len(shape)):
        check(backend, x, s)


@backends
@pytest.mark.parametrize("connectivity", [1, 2, 4])
def test_4d(backend, connectivity):
    x = np.random.default_rng(3).random((5, 6, 4, 7)) < 0.4
    check(backend, x, ndi.generate_binary_structure(4, connectivity),
          chunks=[(5, 6, 4, 7), (2, 3, 2, 3), (1, 2, 1, 2)])


@backends
def test_percolating_cluster_across_many_chunks(backend):
    """Near the 4-connectivity percolation threshold one component winds through every chunk."""
    x = np.random.default_rng(4).random((128, 96)) < 0.593
    check(backend, x, chunks=[(128, 96), (16, 16), (13, 7), (128, 1), (2, 96)])
    check(backend, x, S22, chunks=[(16, 16), (5, 11)], whole=False)


@backends
def test_corners_of_chunks(backend):
    """Pixels touching only across the corner of four chunks (2-D) or eight (3-D)."""
    x = np.zeros((4, 4), bool)
    x[1, 1] = x[2, 2] = x[1, 2] = True
    x[3, 0] = x[0, 3] = True
    check(backend, x, S22, chunks=[(2, 2), (1, 1), (3, 1)])
    x3 = np.zeros((4, 4, 4), bool)
    x3[1, 1, 1] = x3[2, 2, 2] = x3[1, 2, 2] = x3[3, 3, 0] = True
    for connectivity in (2, 3):
        check(backend, x3, ndi.generate_binary_structure(3, connectivity),
              chunks=[(2, 2, 2), (1, 1, 1), (3, 1, 2)])


@backends
@pytest.mark.parametrize("dtype", ["bool", "float16", "float32", "int64", "uint16"])
def test_any_nonzero_value_is_foreground(backend, dtype):
    rng = np.random.default_rng(5)
    x = (rng.random((19, 21)) < 0.5) * rng.integers(1, 100, (19, 21))
    x = (x * np.where(rng.random((19, 21)) < 0.5, -1, 1) if dtype[0] in "fi" else x).astype(dtype)
    check(backend, x, chunks=[(5, 4), (19, 1)])
    if dtype[0] == "f":
        x[3, 4:9] = np.nan  # NaN is nonzero
        check(backend, x, chunks=[(5, 4)])


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    # standard normal values cast to int16: about a third are nonzero, in the view's own layout
    name, view = layouts(np.random.default_rng(6), shape=(31, 27), dtype="int16")[index]
    check(backend, view, S22)
    check(backend, view)


@backends
def test_transposed_3d_view(backend):
    x = (np.random.default_rng(7).random((8, 9, 10)) < 0.4).transpose(2, 0, 1)[::-1, :, ::2]
    check(backend, x, ndi.generate_binary_structure(3, 2))


@backends
@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0), (4, 0, 2), (1,), (1, 7), (7, 1),
                                   (2, 1, 3), (1, 1, 1), (1, 1, 9)])
def test_empty_and_size_one_axes(backend, shape):
    x = np.random.default_rng(8).random(shape) < 0.5
    for s in structures(len(shape))[:2]:
        check(backend, x, s)


@backends
def test_empty_chunks_inside_the_array(backend):
    x = np.random.default_rng(9).random((9, 8)) < 0.6
    dx = da.from_array(device(backend, x), chunks=((3, 0, 6), (0, 4, 0, 4)), asarray=False)
    labels, count = ndimage.label(dx, S22)
    expected, n = ndi.label(x, S22)
    assert int(count.compute()) == n
    assert_close(labels.compute(), expected)


@backends
@pytest.mark.parametrize("value", [0.0, 1.0, -2.5])
def test_0d(backend, value):
    x = np.array(value)
    got, count = ndimage.label(device(backend, x))
    want, n = ndi.label(x)
    assert count == n
    assert_close(got, want)
    labels, number = ndimage.label(da.from_array(device(backend, x), asarray=False))
    assert labels.shape == () and int(number.compute()) == n
    assert_close(labels.compute(), want)


def test_lists_and_scalars():
    got, n = ndimage.label([[1, 0], [1, 1]])
    assert n == 1 and isinstance(got, np.ndarray)
    assert ndimage.label(3.0)[1] == 1


# -- outputs ------------------------------------------------------------------------------------------

@backends
@pytest.mark.parametrize("layout_of_output", ["transposed", "reversed", "fortran-3d", "sliced"])
def test_output_arrays_of_any_layout(backend, layout_of_output):
    """SciPy numbers features in the order it walks the output array (its line axis is the
    output's smallest stride): an output in another layout than C gets SciPy's numbering."""
    rng = np.random.default_rng(10)
    x = rng.random((6, 7, 8) if layout_of_output == "fortran-3d" else (20, 30)) < 0.45
    make = {"transposed": lambda: np.zeros((30, 20), np.int64).T,
            "reversed": lambda: np.zeros((20, 60), np.float32)[:, ::-2],
            "sliced": lambda: np.zeros((40, 31), np.uint16)[::2, 1:],
            "fortran-3d": lambda: np.zeros((6, 7, 8), np.int32, order="F")}[layout_of_output]
    want = make()
    n = ndi.label(x, output=want)
    got = device(backend, make())
    assert ndimage.label(device(backend, x), output=got) == n
    assert_close(got, want)


@backends
def test_insufficient_bit_depth(backend):
    x = np.eye(300)  # 300 single-pixel features
    with pytest.raises(RuntimeError, match="insufficient bit-depth"):
        ndimage.label(device(backend, x), output=np.uint8)
    with pytest.raises(RuntimeError, match="insufficient bit-depth"):
        ndimage.label(device(backend, x), output=device(backend, np.zeros((300, 300), np.int8)))
    labels, count = ndimage.label(da.from_array(device(backend, x), chunks=100, asarray=False),
                                  output=np.uint8)
    with pytest.raises(RuntimeError, match="insufficient bit-depth"):
        labels.compute()
    got, n = ndimage.label(device(backend, np.eye(255)), output=np.uint8)  # 255 labels fit
    assert n == 255
    assert_close(got, ndi.label(np.eye(255), output=np.uint8)[0])


def test_bool_output_on_dask_marks_the_features():
    x = np.random.default_rng(11).random((30, 30)) < 0.5
    got, n = ndimage.label(da.from_array(x, chunks=7), output=bool)
    assert got.dtype == bool and int(n.compute()) == ndi.label(x)[1]
    assert_close(got.compute(), x)


# -- errors -------------------------------------------------------------------------------------------

@backends
def test_errors(backend):
    x = device(backend, np.ones((4, 4)))
    with pytest.raises(TypeError, match="Complex type not supported"):
        ndimage.label(device(backend, np.ones((4, 4), np.complex64)))
    with pytest.raises(RuntimeError, match="structure and input must have equal rank"):
        ndimage.label(x, np.ones(3))
    with pytest.raises(ValueError, match="structure and input must have equal rank"):
        ndimage.label(x, np.ones((3, 3, 3)))
    with pytest.raises(ValueError, match="structure dimensions must be equal to 3"):
        ndimage.label(x, np.ones((3, 5)))
    with pytest.raises(AssertionError, match="Structuring element is not symmetric"):
        ndimage.label(x, [[0, 1, 0], [1, 1, 0], [0, 0, 0]])
    with pytest.raises(LabelError, match="not symmetric"):
        ndimage.label(da.ones((4, 4), chunks=2), [[0, 1, 0], [1, 1, 0], [0, 0, 0]])
    with pytest.raises(TypeError, match="cannot write labels as float16"):
        ndimage.label(x, output=np.float16)
    with pytest.raises(TypeError, match="not understood"):
        ndimage.label(x, output="abc")
    with pytest.raises(TypeError, match="Dask input"):
        ndimage.label(da.ones((4, 4), chunks=2), output=np.zeros((4, 4), np.int32))
    other = np.zeros((4, 4), np.int32) if backend == "cupy" else None
    if other is not None:
        with pytest.raises(TypeError, match="input's device"):
            ndimage.label(x, output=other)


def test_non_numeric_input():
    with pytest.raises(TypeError, match="boolean, integer or floating-point"):
        ndimage.label(np.array(["a", "b"]))


# -- chunked graph ------------------------------------------------------------------------------------

def test_graph_is_linear_in_chunks_and_shares_the_merge():
    x = da.from_array(np.random.default_rng(12).random((64, 64)) < 0.5, chunks=8).persist()
    labels, count = ndimage.label(x)
    graph = dict(labels.__dask_graph__())
    # per chunk a local labelling and a relabel, one merge; the input blocks are in the tasks
    assert len(graph) == 2 * x.npartitions + 1
    assert len({**graph, **dict(count.__dask_graph__())}) == 2 * x.npartitions + 2
    got, n = dask.compute(labels, count)
    assert n == ndi.label(x.compute())[1]


def test_one_task_labels_every_block_when_asked(monkeypatch):
    """CuPy blocks under a local scheduler are labelled, merged and relabelled by one task
    (their labelling only queues kernels), each chunk's task picking its labels, the count
    last. The same graph on NumPy blocks numbers as SciPy does, for every connectivity, 1-D to
    4-D, uneven chunks and slabs."""
    monkeypatch.setattr(label_graph, "local_shape", lambda xp: "one task")
    x = da.from_array(np.random.default_rng(12).random((64, 64)) < 0.5, chunks=8).persist()
    labels, count = ndimage.label(x)
    graph = dict(labels.__dask_graph__())
    assert len(graph) == x.npartitions + 1
    assert len({**graph, **dict(count.__dask_graph__())}) == x.npartitions + 2
    rng = np.random.default_rng(31)
    for shape in [(200,), (37, 45), (9, 11, 10), (4, 5, 3, 6)]:
        for structure in structures(len(shape)):
            image = rng.random(shape) < 0.45
            check("numpy", image, structure, chunks=label_chunkings(shape)[1:], whole=False)
    # a lazy input stays a node the task depends on; the count comes after every chunk's pick
    image = rng.random((30, 41)) < 0.5
    lazy = da.from_array(image, chunks=(7, 9)) > 0
    labels, count = ndimage.label(lazy)
    np.testing.assert_array_equal(labels.compute(), ndi.label(image)[0])
    assert int(count.compute()) == ndi.label(image)[1]
    order = dask.order.order(dict(dask.optimize(labels, count)[1].__dask_graph__()))
    assert max(order, key=order.get)[0] == count.name


def test_the_graph_labels_numpy_blocks_in_a_task_each():
    """NumPy blocks are labelled by SciPy, which releases the GIL: a task each, in parallel."""
    assert label_kernel.local_shape(np) == "per block"


def _merged(x, s, chunks):
    """The merge of ``x``'s blocks as the graph computes it: per block its local labels and its
    part of the merge, and the number of labels."""
    dx = da.from_array(x, chunks=chunks)
    local = [_forest._local_host(dx.blocks[i].compute(), s) for i in np.ndindex(*dx.numblocks)]
    plan = _host_merge._MergePlan(x.shape, dx.chunks, s, np.int32)
    return dx, local, *label_kernel.merge(plan, [summary for _, summary in local])


@pytest.mark.parametrize("connectivity", [1, 2])
def test_merge_sends_line_shifts_and_merged_labels_not_a_table(connectivity):
    """The merge's work grows with the lines and the face pixels: each block gets one shift per
    line and its merged-away labels, and numbers its labels itself."""
    x = np.random.default_rng(19).random((60, 70)) < 0.5
    s = ndi.generate_binary_structure(2, connectivity)
    expected, n = ndi.label(x, s)
    dx, local, parts, total = _merged(x, s, (16, 25))
    assert total == n
    assert sum(away for _, away, _ in parts) == sum(k for _, _, k in parts) - n
    out = np.zeros_like(expected)
    for where, (labels, summary), (numbering, away, k) in zip(
            da.core.slices_from_chunks(dx.chunks), local, parts):
        lines = labels.shape[0]
        assert len(numbering) == lines + 2 * away and k == labels.max()
        out[where] = _host_merge._table(summary[-lines:], numbering, away, k, np.int32)[labels]
    np.testing.assert_array_equal(out, expected)
    assert _merged(x, s, (16, 25))[3] == n  # again, with the grid's layout cached


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (5, 1), (4, 9), (3, 4, 6), (2, 3, 2, 5)])
def test_device_tables_are_sized_for_the_most_labels_a_block_can_have(shape):
    """The device merge sizes each block's table before knowing its labels: at most one per
    pixel, or one per run along the last axis when the structure joins neighbours there.
    Alternating, full and random images never pass it; pixels with no neighbours reach it."""
    rng = np.random.default_rng(24)
    alternate = np.indices(shape)[-1] % 2 == 0  # every other pixel of each line
    for structure in structures(len(shape)):
        bound = label_kernel.most_labels(structure, shape)
        if structure[(1,) * (len(shape) - 1) + (2,)]:
            assert bound == math.prod(shape[:-1]) * ((shape[-1] + 1) // 2)
        else:
            assert bound == math.prod(shape)
        for x in [alternate, np.ones(shape, bool), *(rng.random(shape) < 0.5 for _ in range(5))]:
            assert ndi.label(x, structure)[1] <= bound
    isolated = np.zeros((3,) * len(shape), bool)
    isolated[(1,) * len(shape)] = True  # no neighbour at all: every pixel its own label
    assert label_kernel.most_labels(isolated, shape) == ndi.label(np.ones(shape), isolated)[1]


@backends
def test_labels_merged_away_between_labels_kept_on_one_line(backend):
    """A chunk's line holding a label merged into the chunk before it, a label of its own, and
    another label merged away: the labels after each merged-away one move down."""
    x = np.array([[1, 1, 1, 1, 0, 1, 0, 1, 0, 1],
                  [1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
                  [1, 1, 1, 1, 1, 1, 1, 1, 0, 1],
                  [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                  [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]])
    check(backend, x, chunks=[(5, 3), (2, 3), (1, 3), (3, 4), (5, 5)], whole=False)
    check(backend, x, S22, chunks=[(5, 3), (2, 3)], whole=False)


def test_on_a_cluster_of_processes():
    """The graph holds everything the tasks share: labels computed by worker processes, the
    merge on one of them, are SciPy's. A graph built before the client exists spreads over the
    workers too (its shape is chosen where it runs)."""
    from chunkernels import cluster

    x = np.random.default_rng(22).random((50, 60)) < 0.55
    expected, n = ndi.label(x, S22)
    built_before = ndimage.label(da.from_array(x, chunks=(13, 17)), S22)
    with cluster.client(gpus=0, processes=True, n_workers=2, threads=1, dashboard_address=None):
        for source in (da.from_array(x, chunks=(13, 17)),
                       da.from_array(x, chunks=(13, 17)).persist()):
            labels, count = ndimage.label(source, S22)
            # only the chunks' summaries travel to the merge, not their labels; each relabel
            # task merges them on its own worker, so the merge's numbering travels nowhere
            graph = graph_on_a_cluster(labels)
            merge_key, merge = next((key, task) for key, task in graph.items()
                                    if key[0].endswith("-merge"))
            assert {k[0].rsplit("-", 1)[1] for k in merge.dependencies} == {"summary"}
            assert sum(k[0].startswith("label-") for k in graph) == 3 * source.npartitions + 1
            relabels = [task for key, task in graph.items() if key[0] == labels.name]
            assert len(relabels) == source.npartitions
            for task in relabels:
                assert merge_key not in task.dependencies
                kinds = {k[0].rsplit("-", 1)[1] for k in task.dependencies}
                assert kinds == {"summary", "local"}
            labels, count = dask.compute(labels, count)
            assert int(count) == n
            assert_close(labels, expected)
        labels, count = dask.compute(*built_before)
        assert int(count) == n
        assert_close(labels, expected)


def test_apply_and_registry():
    x = np.random.default_rng(13).random((30, 40)) < 0.5
    s = ndi.generate_binary_structure(2, 2)
    assert_close(chunkernels.apply(x, "label", structure=s), ndi.label(x, s)[0])
    got = chunkernels.apply(da.from_array(x, chunks=(7, 9)), "label", structure=s, dtype="int64")
    assert_close(got.compute(), ndi.label(x, s, output=np.int64)[0])
    assert "label" in chunkernels.registered()


def test_check_command_cpu():
    from chunkernels.check import check as run_check

    results = run_check(["label"], gpu=False)
    assert results and all(r.status in ("pass", "skip") for r in results), results


# -- chunking invariance --------------------------------------------------------------------------

@st.composite
def images(draw):
    """An image (0..3 dims, sides 0..10), a structure for it and two chunkings."""
    shape = tuple(draw(st.lists(st.integers(0, 10), min_size=0, max_size=3)))
    density = draw(st.sampled_from(DENSITIES))
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).random(shape) < density
    options = structures(len(shape))
    s = options[draw(st.integers(0, len(options) - 1))]

    def chunking():
        return tuple(draw(st.integers(1, max(n, 1))) for n in shape)

    return x, s, chunking(), chunking()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(images())
def test_chunking_invariance(case):
    x, s, chunks_a, chunks_b = case
    expected, n = ndi.label(x, s)
    for c in (chunks_a, chunks_b):
        labels, count = ndimage.label(da.from_array(x, chunks=c), s)
        got, number = dask.compute(labels, count)
        assert int(number) == n
        assert_close(got, expected, err_msg=f"shape {x.shape} chunks {c}")


# -- GPU only -----------------------------------------------------------------------------------------

@pytest.mark.gpu
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(images())
def test_chunking_invariance_gpu(case):
    x, s, chunks_a, chunks_b = case
    expected, n = ndi.label(x, s)
    got, count = ndimage.label(to_device_view(x), s)
    assert count == n
    assert_close(got, expected)
    for c in (chunks_a, chunks_b):
        labels, number = ndimage.label(da.from_array(to_device_view(x), chunks=c, asarray=False), s)
        assert int(number.compute()) == n
        assert_close(labels.compute(), expected, err_msg=f"shape {x.shape} chunks {c}")


@pytest.mark.gpu
def test_a_count_never_read_leaves_later_uploads_alone():
    """The count's copy to pinned host memory, queued behind the device's work, keeps its
    buffer until it lands, read or not. Let go at once (the labels computed without the
    count), CuPy's pinned pool gave the buffer to the next upload's staging, which the late
    copy then overwrote: wrong labels, misaligned and illegal addresses."""
    cp = pytest.importorskip("cupy")
    a = cp.random.default_rng(3).random((4096, 4096), dtype=cp.float32)
    want = np.full(1, 7, dtype=np.int64)
    for _ in range(20):
        busy = a @ a  # milliseconds of queued work ahead of the copy
        label_graph._HostNumber(cp.full((), 123456789, dtype=cp.int64))  # never read
        got = cp.asarray(want)  # staged in pinned memory, uploaded behind the copy
        assert int(got[0]) == 7
        del busy


@pytest.mark.gpu
@pytest.mark.parametrize("shape, connectivity", [((70, 90), 1), ((70, 90), 2), ((13, 70, 41), 3),
                                                 ((200,), 1), ((3, 4, 5, 6), 4)])
def test_device_blocks_summarise_like_scipy(shape, connectivity):
    """A CuPy block's local labels and summary (faces, per-line counts) equal the NumPy path's."""
    x = np.random.default_rng(14).random(shape) < 0.45
    s = ndi.generate_binary_structure(len(shape), connectivity)
    labels, summary = _forest._local_device(to_device_view(x), s)
    want_labels, want_summary = _forest._local_host(x, s)
    assert_close(labels.get().astype(want_labels.dtype), want_labels)
    np.testing.assert_array_equal(summary.get().astype(np.int64), want_summary)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool", "float32", "float64"])
def test_device_table_matches_the_host_table(dtype):
    """label_table on the device gives _table's lookup table, merged-away labels, lines without
    labels and blocks without labels included."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(20)
    for lines, labels, away in ((1, 0, 0), (7, 0, 0), (50, 120, 0), (50, 120, 9), (300, 2000, 200),
                                (3, 5, 5)):
        per_line = rng.multinomial(labels, np.ones(lines) / lines)
        ends = np.cumsum(per_line)
        merged = np.sort(rng.choice(np.arange(1, labels + 1), away, replace=False))
        numbering = np.concatenate([rng.integers(0, 1000, lines), merged,
                                    rng.integers(1, 1000, away)]).astype(np.int64)
        want = _host_merge._table(ends, numbering, away, labels, dtype)
        for index in (np.int32, np.int64):
            got = _device_merge._table_device(cp.asarray(ends.astype(index)), numbering, away, labels, dtype)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.get(), want)


@pytest.mark.gpu
def test_joined_summaries_view_one_allocation_and_copy_several():
    """_joined: parts lying end to end in one allocation (a batch's summaries) come back as a
    view of it; parts of several allocations, views with gaps, strided and empty ones as one
    copy, equal to their concatenation; runs within them are copied as one."""
    cp = pytest.importorskip("cupy")
    batch = cp.arange(100, dtype=np.int64)
    parts = [batch[0:10], batch[10:35], batch[35:100]]
    joined = _device_merge._joined(parts)
    assert joined.data.ptr == batch.data.ptr and joined.size == 100
    other = cp.arange(1000, 1040, dtype=np.int64)
    for parts in ([batch[0:10], batch[10:35], other[0:20], other[20:40], batch[50:60]],
                  [batch[0:10], batch[11:20]],  # a gap
                  [batch[::2], batch[1:3]],  # strided
                  [other[0:0], batch[0:5], batch[5:5], batch[5:9], other[0:0]],  # empty
                  [batch[i:i + 1] for i in range(40)] + [other[i:i + 1] for i in range(12)]):
        joined = _device_merge._joined(parts)
        np.testing.assert_array_equal(joined.get(), np.concatenate([p.get() for p in parts]))


@pytest.mark.gpu
@pytest.mark.parametrize("shape, chunks, connectivity", [
    ((70, 90), (16, 25), 1), ((70, 90), (16, 25), 2), ((70, 90), (70, 90), 1),
    ((13, 30, 21), (5, 8, 7), 3), ((200,), (30,), 1), ((6, 5, 7, 4), (2, 3, 3, 2), 4),
    ((40, 0, 9), (20, 3, 4), 1)])
@pytest.mark.parametrize("dtype", ["int32", "bool", "float64"])
@pytest.mark.parametrize("bitmap", ["bound", "count"])
def test_device_merge_numbers_like_scipy_without_leaving_the_device(shape, chunks, connectivity,
                                                                     dtype, bitmap, monkeypatch):
    """Blocks labelled on one device merge there (merge_device): the graph's merge task takes
    that path, and its tables give SciPy's labels and count, with the bitmap of nodes merged
    away sized by the labels the blocks can have or (past BITMAP_BYTES) by those they have."""
    cp = pytest.importorskip("cupy")
    if bitmap == "count":
        monkeypatch.setattr(_device_merge, "BITMAP_BYTES", 0)
    x = np.random.default_rng(23).random(shape) < 0.5
    s = ndi.generate_binary_structure(len(shape), connectivity)
    want, n = ndi.label(x, s)
    want = want.astype(dtype)  # bool: every label is True (SciPy refuses bool outputs here)
    dx = da.from_array(cp.asarray(x), chunks=chunks, asarray=False)
    local = [_forest._local_device(dx.blocks[i].compute(), s) for i in np.ndindex(*dx.numblocks)]
    merged = label_graph._merge_task(_host_merge._MergePlan(x.shape, dx.chunks, s, np.dtype(dtype)), local)
    assert isinstance(merged, _device_merge._DeviceNumbering)
    assert int(label_graph._count(merged)) == n
    nodes = sum(int(labels.max()) if labels.size else 0 for labels, _ in local)
    if bitmap == "count":
        assert merged.arrays["bits"].size == nodes // 32 + 1
    out = np.zeros(shape, dtype=dtype)
    for b, where in enumerate(da.core.slices_from_chunks(dx.chunks)):
        got = label_graph._relabel(local[b], merged, b, np.dtype(dtype))
        assert cuda.is_cupy_array(got) and got.dtype == dtype
        out[where] = got.get()
    np.testing.assert_array_equal(out, want)


def test_a_group_relabelling_lets_each_blocks_local_labels_go():
    """Step 3 on a group of blocks (_relabelled, as a worker's relabelling task runs it) gives
    SciPy's labels and empties the group's local results block by block, so that a block's
    local labels are not held beside the group's new labels until the group ends."""
    x = np.random.default_rng(31).random((60, 70)) < 0.45
    s = ndi.generate_binary_structure(2, 1)
    chunks = ((20, 20, 20), (30, 40))
    blocks = [x[a:a + 20, b:b + w] for a in (0, 20, 40) for b, w in ((0, 30), (30, 40))]
    results = [_forest._local_host(block, s) for block in blocks]
    plan = _host_merge._MergePlan(x.shape, chunks, s, np.dtype(np.int32))
    merged = label_graph._merge_task(plan, results)
    out = label_graph._relabelled(results, [], merged, range(len(blocks)), np.dtype(np.int32))
    assert results == [None] * len(blocks)
    got = np.block([[out[0], out[1]], [out[2], out[3]], [out[4], out[5]]])
    np.testing.assert_array_equal(got, ndi.label(x, s)[0])


def many_with_local_labels(local, blocks):
    """``local.many(blocks)``'s results, each batch's blocks given their local labels
    (:meth:`_Forest.write_summary`), whose summaries must be those ``many`` made without them
    (``label_summary``)."""
    results, batches = local.many(blocks)
    out = list(results)
    for forest, members in batches:
        assert all(results[b][0] is None for b in members)
        for b, (labels, summary) in zip(members, forest.write_summary()):
            np.testing.assert_array_equal(summary.get(), results[b][1].get())
            out[b] = (labels, results[b][1])
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("shape, chunks, connectivity", [
    ((70, 90), (16, 25), 1), ((70, 90), (16, 25), 2), ((64, 64), (32, 32), 1),
    ((13, 30, 21), (5, 8, 7), 3), ((13, 30, 21), (5, 8, 7), 1), ((300,), (37,), 1),
    ((6, 5, 7, 4), (2, 3, 3, 2), 4)])
@pytest.mark.parametrize("view", ["c", "reversed", "fortran"])
@pytest.mark.parametrize("split", [False, True])
def test_a_batch_labels_every_block_as_it_would_alone(shape, chunks, connectivity, view, split,
                                                      monkeypatch):
    """Blocks of one layout labelled together (one launch of each kernel, _LocalLabels.many):
    every block's labels and summary are bit for bit those it gets alone. Uneven edges make
    several layouts, views make strided sources, 4-D blocks go alone, and ``split`` caps a
    batch's pixels so that the blocks of a layout take several batches."""
    cp = pytest.importorskip("cupy")
    x = np.random.default_rng(25).random(shape) < 0.5
    s = ndi.generate_binary_structure(len(shape), connectivity)
    data = cp.asarray(x)
    if view == "reversed":
        data = data[(slice(None, None, -1),) * len(shape)]
    elif view == "fortran":
        data = cp.asfortranarray(data)
    dx = da.from_array(data, chunks=chunks, asarray=False)
    blocks = [dx.blocks[i].compute() for i in np.ndindex(*dx.numblocks)]
    if split:
        monkeypatch.setattr(label_graph, "_BATCH_PIXELS", 3 * math.prod(chunks))
    local = label_graph._LocalLabels(s, True)
    alone = [local(b) for b in blocks]
    together = many_with_local_labels(local, blocks)
    assert len(together) == len(blocks)
    for (labels, summary), (want_labels, want_summary) in zip(together, alone):
        assert labels.shape == want_labels.shape and summary.shape == want_summary.shape
        np.testing.assert_array_equal(labels.get(), want_labels.get())
        np.testing.assert_array_equal(summary.get(), want_summary.get())


@pytest.mark.gpu
@pytest.mark.parametrize("shape, chunks, connectivity", [
    ((70, 90), (16, 25), 1), ((70, 90), (16, 25), 2), ((64, 64), (32, 32), 2),
    ((13, 30, 21), (5, 8, 7), 3), ((300,), (37,), 1), ((6, 5, 7, 4), (2, 3, 3, 2), 4),
    ((40, 0, 9), (20, 3, 4), 1), ((1, 1), (1, 1), 1)])
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint16", "bool", "float64"])
@pytest.mark.parametrize("merge", ["device", "host"])
@pytest.mark.parametrize("split", [False, True])
def test_one_task_numbers_like_scipy(shape, chunks, connectivity, dtype, merge, split,
                                     monkeypatch):
    """The one task of CuPy blocks (_label_blocks): batches are written through one table each
    (relabel_batch; in place for the forest's own dtype), other blocks relabelled alone; with
    the merge on the host (as for blocks on several devices) every block's local labels are
    written first. Each way, SciPy's labels and count, in C-ordered blocks of the chunks."""
    cp = pytest.importorskip("cupy")
    x = np.random.default_rng(27).random(shape) < 0.5
    s = ndi.generate_binary_structure(len(shape), connectivity)
    want, n = ndi.label(x, s)
    want = want.astype(dtype)
    dx = da.from_array(cp.asarray(x), chunks=chunks, asarray=False)
    blocks = [dx.blocks[i].compute() for i in np.ndindex(*dx.numblocks)]
    if merge == "host":
        monkeypatch.setattr(label_graph, "_on_one_device", lambda summaries: False)
    if split:
        monkeypatch.setattr(label_graph, "_BATCH_PIXELS", 2 * math.prod(chunks))
    plan = _host_merge._MergePlan(x.shape, dx.chunks, s, np.dtype(dtype))
    labelled = label_graph._label_blocks(plan, label_graph._LocalLabels(s, True), np.dtype(dtype), blocks)
    assert isinstance(labelled[1], _device_merge._DeviceNumbering) == (merge == "device")
    got = [label_graph._pick(labelled, b) for b in range(len(blocks))]
    assert int(label_graph._count_labelled(labelled, got)) == n
    out = np.zeros(shape, dtype=dtype)
    for b, where in enumerate(da.core.slices_from_chunks(dx.chunks)):
        assert cuda.is_cupy_array(got[b]) and got[b].dtype == dtype
        assert got[b].shape == blocks[b].shape and got[b].flags.c_contiguous
        out[where] = got[b].get()
    np.testing.assert_array_equal(out, want)


@pytest.mark.gpu
def test_summaries_lying_end_to_end_are_joined_without_a_copy():
    """A batch's summaries lie one after another in one allocation: the merge reads them as
    one view. Anything else (a gap, another allocation, another dtype, a strided part) is
    copied end to end, as cupy.concatenate does."""
    cp = pytest.importorskip("cupy")
    whole = cp.arange(30, dtype=cp.int32)
    parts = [whole[0:10], whole[10:22], whole[22:30]]
    joined = _device_merge._joined(parts)
    assert joined.data.ptr == whole.data.ptr and joined.size == 30
    np.testing.assert_array_equal(joined.get(), np.arange(30))
    for others in ([whole[0:10], whole[11:22]], [whole[0:10], cp.arange(10, 22, dtype=cp.int32)],
                   [whole[0:10], whole[10:22].astype(cp.int64)], [whole[0:10], whole[10:30:2]]):
        got = _device_merge._joined(others)
        assert got.data.ptr != whole.data.ptr
        np.testing.assert_array_equal(got.get(), np.concatenate([o.get() for o in others]))


@pytest.mark.gpu
def test_a_batch_leaves_out_blocks_it_cannot_take():
    """Empty blocks, float16 blocks (read as ``x != 0`` first), host blocks and blocks of
    another device layout go alone; the rest share a batch; all as alone."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(26)
    s = ndi.generate_binary_structure(2, 1)
    blocks = [cp.asarray(rng.random((20, 30)) < 0.5) for _ in range(3)]
    blocks += [cp.zeros((0, 30), bool), cp.asarray(rng.random((20, 30)) < 0.5, dtype=cp.float16),
               rng.random((20, 30)) < 0.5, cp.asarray(rng.random((30, 20)) < 0.5).T]
    local = label_graph._LocalLabels(s, True)
    for (labels, summary), block in zip(many_with_local_labels(local, blocks), blocks):
        want_labels, want_summary = local(block)
        assert type(labels) is type(want_labels)
        np.testing.assert_array_equal(cp.asnumpy(labels), cp.asnumpy(want_labels))
        np.testing.assert_array_equal(cp.asnumpy(summary), cp.asnumpy(want_summary))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 31, 255, 256, 257, 5000, 256 * 4096 + 1, 3_000_000,
                               4096 * 4096 + 1])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_device_scan_matches_cumsum(n, dtype):
    """The labels' two-launch scan: local sums plus per-segment offsets give numpy.cumsum."""
    cp = pytest.importorskip("cupy")
    values = np.random.default_rng(n).integers(0, 3, n).astype(dtype)
    scan = _forest._Scan(cp.asarray(values))
    local, offsets, seg = (a.get() if hasattr(a, "get") else int(a) for a in scan.args)
    got = local + offsets[np.arange(n) // seg]
    np.testing.assert_array_equal(got, np.cumsum(values))
    assert int(scan.total) == values.sum()


@pytest.mark.gpu
def test_summaries_come_back_in_one_copy_per_device():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(21)
    parts = [rng.integers(0, 99, n) for n in (5, 0, 7, 3)]
    mixed = [cp.asarray(parts[0].astype(np.int32)), parts[1], cp.asarray(parts[2]), parts[3]]
    np.testing.assert_array_equal(_host_merge._host_summaries(mixed), np.concatenate(parts))
    got = _host_merge._host_summaries([cp.asarray(p) for p in parts])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.concatenate(parts))


@pytest.mark.gpu
def test_large_image_tiles_and_borders():
    """Components crossing many 32x32 tiles in every direction, and long snakes."""
    rng = np.random.default_rng(15)
    x = ndi.gaussian_filter(rng.standard_normal((1000, 1100)), 3) > 0.02
    x[::50, :] = True  # long rows joining components across all tiles
    check("cupy", x, chunks=[(1000, 1100), (256, 300), (333, 1100)])
    check("cupy", x, S22, chunks=[(250, 275)])
    snake = np.zeros((130, 130), bool)
    snake[::4, :] = True
    snake[1::8, -1] = snake[2::8, -1] = snake[3::8, -1] = True
    snake[5::8, 0] = snake[6::8, 0] = snake[7::8, 0] = True
    check("cupy", snake, chunks=[(130, 130), (40, 40)])


@pytest.mark.gpu
def test_64bit_indexing_for_views_with_a_large_span():
    cp = pytest.importorskip("cupy")
    base = cp.zeros((3, 2**30 + 64), dtype=cp.uint8)  # 3 GiB: a view's byte span passes 2**31
    view = base[:, :: 2**28]
    host = np.random.default_rng(16).random(view.shape) < 0.5
    view[...] = cp.asarray(host)
    assert layout.needs_index64(view)
    got, n = ndimage.label(view, S22)
    want, m = ndi.label(host, S22)
    assert n == m
    assert_close(got, want)
    del base, view


@pytest.mark.gpu
def test_more_dims_than_the_gpu_path_fall_back_with_a_warning():
    x = np.random.default_rng(17).random((3, 2, 3, 2, 3)) < 0.5
    with pytest.warns(CPUFallbackWarning, match="ndim=5"):
        got, n = ndimage.label(to_device_view(x))
    want, m = ndi.label(x)
    assert n == m
    assert_close(got, want)
    with pytest.warns(CPUFallbackWarning):
        labels, count = ndimage.label(da.from_array(to_device_view(x), chunks=2, asarray=False))
        assert_close(labels.compute(scheduler="synchronous"), want)


@pytest.mark.gpu
def test_torch_cuda_tensors():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(18).random((40, 50)) < 0.5
    t = torch.as_tensor(x, device="cuda")
    got, n = ndimage.label(t, S22)
    assert isinstance(got, torch.Tensor) and got.device.type == "cuda"
    want, m = ndi.label(x, S22)
    assert n == m
    np.testing.assert_array_equal(got.cpu().numpy(), want)
    out = torch.zeros((40, 50), dtype=torch.int64, device="cuda")
    assert ndimage.label(t, S22, output=out) == m
    np.testing.assert_array_equal(out.cpu().numpy(), want)


@pytest.mark.gpu
def test_the_number_of_labels_pickles_as_an_int():
    """The count of the one-task shape on its way to another worker: the number itself."""
    import pickle

    cp = pytest.importorskip("cupy")
    number = label_graph._HostNumber(cp.asarray(12345, dtype=np.int64))
    assert int(number) == 12345
    back = pickle.loads(pickle.dumps(number))
    assert type(back) is int and back == 12345


@pytest.mark.gpu
def test_check_command_gpu():
    from chunkernels.check import check as run_check

    results = run_check(["label"], gpu=True)
    assert {r.path for r in results} >= {"gpu, whole array", "gpu, dask chunks"}
    assert all(r.status == "pass" for r in results), [(r.path, r.detail) for r in results]


def label_on_gpu_workers(workers, **cluster_kwargs):
    """Chunks persisted on ``workers`` worker processes using CuPy (``cluster.client`` of
    ``cluster_kwargs``), labelled there: SciPy's labels, with the summaries going to the merge
    and to every worker (not the labels), each worker merging them on its own GPU; the
    blocks' places are known (persisted), so each worker labels and relabels its blocks in
    group tasks, its summaries one message."""
    cp = pytest.importorskip("cupy")
    from distributed import futures_of, wait

    from chunkernels import cluster

    x = np.random.default_rng(25).random((300, 280)) < 0.55
    expected, count = ndi.label(x, S22)
    with cluster.client(dashboard_address=None, **cluster_kwargs) as c:
        assert cluster.worker_count(c) == workers
        dx = da.from_array(x, chunks=(60, 70)).map_blocks(
            cp.asarray, meta=cp.empty((0, 0), bool)).persist()
        wait(dx)
        holders = {w for ws in c.who_has(futures_of(dx)).values() for w in ws}
        assert len(holders) == workers
        labels, number = ndimage.label(dx, S22)
        graph = graph_on_a_cluster(labels)
        summaries = [k for k in graph if k[0].endswith("-summaries")]
        assert len(summaries) == workers  # one run of blocks per worker here
        assert not any(k[0].endswith("-summary") for k in graph)
        merge = next(k for k in graph if k[0].endswith("-merge"))
        merged = c.get(graph, merge)
        assert isinstance(merged, _device_merge._DeviceNumbering)  # merged on a worker's GPU
        # Dask sees what it weighs (its device arrays), though it travels nowhere
        assert sizeof(merged) > sum(a.nbytes for a in merged.arrays.values()) > 0
        got, k = dask.compute(labels, number)
        assert int(k) == count
        assert cuda.is_cupy_array(got)
        assert_close(got, expected)


@pytest.mark.gpu
def test_chunks_spread_over_two_worker_processes_of_one_gpu():
    label_on_gpu_workers(2, gpus=0, processes=True, n_workers=2, threads=1)


@pytest.mark.multigpu
def test_chunks_spread_over_gpu_workers():
    label_on_gpu_workers(cuda.gpu_count(), gpus=cuda.gpu_count())


@pytest.mark.multigpu
def test_chunks_on_several_devices_of_one_process():
    """Dask's threaded scheduler with chunks on two devices: their summaries are on different
    devices, so the merge runs on the host, and each chunk is relabelled on its own device."""
    cp = pytest.importorskip("cupy")
    x = np.random.default_rng(26).random((120, 90)) < 0.55
    expected, count = ndi.label(x)
    blocks = []
    for i, rows in enumerate(np.array_split(x, 4)):
        with cp.cuda.Device(i % 2):
            blocks.append(da.from_array(cp.asarray(rows), chunks=rows.shape, asarray=False))
    labels, number = dask.persist(*ndimage.label(da.concatenate(blocks)), scheduler="threads")
    assert int(number.compute()) == count
    # the persisted blocks themselves (computing a block would copy it to the current device)
    held = chunkernels._graph.in_memory_blocks(labels)
    parts = [held[(i, 0)] for i in range(4)]
    assert [p.device.id for p in parts] == [0, 1, 0, 1]
    assert_close(np.concatenate([p.get() for p in parts]), expected)


# -- periodic labelling (wrap_axes, dask-image's option) --------------------------------------------


def periodic_reference(x, structure, wrap):
    """Labels of ``x`` with the ``wrap`` axes closed into rings, pixel by pixel: union-find over
    every foreground pixel and its structure neighbours (indices wrapped along ``wrap``, out of
    range elsewhere), components numbered by their first pixel in raster order."""
    x = np.asarray(x) != 0
    shape = x.shape
    flat = np.flatnonzero(x)
    parent = {int(i): int(i) for i in flat}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    offsets = [np.array(o) - 1 for o in zip(*np.nonzero(structure))]
    for i in flat:
        p = np.array(np.unravel_index(i, shape))
        for o in offsets:
            q = p + o
            ok = True
            for a, n in enumerate(shape):
                if a in wrap:
                    q[a] %= n
                elif not 0 <= q[a] < n:
                    ok = False
            if ok and x[tuple(q)]:
                a, b = root(int(i)), root(int(np.ravel_multi_index(tuple(q), shape)))
                parent[max(a, b)] = min(a, b)
    out = np.zeros(shape, dtype=np.int32)
    numbers = {}
    for i in flat:
        r = root(int(i))
        numbers.setdefault(r, len(numbers) + 1)
        out.flat[i] = numbers[r]
    return out, len(numbers)


def check_wrapped(backend, x, structure, wrap, chunks=(), whole=True):
    expected, n = periodic_reference(x, structure, wrap)
    if whole:
        got, count = ndimage.label(device(backend, x), structure, wrap_axes=wrap)
        assert type(got).__module__.split(".")[0] == backend and isinstance(count, int)
        assert count == n and got.dtype == np.int32
        assert_close(got, expected, err_msg=f"whole array, wrap {wrap}")
    for c in chunks:
        dx = da.from_array(device(backend, x), chunks=c, asarray=False)
        got, count = ndimage.label(dx, structure, wrap_axes=wrap)
        assert type(got._meta).__module__.split(".")[0] == backend and got.chunks == dx.chunks
        labels, number = dask.compute(got, count)
        assert int(number) == n, f"chunks {c}, wrap {wrap}: {int(number)} labels, expected {n}"
        assert_close(labels, expected, err_msg=f"chunks {c}, wrap {wrap}")


@backends
@pytest.mark.parametrize("shape", [(13,), (9, 11), (1, 12), (2, 7), (5, 6, 4), (3, 1, 5)])
@pytest.mark.parametrize("density", [0.3, 0.55])
def test_wrap_axes_close_the_array_into_rings(backend, shape, density):
    """Every subset of axes wrapped, every structure, several chunkings (one-pixel chunks,
    uneven edges): the labels of the periodic array, numbered by first pixel."""
    rng = np.random.default_rng(sum(shape) + int(100 * density))
    x = rng.random(shape) < density
    ndim = len(shape)
    chunked = [c for c in label_chunkings(shape) if c != shape][:2]
    # faces only, every neighbour, and one reaching across corners alone
    kinds = structures(ndim)
    kinds = [kinds[0], kinds[ndim - 1]] + ([kinds[ndim + 1]] if ndim >= 2 else [])
    wraps = [w for k in range(1, ndim + 1) for w in itertools.combinations(range(ndim), k)]
    if ndim == 3:  # one axis, two, all three
        wraps = [(0,), (1, 2), (0, 1, 2)]
    for wrap in wraps:
        for structure in kinds:
            check_wrapped(backend, x, structure, wrap, chunked)


@pytest.mark.parametrize("shape", ["one task", "per block"])
@pytest.mark.parametrize("wrap", [None, (0,), (0, 1)])
def test_a_labelling_runs_once_per_compute(monkeypatch, shape, wrap):
    """Every block is labelled once, whatever is computed from the labels: the wrapped labels
    (whose faces feed one task), the labels alone, the count alone, or find_objects with the
    count. Faces handed to dask.delayed as arrays were optimised one by one, each with a
    renamed copy of the labelling, which ran once per face."""
    runs = []
    host = label_graph._local_host
    monkeypatch.setattr(label_graph, "_local_host", lambda b, s: runs.append(1) or host(b, s))
    monkeypatch.setattr(label_graph, "local_shape", lambda xp: shape)
    x = np.random.default_rng(41).random((9, 11)) < 0.55
    want, n = ndimage.label(x, wrap_axes=wrap)
    dx = da.from_array(x, chunks=(4, 4))
    labels, count = ndimage.label(dx, wrap_axes=wrap)
    for what in ((labels, count), (labels,), (count,), (ndimage.find_objects(labels), count)):
        runs.clear()
        got = dask.compute(*what)
        assert len(runs) == dx.npartitions, f"{len(runs)} block labellings for {len(what)} outputs"
    assert got[0] == ndi.find_objects(want) and int(got[1]) == n
    labels_got, number = dask.compute(labels, count)
    assert int(number) == n
    assert_close(labels_got, want)


@backends
def test_wrap_axes_dask_image_cases(backend):
    """dask-image's test_label_wrap: features joined across one edge, both edges, corners."""
    a = np.array([[0, 0, 0, 0, 0], [1, 0, 0, 0, 1], [0, 0, 0, 0, 0]] * 1)
    full2, cross2 = ndi.generate_binary_structure(2, 2), ndi.generate_binary_structure(2, 1)
    corners = np.array([[1, 0, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1]])
    for x, structure, wrap, want in [
            (a, full2, (1,), 1), (a, full2, (0,), 2), (corners, full2, (0, 1), 1),
            (corners, cross2, (0, 1), 1), (corners, cross2, (1,), 2), (corners, cross2, (), 4)]:
        got, n = ndimage.label(da.from_array(device(backend, x), chunks=2), structure,
                               wrap_axes=wrap or None)
        assert int(n.compute()) == want
        assert_close(got.compute(), periodic_reference(x, structure, wrap)[0])


@backends
def test_wrap_axes_output_arrays_and_dtypes(backend):
    x = np.array([[1, 0, 1], [0, 0, 0], [1, 0, 1]])
    cp = cuda.cupy() if backend == "cupy" else np
    out = cp.zeros(x.shape, dtype=np.int64)
    assert ndimage.label(device(backend, x), output=out, wrap_axes=(0, 1),
                         structure=np.ones((3, 3))) == 1
    assert_close(out, np.where(x, 1, 0).astype(np.int64))
    labels, n = ndimage.label(device(backend, x), output=np.uint8, wrap_axes=1)
    assert labels.dtype == np.uint8 and n == 2
    assert_close(labels, np.array([[1, 0, 1], [0, 0, 0], [2, 0, 2]], dtype=np.uint8))
    with pytest.raises(LabelError, match="bit-depth"):
        ndimage.label(device(backend, np.tile([1, 0], 300)), output=np.uint8, wrap_axes=0)
    labels, n = ndimage.label(device(backend, np.zeros((0, 4))), wrap_axes=0)
    assert labels.shape == (0, 4) and n == 0


def test_wrap_axes_errors():
    x = np.ones((3, 4))
    for bad in ((2,), (-3,), (0, 0), (0, -2), (1.0,), "0", (True,)):
        with pytest.raises(LabelError, match="wrap_axes"):
            ndimage.label(x, wrap_axes=bad)
    with pytest.raises(LabelError, match="wrap_axes"):
        ndimage.label(da.from_array(x, chunks=2), wrap_axes=5)
    assert ndimage.label(x, wrap_axes=-1)[1] == 1
    assert ndimage.label(x, wrap_axes=())[1] == 1


def test_a_label_group_task_out_of_device_memory_raises_gpu_out_of_memory_naming_the_fix():
    # the group tasks of the worker-groups shape: CuPy's (or RMM's) MemoryError becomes
    # GPUOutOfMemoryError, which names the fixes; a host MemoryError stays what it is
    from chunkernels import GPUOutOfMemoryError
    from chunkernels.kernels.label import _graph as label_graph

    cupy_oom = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})

    def fails(error):
        @label_graph._naming_the_fix
        def task(*blocks):
            raise error
        return task

    with pytest.raises(GPUOutOfMemoryError, match=r"label: the GPU ran out of memory "
                       r"\(OutOfMemoryError: Out of memory allocating 512 bytes\)\. Leave the "
                       r"label more room: spill results to host memory earlier \(dask-cuda's "
                       r"device_memory_limit, e\.g\. chunkernels\.cluster\.client\(gpus=4, "
                       r"device_memory_limit=0\.6\)"):
        fails(cupy_oom("Out of memory allocating 512 bytes"))(np.zeros(3))
    # a relabelling's arguments name the labels' dtype: int64 labels get the int32 advice
    with pytest.raises(GPUOutOfMemoryError, match=r"The labels are int64 .* "
                       r"label\(x, output=np\.int32\) halves their bytes"):
        fails(cupy_oom("Out of memory"))("name", np.dtype(np.int64))
    message = label_graph._out_of_memory_message(
        "OutOfMemoryError: x", {"id": 2, "name": "NVIDIA H100", "free": 2**20, "total": 2**36},
        np.dtype(np.int32))
    assert "Device 2 (NVIDIA H100) has 1.00 MiB free of 64.00 GiB. Leave the label" in message
    assert "int32" not in message and "  " not in message
    with pytest.raises(MemoryError) as info:
        fails(MemoryError("host"))(np.zeros(3))
    assert type(info.value) is MemoryError
