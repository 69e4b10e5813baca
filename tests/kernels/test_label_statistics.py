"""label_statistics: the table against a brute-force reference (one label at a time), the
combine of any split into blocks, the registry paths (apply on NumPy, Dask and CuPy, ``check``),
and the CUDA kernel against the CPU statistics on every layout, slot map and dtype."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi

import chunkernels
from chunkernels.check import check
from chunkernels.kernels import label_statistics
from chunkernels.testing import random_array, to_device_view

EVERY = label_statistics.normalise_stats(label_statistics.STATS)


def brute_force(x, labels, select, index=None):
    """The table by definition: each slot's elements picked with a mask, raster order."""
    labels = np.broadcast_to(labels, x.shape)
    if select == "all":
        masks, keys = [np.ones(x.shape, bool)], [0]
    elif select == "positive":
        masks, keys = [labels > 0], [0]
    else:
        index = np.unique(labels[labels > 0]) if select == "labels" else index
        masks = [labels == v for v in index]
        keys = index if select == "labels" else range(len(index))
    lay = label_statistics.Layout.of(EVERY, x.ndim)
    table = label_statistics.empty_rows(np, len(masks), lay)
    for row, mask, key in zip(table, masks, keys):
        row[lay.key] = key
        v = x[mask].astype(np.float64)
        if not v.size:
            continue
        coords = np.argwhere(mask)  # raster order
        flat = np.flatnonzero(mask)
        row[lay.count], row[lay.sum] = v.size, v.sum()
        row[lay.m2] = ((v - v.mean()) ** 2).sum()
        order = np.argsort(v, kind="stable")  # NaN last, ties in raster order
        row[lay.min], row[lay.min_position] = v[order[0]], flat[order[0]]
        nan = np.isnan(v)
        first_max = np.flatnonzero(nan)[0] if nan.any() else np.flatnonzero(v == v.max())[0]
        row[lay.max], row[lay.max_position] = v[first_max], flat[first_max]
        row[lay.cols("com")] = (v[:, None] * coords).sum(axis=0)
        row[lay.cols("centroid")] = coords.sum(axis=0)
        row[lay.cols("bbox_lo")], row[lay.cols("bbox_hi")] = coords.min(axis=0), coords.max(axis=0)
    return table


def assert_tables(got, expected, err_msg=""):
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.shape == expected.shape, f"{got.shape} != {expected.shape} {err_msg}"
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-9, err_msg=err_msg)


def label_image(rng, shape):
    labels, n = ndi.label(rng.standard_normal(shape) > 0.3)
    return labels, n


SELECTS = [("all", None), ("positive", None), ("labels", None), ("index", "every"),
           ("index", "sparse"), ("index", "absent")]


def _index(kind, n):
    return {"every": np.arange(1, n + 1), "sparse": np.arange(0, n + 9, 3),
            "absent": np.array([n + 5, n + 1000])}.get(kind)


@pytest.mark.parametrize("select,kind", SELECTS)
@pytest.mark.parametrize("shape,dtype", [((31, 23), "float32"), ((9, 8, 7), "float64"),
                                         ((200,), "int16"), ((17, 13), "bool"), ((1, 9, 1), "uint8")])
def test_reference_is_the_definition(select, kind, shape, dtype):
    rng = np.random.default_rng(0)
    x = random_array(rng, shape, dtype)
    labels, n = label_image(rng, shape)
    index = _index(kind, n)
    params = label_statistics.validate(x.ndim, stats=label_statistics.STATS, select=select, index=index)
    assert_tables(label_statistics.reference(x, labels, **params), brute_force(x, labels, select, index))


