"""The halo exchange graph (``chunkernels._halo``): values, graph shape, strips, boundaries.

``box_sum`` is a separable N-d halo kernel with a radius and an edge mode per axis, so halos of
different depths, mixed per-axis boundaries (wrap on some axes only) and axes without a halo are
all exercised. Values are small integers: every sum is exact, and any difference is a real one.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from conftest import MODES, moving_sum_reference, random_array
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkernels
from chunkernels import KernelSpecError
from chunkernels import _halo
from chunkernels._halo import _axis_plan
from chunkernels.testing import assert_close


def _per_axis(value, ndim):
    return tuple(value) if isinstance(value, tuple | list) else (value,) * ndim


def box_sum_reference(x, *, radius=1, mode="reflect"):
    """Sum over a box of ``2 * radius + 1`` per axis, ``mode`` (per axis) at the edges."""
    out = x
    for axis, (r, m) in enumerate(zip(_per_axis(radius, x.ndim), _per_axis(mode, x.ndim))):
        out = ndi.correlate1d(out, np.ones(2 * r + 1, dtype=x.dtype), axis=axis, mode=m)
    return out


def _box_validate(ndim, radius=1, mode="reflect"):
    radius, mode = _per_axis(radius, ndim), _per_axis(mode, ndim)
    if len(radius) != ndim or len(mode) != ndim:
        raise ValueError(f"radius and mode need one value per axis ({ndim})")
    return {"radius": tuple(int(r) for r in radius), "mode": tuple(mode)}


BOX_SUM = chunkernels.KernelSpec(
    name="box_sum",
    cpu=box_sum_reference,
    validate=_box_validate,
    halo=lambda ndim, radius, mode: radius,
    halo_rule="radius (per axis)",
    # wrap needs the other end of the array; every other mode the kernel applies at the edge
    boundary=lambda radius, mode: {a: "periodic" if m == "wrap" else "none"
                                   for a, m in enumerate(mode)},
    dtypes=("float64", "int64"),
)


@pytest.fixture
def box_sum():
    return chunkernels.register(BOX_SUM)


def _same(block):
    return block


def dask_input(x_np, chunks, held=True):
    """``x_np`` as a Dask array whose blocks are in memory (``held``), or still to be computed
    (a ``map_blocks`` task per block, whose results keep the blocks' layout): the halo exchange
    takes the first into its tasks and cuts strips from the second in strip tasks."""
    x = da.from_array(x_np, chunks=chunks)
    return x if held else x.map_blocks(_same, dtype=x.dtype)


def apply_box(x_np, chunks, held=True, **params):
    x = dask_input(x_np, chunks, held)
    z = chunkernels.apply(x, "box_sum", **params)
    assert z.chunks == x.chunks
    return z


CASES = [
    # shape, chunks, radius, mode
    ((17,), 5, 2, "reflect"),
    ((17,), 1, 3, "wrap"),                          # wrap across many chunks, halo > chunk
    ((17,), (3, 1, 9, 4), 4, "nearest"),            # uneven, halo wider than two neighbours
    ((9, 11), (4, 3), (1, 2), ("constant", "wrap")),  # per-axis depth and boundary
    ((9, 11), (2, 5), (3, 0), ("wrap", "mirror")),  # no halo on axis 1
    ((9, 11), (9, 2), (2, 3), "wrap"),              # axis 0 one chunk: no exchange along it
    ((9, 11), (1, 1), (2, 2), ("mirror", "wrap")),  # every chunk smaller than the halo
    ((6, 7, 8), (2, 3, 3), (1, 2, 1), ("wrap", "reflect", "wrap")),
    ((6, 7, 8), (5, 2, (1, 6, 1)), 1, "nearest"),
    ((6, 7, 8), (1, 7, 3), (5, 3, 7), ("wrap", "wrap", "reflect")),  # halo of nearly the array
]


HELD = pytest.mark.parametrize("held", [True, False], ids=["in-memory", "lazy"])


@pytest.mark.parametrize("shape, chunks, radius, mode", CASES, ids=str)
@pytest.mark.parametrize("dtype", ["int64", "float64"])
@HELD
def test_box_sum_matches_the_whole_array_reference(box_sum, shape, chunks, radius, mode, dtype,
                                                   held):
    x_np = random_array(np.random.default_rng(0), shape, dtype)
    z = apply_box(x_np, chunks, held, radius=radius, mode=mode)
    assert z.dtype == x_np.dtype
    assert_close(z.compute(), box_sum_reference(x_np, radius=radius, mode=mode))


@pytest.mark.parametrize("order", ["C", "F"])
@HELD
def test_fortran_order_and_views(box_sum, order, held):
    base = np.asarray(random_array(np.random.default_rng(1), (14, 16), "int64"), order=order)
    for x_np in (base, base[::-1, 1::2], base.T):
        z = apply_box(x_np, (4, 3), held, radius=(2, 1), mode=("wrap", "reflect"))
        assert_close(z.compute(), box_sum_reference(x_np, radius=(2, 1), mode=("wrap", "reflect")))


SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def box_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    chunks = tuple(tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=12)))
                   for _ in shape)
    chunks = tuple(_fit(c, n) for c, n in zip(chunks, shape))
    radius = tuple(draw(st.integers(0, max(0, n - 1))) for n in shape)  # smaller than the array
    mode = tuple(draw(st.sampled_from(MODES)) for _ in shape)
    return shape, chunks, radius, mode


def _fit(sizes, n):
    """Chunk sizes from ``sizes`` cut to sum to ``n`` (padded with the remainder)."""
    out, total = [], 0
    for s in sizes:
        s = min(s, n - total)
        if s <= 0:
            break
        out.append(s)
        total += s
    if total < n:
        out.append(n - total)
    return tuple(out)


@SETTINGS
@given(case=box_cases(), held=st.booleans())
def test_box_sum_is_chunking_invariant(box_sum, case, held):
    shape, chunks, radius, mode = case
    x_np = random_array(np.random.default_rng(2), shape, "int64")
    z = apply_box(x_np, chunks, held, radius=radius, mode=mode)
    assert_close(z.compute(), box_sum_reference(x_np, radius=radius, mode=mode),
                 err_msg=f"chunks {chunks}")


# -- the graph --------------------------------------------------------------------------------


def _layer(z):
    (name,) = [n for n in z.dask.layers if n.startswith("box_sum-overlap")]
    return z.dask.layers[name]


def test_two_tasks_per_block_and_only_strips_from_neighbours(box_sum):
    x = dask_input(np.zeros((64, 64)), 4, held=False)  # 16 x 16 blocks, each a task
    z = chunkernels.apply(x, "box_sum", radius=1)
    layer = dict(_layer(z))
    strips = [k for k in layer if k[0].endswith("-strips-0")]
    kernels = [k for k in layer if k[0] == z.name]
    assert len(strips) == len(kernels) == 256 and len(layer) == 512
    for key in strips:  # a strip task reads its own block, nothing else
        assert layer[key].dependencies == {(x.name, *key[1:])}
    for key in kernels:  # a kernel task: its core block and its neighbours' strips
        i, j = key[1:]
        neighbours = {(z.name + "-strips-0", a, b)
                      for a in range(max(0, i - 1), min(16, i + 2))
                      for b in range(max(0, j - 1), min(16, j + 2)) if (a, b) != (i, j)}
        assert layer[key].dependencies == {(x.name, i, j)} | neighbours


def test_strips_are_thin_copies(box_sum):
    x_np = np.arange(30 * 40, dtype="float64").reshape(30, 40)
    x = dask_input(x_np, (10, 10), held=False)
    z = chunkernels.apply(x, "box_sum", radius=(2, 3))
    layer = dict(_layer(z))
    graph = {**dict(x.dask), **layer}
    strips = dask.get(graph, (z.name + "-strips-0", 1, 1))  # an interior block
    core = x_np[10:20, 10:20]
    # faces, edges and corners its eight neighbours need, each as thick as the halo
    assert sorted(s.shape for s in strips) == sorted([(2, 10)] * 2 + [(10, 3)] * 2 + [(2, 3)] * 4)
    assert sum(s.size for s in strips) == 2 * 2 * 10 + 2 * 3 * 10 + 4 * 2 * 3
    for s in strips:
        assert s.flags.c_contiguous and not np.shares_memory(s, core)


def test_single_chunk_axes_and_zero_radius_exchange_nothing(box_sum):
    x = dask_input(np.zeros((8, 12)), (8, 3), held=False)
    z = chunkernels.apply(x, "box_sum", radius=(3, 1))
    strips = dask.get({**dict(x.dask), **dict(_layer(z))}, (z.name + "-strips-0", 0, 1))
    assert {s.shape for s in strips} == {(8, 1)}  # along axis 1 only, the whole of axis 0
    z = chunkernels.apply(x, "box_sum", radius=(3, 0))
    assert not any("overlap" in name for name in z.dask.layers)  # map_blocks: no halo at all


def test_blocks_in_memory_go_into_one_task_per_block_uncut(box_sum):
    x_np = np.arange(30 * 40, dtype="float64").reshape(30, 40)
    x = dask_input(x_np, (10, 10))  # 3 x 4 blocks, already in memory
    blocks = dict(x.dask)
    z = chunkernels.apply(x, "box_sum", radius=(2, 3))
    graph = dict(z.__dask_graph__())
    # no strip tasks, no input nodes: one task per block, none depending on another
    assert set(graph) == {(z.name, i, j) for i in range(3) for j in range(4)}
    assert all(not task.dependencies for task in graph.values())
    _, plan, cores, pieces = graph[(z.name, 1, 1)].args  # an interior block
    (core,), (held,) = cores, pieces
    assert core is blocks[(x.name, 1, 1)]
    # its eight neighbours, uncut, with the slices of the faces, edges and corners it needs
    neighbours = [blocks[(x.name, a, b)] for a in (0, 1, 2) for b in (0, 1, 2) if (a, b) != (1, 1)]
    assert all(isinstance(p, _halo.Held) for p in held)
    assert sorted(id(p.block) for p in held) == sorted(map(id, neighbours))
    shapes = sorted(p.array().shape for p in held)
    assert shapes == sorted([(2, 10)] * 2 + [(10, 3)] * 2 + [(2, 3)] * 4)
    lazy = chunkernels.apply(dask_input(x_np, (10, 10), held=False), "box_sum", radius=(2, 3))
    assert z.name.startswith("box_sum-overlap-") and z.chunks == lazy.chunks == x.chunks
    assert_close(z.compute(), lazy.compute())
    assert_close(z.compute(), box_sum_reference(x_np, radius=(2, 3)))


@pytest.mark.parametrize("shape, chunks, radius, mode", CASES, ids=str)
def test_grouped_tasks_give_the_per_block_result(box_sum, monkeypatch, shape, chunks, radius,
                                                 mode):
    """Blocks in memory run in group tasks of at most GROUP_BYTES of output, each output block
    a pick from its group; the values are those of a task per block. (CuPy blocks are grouped;
    NumPy blocks stand in for them here: the graph is the same.)"""
    rng = np.random.default_rng(31)
    x_np = random_array(rng, shape, "int64")
    per_block = apply_box(x_np, chunks, radius=radius, mode=mode)
    monkeypatch.setattr(_halo, "group_blocks", lambda held: None not in held)
    monkeypatch.setattr(_halo, "GROUP_BYTES", 3 * 8 * x_np.size // 10)  # a few groups
    x = dask_input(x_np, chunks)
    z = chunkernels.apply(x, "box_sum", radius=radius, mode=mode)
    graph = dict(z.__dask_graph__())
    groups = {k: t for k, t in graph.items() if k[0] == f"{z.name}-group"}
    picks = {k: t for k, t in graph.items() if k[0] == z.name}
    assert set(picks) == {(z.name, *i) for i in np.ndindex(*x.numblocks)}
    assert len(graph) == len(groups) + len(picks)
    assert all(t.dependencies <= set(groups) and len(t.dependencies) == 1 for t in picks.values())
    assert all(not t.dependencies for t in groups.values())
    # every group holds at most GROUP_BYTES of output, or one block
    members = {g: [k for k, t in picks.items() if g in t.dependencies] for g in groups}
    for g, keys in members.items():
        sizes = [8 * int(np.prod([c[i] for c, i in zip(x.chunks, k[1:])])) for k in keys]
        assert len(keys) == 1 or sum(sizes) <= _halo.GROUP_BYTES, (g, sizes)
    assert sum(map(len, members.values())) == len(picks)
    for scheduler in ("sync", "threads"):
        assert_close(z.compute(scheduler=scheduler), per_block.compute())
    assert_close(z.compute(), box_sum_reference(x_np, radius=radius, mode=mode))


STACK_CASES = [
    # filter, params, shape, chunks
    ("gaussian_filter", {"sigma": 1.5, "mode": "reflect"}, (40, 33), (10, 9)),
    ("gaussian_filter", {"sigma": (2.0, 0.7), "order": (1, 0), "mode": ("wrap", "mirror")},
     (40, 33), (13, (5, 20, 8))),
    ("gaussian_filter", {"sigma": 2.0, "mode": "constant", "cval": 0.5, "axes": (0, 2)},
     (30, 7, 26), (2, 7, 4)),  # chunks smaller than the halo, an axis not filtered
    ("uniform_filter", {"size": 4, "mode": "nearest"}, (31, 26), (8, 8)),
    ("uniform_filter", {"size": (3, 5), "mode": "wrap", "axes": (1, 0)}, (31, 26), (31, 6)),
    ("correlate1d", {"weights": [0.5, -1.0, 2.0, 0.25], "axis": 0, "mode": "mirror"}, (30, 20),
     (7, 10)),
    ("correlate1d", {"weights": [1.0, 2.0, 1.0], "axis": -1, "mode": "reflect"}, (9, 30),
     (3, 4)),
    # their ``sigma`` and ``radius`` are per axis of the input: the stack gains the new axis's
    ("gaussian_laplace", {"sigma": 1.5, "mode": "wrap"}, (40, 33), (10, 11)),
    ("gaussian_laplace", {"sigma": (1.0, 2.0), "axes": (1, 0), "mode": ("reflect", "nearest")},
     (40, 33), (10, 11)),
    ("gaussian_laplace", {"sigma": (1.0, 0.7), "axes": (2, 0)}, (12, 9, 14), (4, 9, 5)),
    ("gaussian_gradient_magnitude", {"sigma": (1.0, 2.0)}, (40, 33), (10, 11)),
    ("gaussian_gradient_magnitude", {"sigma": (1.5, 1.0, 0.5), "axes": (0, 2), "radius": (3, 2, 2)},
     (12, 9, 14), (4, 9, 5)),
]


@pytest.mark.parametrize("kernel, params, shape, chunks", STACK_CASES, ids=str)
def test_blocks_of_one_shape_run_as_a_stack(monkeypatch, kernel, params, shape, chunks):
    """In a group, blocks of one extended shape run as one stack (KernelSpec.stack): the same
    values as a block at a time, and as SciPy. (NumPy blocks stand in for CuPy ones.)"""
    from chunkernels._apply import BlockFunction
    from chunkernels import ndimage

    rng = np.random.default_rng(32)
    x_np = rng.standard_normal(shape)
    want = getattr(ndi, kernel)(x_np, **params)
    per_block = getattr(ndimage, kernel)(da.from_array(x_np, chunks=chunks), **params).compute()
    monkeypatch.setattr(_halo, "group_blocks", lambda held: None not in held)
    calls = []
    stacked = BlockFunction.stacked
    monkeypatch.setattr(BlockFunction, "stacked",
                        lambda self, stack: calls.append(stack.shape) or stacked(self, stack))
    got = getattr(ndimage, kernel)(da.from_array(x_np, chunks=chunks), **params).compute()
    assert calls and all(len(s) == len(shape) + 1 and s[0] > 1 for s in calls)
    np.testing.assert_array_equal(got, per_block)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # a stack that does not fit in device memory runs block by block
    monkeypatch.setattr(BlockFunction, "stacked",
                        lambda self, stack: (_ for _ in ()).throw(MemoryError("out of memory")))
    got = getattr(ndimage, kernel)(da.from_array(x_np, chunks=chunks), **params).compute()
    np.testing.assert_array_equal(got, per_block)


def test_only_cupy_blocks_in_memory_are_grouped(box_sum):
    """NumPy blocks keep a task each (the CPU kernels run in parallel threads), and lazy inputs
    their strip tasks: neither is grouped."""
    x_np = np.arange(30 * 40, dtype="float64").reshape(30, 40)
    for held in (True, False):
        z = apply_box(x_np, (10, 10), held, radius=(2, 3))
        assert not any(str(k[0]).endswith("-group") for k in dict(z.__dask_graph__()))
    assert not _halo.group_blocks([None]) and not _halo.group_blocks([{}])
    assert not _halo.group_blocks([{(0, 0): x_np}])


def test_a_held_piece_serialises_as_the_piece_alone():
    import pickle

    block = np.arange(100.0).reshape(10, 10)
    piece = pickle.loads(pickle.dumps(_halo.Held(block, (slice(8, 10), slice(3, 6)))))
    assert isinstance(piece, _halo.Held) and piece.block.shape == (2, 3)
    np.testing.assert_array_equal(piece.array(), block[8:10, 3:6])


def _strip_pieces(xp):
    rng = np.random.default_rng(3)
    return [xp.asarray(rng.random((3, 5))), xp.asarray(rng.integers(0, 9, (7,), dtype=np.int8)),
            xp.asarray(rng.random((2, 0))), xp.asarray(np.arange(6, dtype=np.complex64))[::-2],
            xp.asarray(rng.random((4, 6)).astype(np.float32)).T]


def test_strips_between_workers_travel_as_one_host_buffer():
    """The strips one worker sends another: one aligned host buffer, any dtypes and layouts
    (views, empty pieces), pickled with their values."""
    import pickle

    pieces = _strip_pieces(np)
    strips = pickle.loads(pickle.dumps(_halo.Strips.of(pieces)))
    assert isinstance(strips, _halo.Strips) and not strips.gpu and len(strips) == len(pieces)
    assert strips.host.dtype == np.uint8 and strips.host.ndim == 1
    assert all(offset % _halo.Strips.ALIGN == 0 for offset, _, _ in strips.layout)
    for i, p in enumerate(pieces):
        assert strips[i].dtype == p.dtype and strips[i].shape == p.shape
        np.testing.assert_array_equal(strips[i], p)
    assert strips.__sizeof__() == strips.host.nbytes
    blocks = [np.arange(20.0).reshape(4, 5), np.arange(12.0).reshape(3, 4).T]
    part = _halo.cut_many(blocks, np.array([(0, 1, 3, 2, 5), (1, 0, 4, 2, 3), (0, 0, 0, 0, 5)]))
    assert len(part) == 3
    np.testing.assert_array_equal(part[0], blocks[0][1:3, 2:5])
    np.testing.assert_array_equal(part[1], blocks[1][0:4, 2:3])
    assert part[2].shape == (0, 5)


def test_group_results_are_no_sequence_dask_cuda_would_spill():
    """A group task's results on a cluster: indexed, counted and iterated as a list, pickled
    with their values, but neither a list nor a tuple (dask-cuda spills those when they hold
    device arrays, which its picks also hold: a copy to the host that frees nothing) and small
    to Dask's ``sizeof`` (the arrays count once, as the picks' results)."""
    import pickle

    from dask.sizeof import sizeof

    blocks = [np.full((256, 256), i, np.float32) for i in range(3)]
    group = _halo.GroupResults(blocks)
    assert not isinstance(group, (list, tuple, set, frozenset, dict))
    assert not hasattr(group, "__cuda_array_interface__")
    assert len(group) == 3 and group[2] is blocks[2] and list(group) == blocks
    assert sizeof(group) < 1024 < blocks[0].nbytes
    again = pickle.loads(pickle.dumps(group))
    assert isinstance(again, _halo.GroupResults)
    for got, want in zip(again, blocks):
        np.testing.assert_array_equal(got, want)
    assert _halo.picked(group, 1) is blocks[1]


@pytest.mark.gpu
def test_gpu_strips_are_cut_to_the_host_and_uploaded_once():
    import pickle

    cp = chunkernels.cuda.cupy()
    pieces = _strip_pieces(cp)
    strips = _halo.Strips.of(pieces)
    assert strips.gpu and isinstance(strips.host, np.ndarray)
    back = pickle.loads(pickle.dumps(strips))
    first = back[0]
    assert chunkernels.cuda.is_cupy_array(first)
    assert back[1].data.ptr - first.data.ptr == back.layout[1][0]  # views of one upload
    for i, p in enumerate(pieces):
        assert cp.array_equal(back[i], p) and back[i].dtype == p.dtype


def _run_gather_kernel(words, shape, dtype):
    """What kernels_cuda/halo_gather.cu computes from its plan, step by step in Python: for each
    element of the buffer, the segment along every axis, the piece they select, and a read at that
    piece's address plus the offset its strides give (from this process's memory)."""
    import ctypes

    dims, segs, pieces = _halo.GATHER_DIMS, _halo.GATHER_SEGMENTS, _halo.GATHER_PIECES
    padded = words[:dims]
    seg = words[dims:dims * (segs + 1)].reshape(dims, segs)
    nseg = words[dims * (segs + 1):dims * (segs + 2)]
    src = words[dims * (segs + 2):dims * (segs + 2) + pieces]
    stride = words[dims * (segs + 2) + pieces:].reshape(pieces, dims)
    assert words.size == _halo.GATHER_WORDS and tuple(padded[dims - len(shape):]) == shape
    itemsize = np.dtype(dtype).itemsize
    out = np.empty(tuple(padded), dtype)
    for p in np.ndindex(*out.shape):
        s = [max(i for i in range(n) if seg[a, i] <= p[a]) for a, n in enumerate(nseg)]
        k = np.ravel_multi_index(s, tuple(nseg))
        offset = sum((p[a] - seg[a, s[a]]) * stride[k, a] for a in range(dims))
        raw = (ctypes.c_char * itemsize).from_address(int(src[k]) + int(offset) * itemsize)
        out[p] = np.frombuffer(raw, dtype)[0]
    return out.reshape(shape)


@pytest.mark.parametrize("shape, chunks, radius, mode", [
    ((17,), (3, 1, 9, 4), 4, "nearest"),
    ((9, 11), (4, 3), (1, 2), ("constant", "wrap")),
    ((9, 11), (1, 1), (2, 2), ("mirror", "wrap")),  # 25 pieces, 5 segments per axis
    ((6, 7, 8), (2, 3, 3), (1, 2, 1), ("wrap", "reflect", "wrap")),
], ids=str)
@pytest.mark.parametrize("view", ["C", "reversed", "transposed"])
def test_gather_plan_assembles_what_slice_assignment_does(box_sum, shape, chunks, radius, mode,
                                                         view):
    base = random_array(np.random.default_rng(8), shape, "int64")
    x_np = {"C": base, "reversed": base[::-1], "transposed": base.T.copy().T}[view]
    z = chunkernels.apply(dask_input(x_np, chunks), "box_sum", radius=radius, mode=mode)
    extended = 0
    for task in dict(z.__dask_graph__()).values():
        _, plan, (core,), (pieces,) = task.args
        shape_, _, _, offsets, core_at = plan
        words = _halo.gather_words(shape_, offsets, core_at, core, pieces)
        expected = _halo._extend(np, plan, core, pieces)
        np.testing.assert_array_equal(_run_gather_kernel(words, shape_, x_np.dtype), expected)
        extended += 1
    assert extended == z.npartitions


def test_gather_plan_limits():
    # beyond what the kernel walks, the caller assigns slices instead
    block = np.zeros((1,) * 5)
    assert _halo.gather_words((2,) * 5, ((0, 1),) * 5, 0, block, [block] * 31) is None  # 5 dims
    assert _halo.gather_words((9,), (tuple(range(9)),), 0, block[0, 0, 0, 0],
                              [block[0, 0, 0, 0]] * 8) is None  # 9 segments along an axis
    cube = np.zeros((1, 1, 1))
    assert _halo.gather_words((5, 5, 5), (tuple(range(5)),) * 3, 0, cube,
                              [cube] * 124) is None  # 125 pieces
    odd = np.ndarray((2,), dtype=np.int16, buffer=np.zeros(8, np.uint8), strides=(3,))
    assert _halo.gather_words((2,), ((0, 1),), 0, odd[:1], [odd[1:]]) is None  # 1.5 elements
    assert _halo.gather_words((2,), ((0, 1),), 0, block[0, 0, 0, 0], [block[0, 0, 0, 0]]) \
        is not None


def test_persisted_blocks_go_into_the_tasks(box_sum):
    x_np = random_array(np.random.default_rng(6), (12, 10), "int64")
    x = dask_input(x_np, (5, 4), held=False).persist(scheduler="threads")
    z = chunkernels.apply(x, "box_sum", radius=1, mode="wrap")
    assert {key[0] for key in dict(z.__dask_graph__())} == {z.name}
    assert_close(z.compute(), box_sum_reference(x_np, radius=1, mode="wrap"))


def test_keys_are_deterministic(box_sum):
    x = da.from_array(np.zeros((8, 12)), chunks=(4, 3))
    a = chunkernels.apply(x, "box_sum", radius=1, mode="wrap")
    b = chunkernels.apply(x, "box_sum", radius=1, mode="wrap")
    c = chunkernels.apply(x, "box_sum", radius=1, mode="reflect")
    assert a.name == b.name != c.name
    assert dict(_layer(a)).keys() == dict(_layer(b)).keys()


def test_axis_plan_wraps_and_gathers():
    # chunks (2, 3, 1), depth 4, periodic: block 1 covers [2, 5), extended [-2, 9) mod 6
    plans = _axis_plan((2, 3, 1), 4, periodic=True)
    segments, core = plans[1]
    assert segments == [(1, 2, 3, 0), (2, 0, 1, 1), (0, 0, 2, 2), (1, 0, 3, 4), (2, 0, 1, 7),
                        (0, 0, 2, 8), (1, 0, 1, 10)]
    assert core == 3
    segments, core = _axis_plan((2, 3, 1), 4, periodic=False)[1]
    assert segments == [(0, 0, 2, 0), (1, 0, 3, 2), (2, 0, 1, 5)] and core == 1  # clipped
    assert _axis_plan((2, 0, 3), 1, periodic=False)[1] is None  # an empty block


def test_empty_chunks(box_sum):
    x_np = random_array(np.random.default_rng(3), (5, 7), "int64")
    x = da.from_array(x_np, chunks=((2, 0, 3), (3, 0, 2, 2)))
    z = chunkernels.apply(x, "box_sum", radius=(1, 2), mode="wrap")
    assert_close(z.compute(), box_sum_reference(x_np, radius=(1, 2), mode="wrap"))


@pytest.mark.parametrize("boundary, message", [
    ("reflect", r"boundary\(\) returned \{0: 'reflect', 1: 'reflect'\}; expected one of "
                r"\('none', 'periodic'\) per axis"),
    (("none", "wrap"), r"returned \{1: 'wrap'\}; expected one of \('none', 'periodic'\)"),
    ({2: "none"}, r"boundary\(\) returned axis 2 for a 2-d input; expected axes in range\(2\)"),
    (["none"], r"boundary\(\) returned \['none'\] for a 2-d input; expected 'none', "
               r"'periodic', a dict of them per axis or a sequence of 2"),
])
def test_boundary_values_are_checked(boundary, message):
    import dataclasses

    chunkernels.register(dataclasses.replace(BOX_SUM, boundary=lambda **_: boundary))
    with pytest.raises(KernelSpecError, match=message):
        chunkernels.apply(da.zeros((4, 4), chunks=2), "box_sum", radius=1)


def test_negative_axis_in_a_boundary_dict():
    import dataclasses

    chunkernels.register(dataclasses.replace(
        BOX_SUM, boundary=lambda radius, mode: {-1: "periodic"} if mode[-1] == "wrap" else "none"))
    x_np = random_array(np.random.default_rng(4), (6, 9), "int64")
    z = apply_box(x_np, (2, 4), radius=2, mode=("reflect", "wrap"))
    assert_close(z.compute(), box_sum_reference(x_np, radius=2, mode=("reflect", "wrap")))


# -- on a distributed cluster -------------------------------------------------------------------


def test_kernel_tasks_run_where_their_core_block_lives(moving_sum):
    from distributed import futures_of, wait

    x_np = random_array(np.random.default_rng(5), (64, 4096), "float64")
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            chunkernels.cluster.client(gpus=0, processes=True, n_workers=2, threads=1,
                                       dashboard_address=None) as c:
        x = c.persist(da.from_array(x_np, chunks=(64, 512)))  # 8 blocks of 256 KiB
        wait(x)
        c.rebalance(futures_of(x))
        z = c.persist(chunkernels.apply(x, "moving_sum", radius=3, mode="wrap"))
        wait(z)
        where = {f.key[1:]: c.who_has([f])[f.key] for f in futures_of(x)}
        assert len({w for ws in where.values() for w in ws}) == 2  # both workers hold blocks
        for f in futures_of(z):
            assert c.who_has([f])[f.key] == where[f.key[1:]], f.key
        assert_close(z.compute(), moving_sum_reference(x_np, radius=3, mode="wrap"))


def test_blocks_in_memory_run_on_a_cluster_and_ship_only_their_strips(moving_sum):
    import pickle

    x_np = random_array(np.random.default_rng(12), (64, 4096), "float64")
    x = da.from_array(x_np, chunks=(64, 512))  # in memory here: the tasks carry the blocks
    z = chunkernels.apply(x, "moving_sum", radius=3, mode="wrap")
    for task in dict(z.__dask_graph__()).values():  # a task serialises its core and strips only
        _, _, (core,), (pieces,) = task.args
        strips = sum(p.array().nbytes for p in pieces)
        assert len(pickle.dumps(task)) < core.nbytes + strips + 4096
    with chunkernels.cluster.client(gpus=0, processes=True, n_workers=2, threads=1,
                                    dashboard_address=None):
        assert_close(z.compute(), moving_sum_reference(x_np, radius=3, mode="wrap"))


# -- CuPy blocks ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bool", "int8", "float16", "float32", "int64", "complex128"])
@pytest.mark.parametrize("view", ["C", "reversed", "transposed"])
def test_gather_kernel_assembles_what_slice_assignment_does(box_sum, dtype, view):
    from chunkernels.testing import to_device_view

    cp = chunkernels.cuda.cupy()
    rng = np.random.default_rng(9)
    for shape, chunks, radius, mode in [((9, 11), (4, 3), (1, 2), ("constant", "wrap")),
                                        ((9, 11), (1, 1), (2, 2), ("mirror", "wrap")),
                                        ((6, 7, 8), (2, 3, 3), (1, 2, 1), "wrap")]:
        base = (rng.integers(-100, 100, size=shape) + (1j if dtype == "complex128" else 0))
        base = base.astype(dtype)
        x_np = {"C": base, "reversed": base[::-1], "transposed": base.T.copy().T}[view]
        z = chunkernels.apply(dask_input(x_np, chunks), "box_sum", radius=radius, mode=mode)
        for task in dict(z.__dask_graph__()).values():
            _, plan, (core,), (held,) = task.args
            shape_, _, _, offsets, core_at = plan
            expected = cp.asarray(_halo._extend(np, plan, core, held))
            # pieces read in place from the blocks, or strips cut out of them (strip tasks)
            for pieces in ([_halo.Held(to_device_view(p.block), p.cut) for p in held],
                           [to_device_view(p.array()) for p in held]):
                buf = cp.empty(shape_, dtype)
                assert _halo._gather(buf, offsets, core_at, to_device_view(core), pieces)
                assert cp.array_equal(buf, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, params, shape, chunks", STACK_CASES, ids=str)
@pytest.mark.parametrize("view", ["C", "fortran", "reversed"])
def test_cupy_stacks_equal_a_block_at_a_time_bit_for_bit(monkeypatch, kernel, params, shape,
                                                        chunks, view):
    """CuPy blocks in memory run in a group task, those of one extended shape as one stack:
    bit for bit what a task per block gives, for blocks of any layout."""
    from chunkernels import ndimage
    from chunkernels.testing import to_device_view

    cp = chunkernels.cuda.cupy()
    base = np.random.default_rng(33).standard_normal(shape).astype("float32")
    x_np = {"C": base, "fortran": np.asfortranarray(base), "reversed": base[::-1, ::-1]}[view]
    dx = da.from_array(to_device_view(x_np), chunks=chunks, asarray=False).persist()
    z = getattr(ndimage, kernel)(dx, **params)
    assert any(k[0] == f"{z.name}-group" for k in dict(z.__dask_graph__()))
    grouped = z.compute()
    monkeypatch.setattr(_halo, "group_blocks", lambda held: False)
    per_block = getattr(ndimage, kernel)(dx, **params).compute()
    assert cp.array_equal(grouped, per_block)
    np.testing.assert_allclose(grouped.get(), getattr(ndi, kernel)(x_np, **params),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reflect", "wrap", "constant"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "uint8"])
def test_cupy_chunks_give_the_whole_array_result_bit_for_bit(mode, dtype):
    """gaussian_filter on the GPU: chunked (blocks in memory, run in group tasks, or lazy with
    strip tasks) equals the whole-array result exactly, however the halo is gathered (one
    launch, or slices where a block's halo spans more pieces than the gather takes)."""
    from chunkernels import ndimage

    cp = chunkernels.cuda.cupy()
    x = cp.asarray(random_array(np.random.default_rng(10), (61, 45), "int64") % 200).astype(dtype)
    whole = ndimage.gaussian_filter(x, 2.0, mode=mode, cval=1.5)  # radius 8
    for chunks in [(16, 16), (20, 7), (5, 45), (2, 3)]:  # (2, 3): more segments than the gather's
        lazy = da.from_array(x, chunks=chunks, asarray=False)
        held = lazy.persist(scheduler="threads")
        for dx in (lazy, held):
            z = ndimage.gaussian_filter(dx, 2.0, mode=mode, cval=1.5)
            assert type(z._meta) is cp.ndarray and z.dtype == whole.dtype
            if dx is held:  # in memory, on a local scheduler: one group task (a small array)
                groups = [k for k in dict(z.__dask_graph__()) if k[0] == f"{z.name}-group"]
                assert len(groups) == 1
            got = z.persist(scheduler="threads").compute(scheduler="threads")
            assert cp.array_equal(got, whole), (chunks, dx is held)