def test_nan_and_ties():
    x = np.array([[np.nan, 1, 1, np.nan], [3, 3, np.nan, np.nan], [0.0, -0.0, 2, 2]])
    labels = np.array([[1, 1, 1, 2], [1, 1, 2, 2], [3, 3, 3, 3]])
    params = label_statistics.validate(2, stats=label_statistics.STATS, select="index", index=np.array([1, 2, 3]))
    table = label_statistics.reference(x, labels, **params)
    lay = label_statistics.Layout.of(EVERY, 2)
    # minima skip NaN unless all are NaN; maxima are NaN as soon as one is; ties: first element
    np.testing.assert_array_equal(table[:, lay.min], [1, np.nan, 0])
    np.testing.assert_array_equal(table[:, lay.min_position], [1, 3, 8])
    np.testing.assert_array_equal(table[:, lay.max], [np.nan, np.nan, 2])
    np.testing.assert_array_equal(table[:, lay.max_position], [0, 3, 10])


@pytest.mark.parametrize("select,kind", SELECTS)
def test_any_split_into_blocks_combines_to_the_whole(select, kind):
    rng = np.random.default_rng(1)
    x = random_array(rng, (40, 35), "float64")
    x[rng.random(x.shape) < 0.02] = np.nan
    labels, n = label_image(rng, x.shape)
    params = label_statistics.validate(2, stats=label_statistics.STATS, select=select, index=_index(kind, n))
    whole = label_statistics.reference(x, labels, **params)
    for cuts in (([0, 40], [0, 35]), ([0, 13, 14, 40], [0, 35]), ([0, 7, 21, 40], [0, 1, 20, 35])):
        rows = [label_statistics.partial(x[r0:r1, c0:c1], labels[r0:r1, c0:c1],
                                         **{**params, "origin": (r0, c0), "shape": x.shape})
                for r0, r1 in zip(cuts[0][:-1], cuts[0][1:])
                for c0, c1 in zip(cuts[1][:-1], cuts[1][1:])]
        rng.shuffle(rows)  # the combine does not depend on the order of the blocks
        assert_tables(label_statistics.finalize(np.concatenate(rows), None, **params), whole, f"cuts {cuts}")


def test_layout_and_parameters():
    lay = label_statistics.Layout.of(label_statistics.normalise_stats(("bbox", "com")), 3)
    assert lay.stats == ("count", "sum", "com", "bbox")
    assert (lay.key, lay.count, lay.sum, lay.com, lay.bbox_lo, lay.bbox_hi, lay.ncols) == \
        (0, 1, 2, 3, 6, 9, 12)
    assert lay.min is None and lay.m2 is None
    assert label_statistics.normalise_stats("min_position") == ("count", "min", "min_position")
    with pytest.raises(ValueError, match="unknown statistic 'perimeter'"):
        label_statistics.validate(2, stats=("sum", "perimeter"))
    with pytest.raises(ValueError, match="select='everything'"):
        label_statistics.validate(2, stats=("sum",), select="everything")
    with pytest.raises(ValueError, match="sorted, unique"):
        label_statistics.validate(2, stats=("sum",), select="index", index=[3, 1])
    with pytest.raises(ValueError, match="needs index="):
        label_statistics.validate(2, stats=("sum",), select="index")
    with pytest.raises(ValueError, match="goes with select='index'"):
        label_statistics.validate(2, stats=("sum",), select="labels", index=[1])
    with pytest.raises(TypeError, match="unexpected parameters"):
        label_statistics.validate(2, stats=("sum",), colour="red")
    with pytest.raises(ValueError, match="can be no label of dtype uint8"):
        label_statistics.partial(np.ones(3), np.ones(3, np.uint8), **label_statistics.validate(
            1, stats=("sum",), select="index", index=np.array([1, 300])))
    with pytest.raises(TypeError, match="boolean, integer or float images"):
        label_statistics.partial(np.ones(3, complex), np.ones(3, int), **label_statistics.validate(1, stats=("sum",)))


def test_label_keys_are_exact_equality():
    valid, keys = label_statistics.label_keys(np.array([1.0, 2.5, np.nan, -1.0, 300.0]), np.uint8)
    np.testing.assert_array_equal(valid, [True, False, False, False, False])
    assert keys.dtype == np.uint8 and keys[0] == 1
    valid, _ = label_statistics.label_keys(np.array([2**24, 2**24 + 1]), np.float32)
    np.testing.assert_array_equal(valid, [True, False])
    valid, keys = label_statistics.label_keys(np.array([0, 1, 2]), bool)
    np.testing.assert_array_equal(valid, [True, True, False])
    assert keys.dtype == np.uint8
    valid, _ = label_statistics.label_keys(np.array([2**63, 2**64 - 1], np.uint64), np.int64)
    np.testing.assert_array_equal(valid, [False, False])


@pytest.mark.parametrize("chunks", [(40, 35), (13, 35), (7, 9), (1, 35)])
def test_apply_numpy_and_dask(chunks):
    rng = np.random.default_rng(2)
    x = random_array(rng, (40, 35), "float32")
    labels, n = label_image(rng, x.shape)
    for select, kind in SELECTS:
        params = {"stats": label_statistics.STATS, "select": select, "index": _index(kind, n)}
        expected = brute_force(x, labels, select, params["index"])
        assert_tables(chunkernels.apply(x, "label_statistics", labels, **params), expected)
        dx = da.from_array(x, chunks=chunks)
        table = chunkernels.apply(dx, "label_statistics", da.from_array(labels, chunks=5),
                                  **params)
        assert table.shape[1] == expected.shape[1]
        assert np.isnan(table.shape[0]) == (select == "labels")
        ours = [k for k in dict(table.__dask_graph__()) if k[0].startswith("label_statistics")]
        assert len(ours) == dx.npartitions + 1
        assert_tables(table.compute(), expected, f"{select} {kind} {chunks}")


def test_check_passes_on_the_cpu():
    results = check(["label_statistics"], gpu=False)
    assert results and all(r.status == "pass" for r in results if r.cases), results


# -- the CUDA kernel ---------------------------------------------------------------------------------


def _views(rng):
    """(name, x, labels) on the layouts a Dask block can have, the label dtypes the slot maps
    treat differently, and the dims the walk handles specially."""
    x = random_array(rng, (64, 50), "float32")
    labels, n = label_image(rng, x.shape)
    yield "c", x, labels
    yield "fortran", np.asfortranarray(x), np.asfortranarray(labels)
    yield "sliced-reversed", x[::-2, 3:-3], labels[::-2, 3:-3]
    yield "transposed", x.T, labels.T
    yield "labels-broadcast", x, (labels[:1] > 0) * np.arange(50) % 7
    yield "float-labels", x, labels.astype(np.float32)
    yield "uint64-labels", x, labels.astype(np.uint64)
    yield "bool-labels", x, labels > 0
    for dtype in ("float64", "int8", "uint16", "int32", "int64", "uint64", "bool", "float16"):
        yield dtype, random_array(rng, (37, 29), dtype), label_image(rng, (37, 29))[0]
    yield "5-d", random_array(rng, (3, 4, 2, 5, 6), "float64"), rng.integers(0, 5, (3, 4, 2, 5, 6))
    yield "size-1-axes", random_array(rng, (1, 40, 1), "float64"), rng.integers(0, 5, (1, 40, 1))
    yield "0-d", np.array(2.5), np.array(1)
    yield "empty", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.int32)
    nan = random_array(rng, (30, 30), "float64")
    nan[rng.random(nan.shape) < 0.1] = np.nan
    yield "nan-ties", np.round(nan), label_image(rng, (30, 30))[0]


@pytest.mark.gpu
def test_gpu_matches_cpu_on_every_layout_and_slot_map():
    rng = np.random.default_rng(3)
    for name, x, labels in _views(rng):
        n = int(labels.max()) if labels.size else 0
        for select, index in (("labels", None), ("positive", None), ("all", None),
                              ("index", np.arange(1, n + 1)),                  # consecutive: range
                              ("index", np.arange(0, n + 9, 3)),               # compact: lookup
                              ("index", np.array([1, 3, 10**6]))):             # sparse: search
            if select == "index":
                valid, keys = label_statistics.label_keys(index, labels.dtype)
                index = np.unique(keys[valid])
            params = {"stats": label_statistics.STATS, "select": select, "index": index}
            expected = chunkernels.apply(x, "label_statistics", labels, **params)
            got = chunkernels.apply(to_device_view(x), "label_statistics",
                                    to_device_view(np.asarray(labels)), strict=True, **params)
            assert type(got).__module__.startswith("cupy")
            assert_tables(got, expected, f"{name} {select} {index is not None and index[:4]}")


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", [(64, 50), (16, 50), (7, 9)])
def test_gpu_dask_chunks_match_cpu(chunks):
    rng = np.random.default_rng(4)
    x = random_array(rng, (64, 50), "float32")
    labels, n = label_image(rng, x.shape)
    for select, index in (("labels", None), ("index", np.arange(1, n + 1))):
        params = {"stats": label_statistics.STATS, "select": select, "index": index}
        expected = chunkernels.apply(x, "label_statistics", labels, **params)
        dx = da.from_array(to_device_view(x), chunks=chunks, asarray=False)
        dl = da.from_array(to_device_view(labels), chunks=chunks, asarray=False)
        table = chunkernels.apply(dx, "label_statistics", dl, strict=True, **params)
        assert type(table._meta).__module__.startswith("cupy")
        assert_tables(table.compute(), expected, f"{select} chunks {chunks}")


@pytest.mark.gpu
def test_gpu_64_bit_walk():
    """More elements than a 32-bit index can walk: the kernels switch to 64-bit indices."""
    cp = pytest.importorskip("cupy")
    n = 2**31 + 4099
    x = cp.zeros(n, cp.uint8)
    x[-1], x[5] = 7, 7
    labels = cp.broadcast_to(cp.asarray([1], cp.int32), (n,))
    table = label_statistics.dispatch(x, labels, **label_statistics.validate(1, stats=label_statistics.STATS, select="positive"))
    lay = label_statistics.Layout.of(EVERY, 1)
    row = table[0].get()
    assert row[lay.count] == n and row[lay.sum] == 14
    assert row[lay.max] == 7 and row[lay.max_position] == 5
    assert row[lay.bbox_hi] == n - 1


def _blocks(x, labels, cuts):
    """``(origins, [(x block, labels block)])`` of ``x`` cut at ``cuts`` (per axis, the
    starts), in block order."""
    import itertools

    edges = [list(c) + [n] for c, n in zip(cuts, x.shape)]
    origins, blocks = [], []
    for index in itertools.product(*(range(len(e) - 1) for e in edges)):
        cut = tuple(slice(e[i], e[i + 1]) for e, i in zip(edges, index))
        origins.append(tuple(e[i] for e, i in zip(edges, index)))
        blocks.append((x[cut], labels[cut]))
    return origins, blocks


def _many_table(params, origins, blocks):
    rows_of = label_statistics._BlockRows(params, strict=True)
    parts = rows_of.many(origins, blocks)
    assert len(parts) == len(blocks)
    xp = chunkernels.cuda.array_module(parts[0])
    dtypes = (blocks[0][0].dtype, blocks[0][1].dtype)
    return label_statistics.finalize(xp.concatenate([xp.asarray(p) for p in parts]), dtypes,
                                     **params)


@pytest.mark.parametrize("select,kind", SELECTS)
def test_many_blocks_on_the_cpu_are_each_blocks(select, kind):
    """NumPy blocks of one task: each block's rows, as the block task gives them."""
    rng = np.random.default_rng(21)
    x = random_array(rng, (40, 33), "float32")
    labels, n = label_image(rng, x.shape)
    params = label_statistics.validate(2, stats=EVERY, select=select, index=_index(kind, n),
                                       shape=x.shape)
    origins, blocks = _blocks(x, labels, [(0, 13, 26), (0, 10)])
    parts = label_statistics._BlockRows(params, False).many(origins, blocks)
    for origin, (bx, bl), part in zip(origins, blocks, parts):
        np.testing.assert_array_equal(
            part, label_statistics._BlockRows(params, False)(origin, bx, bl))
    assert_tables(_many_table(params, origins, blocks), brute_force(x, labels, select,
                                                                    _index(kind, n)))


def _gpu_many_cases(rng):
    """(name, x, labels, cuts, layout) of blocks a GPU worker's task measures together."""
    x = random_array(rng, (64, 50), "float32")
    labels, _ = label_image(rng, x.shape)
    yield "even", x, labels, [(0, 16, 32, 48), (0, 25)]
    yield "uneven, a size-1 edge", x, labels, [(0, 21, 42, 63), (0, 17, 34)]  # rows 63: size 1
    yield "one block", x, labels, [(0,), (0,)]
    yield "blocks smaller than the labels", x, labels, [tuple(range(0, 64, 5)), tuple(range(0, 50, 7))]
    yield "int64 labels, 3-d", random_array(rng, (12, 10, 9), "float64"), \
        label_image(rng, (12, 10, 9))[0].astype(np.int64), [(0, 6), (0, 5), (0, 4)]
    yield "uint16 image, bool labels", random_array(rng, (30, 20), "uint16"), \
        rng.random((30, 20)) > 0.5, [(0, 10, 20), (0, 10)]
    wide = labels.astype(np.int64)
    wide[wide == 2] = 10**12  # the range of found labels too wide to hold as slots
    yield "a wide range of labels", x, wide, [(0, 32), (0, 25)]
    yield "float labels", x, labels.astype(np.float32), [(0, 32), (0, 25)]
    yield "no labels", x, np.zeros(x.shape, np.int32), [(0, 32), (0, 25)]


@pytest.mark.gpu
@pytest.mark.parametrize("select,kind", SELECTS)
@pytest.mark.parametrize("order", ["C", "F", "mixed", "reversed"])
def test_gpu_many_blocks_share_accumulators(select, kind, order):
    """A GPU worker's blocks measured together (one set of accumulators for the blocks of one
    layout) give the table of the whole array, in every layout and slot map."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(22)
    for name, x, labels, cuts in _gpu_many_cases(rng):
        n = int(np.unique(labels[labels > 0]).size)  # the wide case's are not 1..n
        index = _index(kind, n)
        if index is not None and labels.dtype == bool:  # boolean labels are 0 or 1
            index = index[index <= 1]
        expected = brute_force(x, labels, select, index)
        params = label_statistics.validate(x.ndim, stats=EVERY, select=select, index=index,
                                           shape=x.shape)
        origins, blocks = _blocks(x, labels, cuts)
        on_gpu = []
        for b, (bx, bl) in enumerate(blocks):
            fortran = order == "F" or (order == "mixed" and b % 2)
            if order == "reversed":  # negative strides: the same values read backwards
                gx = cp.asarray(np.ascontiguousarray(bx[::-1, ::-1]))[::-1, ::-1]
                gl = cp.asarray(np.ascontiguousarray(bl[::-1, ::-1]))[::-1, ::-1]
            else:
                as_order = np.asfortranarray if fortran else np.ascontiguousarray
                gx, gl = cp.asarray(as_order(bx)), cp.asarray(as_order(bl))
            on_gpu.append((gx, gl))
        assert_tables(_many_table(params, origins, on_gpu), expected, f"{name} {order}")


@pytest.mark.gpu
def test_gpu_found_labels_as_a_range_or_found_one_by_one(monkeypatch):
    """select='labels' takes the found labels' range as slots, or finds them with
    cupy.unique where the range would outweigh the labels: the same table either way."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(23)
    x = random_array(rng, (50, 40), "float64")
    labels, _ = label_image(rng, x.shape)
    params = label_statistics.validate(2, stats=("sum", "com"), select="labels")
    expected = label_statistics.reference(x, labels, **params)
    gx, gl = cp.asarray(x), cp.asarray(labels)
    calls = []
    unique = cp.unique
    monkeypatch.setattr(cp, "unique", lambda a, *args, **kw: calls.append(a.size) or unique(a, *args, **kw))
    assert_tables(label_statistics.dispatch(gx, gl, **params), expected, "range")
    assert not calls  # without count asked for, its column was added, then dropped
    monkeypatch.setattr(label_statistics, "_RANGE_FLOOR", 0)
    sparse = labels.astype(np.int64) * 10**6  # a range of 10**6 slots a label: too wide
    expected = label_statistics.reference(x, sparse, **params)
    assert_tables(label_statistics.dispatch(gx, cp.asarray(sparse), **params), expected, "unique")
    assert calls
