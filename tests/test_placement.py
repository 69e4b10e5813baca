"""Placement over a cluster and graph shapes chosen where a graph runs (the graph layer).

On CPU worker processes (a ``distributed.LocalCluster``) here, on GPU workers in the ``multigpu``
tests: blocks are placed in contiguous, balanced tiles (``chunkernels.cluster.distribute``); a
halo exchange over placed blocks reads same-worker neighbours in place and sends the strips that
cross workers in one batch per pair of workers; a graph built with no client and computed on a
cluster spreads over its workers; every result equals SciPy's.
"""

from __future__ import annotations

import collections
import inspect

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi

from chunkernels import _graph, _halo, cluster, ndimage
from chunkernels.testing import assert_close, graph_on_a_cluster

QUIET = {"dashboard_address": None}


def processes(n=2):
    return cluster.client(gpus=0, processes=True, n_workers=n, threads=1, **QUIET)


# -- tiles -------------------------------------------------------------------------------------


@pytest.mark.parametrize("numblocks", [(8, 8), (8,), (3, 5), (4, 6, 2), (1, 7), (6, 1), (1,),
                                       (2, 2, 2, 2)])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_tiles_are_balanced_and_cover_every_block(numblocks, n):
    owner = _graph.tiles(numblocks, n)
    assert set(owner) == set(np.ndindex(*numblocks))
    counts = collections.Counter(owner.values())
    assert set(counts) <= set(range(n))
    total = int(np.prod(numblocks))
    used = min(n, total)
    assert len(counts) == used
    assert max(counts.values()) - min(counts.values()) <= 1


@pytest.mark.parametrize("numblocks, n, cut", [
    ((8, 8), 2, "rows"),       # slabs along the first axis
    ((8, 8), 4, "quarters"),   # 2 x 2 tiles cut less than 4 slabs
    ((8, 2), 2, "rows"),
    ((1, 8), 2, "columns"),    # the only axis that can be cut evenly
])
def test_tiles_cut_the_least(numblocks, n, cut):
    owner = _graph.tiles(numblocks, n)
    if cut == "rows":
        assert all(owner[i] == i[0] * n // numblocks[0] for i in owner)
    elif cut == "columns":
        assert all(owner[i] == i[1] * n // numblocks[1] for i in owner)
    else:
        half = [b // 2 for b in numblocks]
        assert all(owner[i] == 2 * (i[0] // half[0]) + i[1] // half[1] for i in owner)


def test_tiles_are_contiguous_runs_where_the_grid_does_not_divide():
    owner = _graph.tiles((8, 8), 3)
    order = [owner[i] for i in np.ndindex(8, 8)]
    assert order == sorted(order)  # runs in C order
    assert sorted(collections.Counter(order).values()) == [21, 21, 22]


def test_tiles_refuse_no_workers():
    with pytest.raises(ValueError, match="n=0 workers"):
        _graph.tiles((2, 2), 0)


# -- distribute and the placed halo exchange ------------------------------------------------------


def test_distribute_needs_a_client():
    with pytest.raises(ValueError, match="no Dask client is current.*cluster.client"):
        cluster.distribute(da.ones((4, 4), chunks=2))


@pytest.mark.parametrize("source", ["lazy", "persisted"])
def test_distribute_places_balanced_contiguous_tiles(source):
    x_np = np.random.default_rng(3).random((64, 48))
    with processes(2) as c:
        x = da.from_array(x_np, chunks=(8, 12))
        if source == "persisted":
            x = x.persist()
        placed = cluster.distribute(x)
        workers = cluster.worker_addresses(c)
        assert cluster.blocks_per_worker(placed) == {workers[0]: 16, workers[1]: 16}
        where = _graph.placement(placed)
        assert all(where[i] == workers[i[0] // 4] for i in np.ndindex(*placed.numblocks))
        assert placed.chunks == x.chunks
        assert_close(placed.compute(), x_np)


def test_blocks_moved_off_their_worker_come_back_under_keys_of_their_own(monkeypatch):
    """Where work stealing ran a block elsewhere (here: the scheduler's answer says so once),
    every block goes under one new name, the moved one copied to its worker: each key of the
    array is its block's own (no alias task of another key in the graphs that read it), and
    graphs over it run without the scheduler's warning of a key given other dependencies."""
    x_np = np.random.default_rng(5).random((32, 24))
    with processes(2) as c:
        workers = cluster.worker_addresses(c)
        answers = []
        real = c.who_has

        def who_has(futures):
            held = dict(real(futures))
            if not answers:  # the first answer: block (0, 0) is on the other worker only
                key = next(f.key for f in futures if f.key[1:] == (0, 0))
                held[key] = (workers[1],)
            answers.append(held)
            return held

        monkeypatch.setattr(c, "who_has", who_has)
        placed = cluster.distribute(da.from_array(x_np, chunks=(8, 12)))
        monkeypatch.undo()
        assert len(answers) == 2  # copied once, then in place
        layer = placed.dask.layers[placed.name]
        assert placed.name.startswith("placed-0-")
        assert all(future.key == key for key, future in layer.items())
        where = _graph.placement(placed)
        assert all(where[i] == workers[i[0] // 2] for i in np.ndindex(*placed.numblocks))
        assert_close((placed + 1).compute(), x_np + 1)
        assert_close(ndimage.uniform_filter(placed, 3).compute(), ndi.uniform_filter(x_np, 3))
        logs = c.get_scheduler_logs(n=500)
        assert not [m for _, m in logs if "Detected different `run_spec`" in m]


@pytest.mark.parametrize("params, chunks", [
    ({"sigma": 2.0}, (40, 40)),
    ({"sigma": (3.0, 1.0), "mode": "wrap"}, (40, 25)),      # periodic: wrapped strips cross too
    ({"sigma": 6.0, "mode": "nearest"}, (16, 40)),           # a halo wider than a chunk
])
def test_a_halo_over_placed_blocks_reads_neighbours_in_place_and_batches_strips(params, chunks):
    x_np = np.random.default_rng(4).random((160, 120))
    want = ndi.gaussian_filter(x_np, **params)
    with processes(2):
        x = cluster.distribute(da.from_array(x_np, chunks=chunks))
        z = ndimage.gaussian_filter(x, **params)
        graph = dict(z.__dask_graph__())
        batches = [k for k in graph if k[0] == f"{z.name}-batch"]
        strips = [k for k in graph if "-strips-" in str(k[0])]
        kernels = [k for k in graph if k[0] == z.name]
        assert not strips
        assert len(kernels) == x.npartitions
        assert 1 <= len(batches) <= 2  # one per ordered pair of workers whose tiles touch
        np.testing.assert_allclose(z.compute(), want, rtol=1e-12, atol=1e-12)


def test_same_worker_pieces_are_read_from_the_neighbour_blocks_in_place():
    """A kernel task of a tile's interior reads its neighbours' blocks themselves (no strip
    tasks, no batch); one at a tile border also reads the batch from the other worker."""
    x_np = np.random.default_rng(5).random((96, 64))
    with processes(2):
        x = cluster.distribute(da.from_array(x_np, chunks=(16, 32)))
        z = ndimage.gaussian_filter(x, 1.5)
        graph = dict(z.__dask_graph__())
        deps = {k[1:]: {d[0] if isinstance(d, tuple) else d for d in t.dependencies}
                for k, t in graph.items() if k[0] == z.name}
        assert deps[(0, 0)] == {x.name}
        assert any(f"{z.name}-batch" in d for d in deps[(2, 0)])  # the last row of tile 0
        assert any(f"{z.name}-batch" in d for d in deps[(3, 0)])  # the first row of tile 1


def test_a_batch_of_strips_is_cut_where_its_blocks_are_when_the_graph_is_built():
    """Each batch is cut on the worker that holds its blocks as soon as the graph is built,
    before the kernels' graph is computed, and the blocks that read it take it from there: one
    message per pair of workers, no block moved."""
    from distributed import Future, wait

    x_np = np.random.default_rng(8).random((96, 64))
    with processes(2) as client:
        x = cluster.distribute(da.from_array(x_np, chunks=(16, 32)))
        z = ndimage.gaussian_filter(x, 1.5)
        graph = dict(z.__dask_graph__())
        batches = {k: v for k, v in graph.items() if k[0] == f"{z.name}-batch"}
        assert len(batches) == 2 and all(isinstance(v, Future) for v in batches.values())
        wait(list(batches.values()))
        where = _graph.placement(x)
        held = client.who_has(list(batches.values()))
        readers = collections.defaultdict(set)
        for k, t in graph.items():
            if k[0] == z.name:
                for d in t.dependencies:
                    if d in batches:
                        readers[d].add(where[k[1:]])
        for d, workers in readers.items():
            # one reader, and the batch lives on the other worker: the one whose blocks it cut
            assert len(workers) == 1 and len(held[d]) == 1 and set(held[d]) != workers
        assert set(readers) == set(batches)
        # the cuts ran where their blocks are: no block was copied to another worker
        assert all(len(h) == 1 for h in client.who_has(x).values())
        np.testing.assert_allclose(z.compute(), ndi.gaussian_filter(x_np, 1.5), rtol=1e-12,
                                   atol=1e-12)


def test_a_halo_that_crosses_no_worker_submits_nothing_when_the_graph_is_built(monkeypatch):
    """On one worker no strip crosses workers: building the graph sends the scheduler no
    (empty) graph of batches, whose message the kernels' graph would follow."""
    sent = []
    real = _graph._submitted
    monkeypatch.setattr(_graph, "_submitted", lambda *a: sent.append(a) or real(*a))
    x_np = np.random.default_rng(3).random((64, 48))
    with processes(1):
        x = cluster.distribute(da.from_array(x_np, chunks=(16, 16)))
        z = ndimage.gaussian_filter(x, 1.5)
        assert sent == []
        np.testing.assert_allclose(z.compute(), ndi.gaussian_filter(x_np, 1.5), rtol=1e-12,
                                   atol=1e-12)
    with processes(2):
        x = cluster.distribute(da.from_array(x_np, chunks=(16, 16)))
        ndimage.gaussian_filter(x, 1.5)
        assert len(sent) == 1


def test_placed_blocks_of_several_inputs_and_a_pipeline():
    import chunkernels

    rng = np.random.default_rng(6)
    x_np = rng.random((80, 60))
    with processes(2):
        x = cluster.distribute(da.from_array(x_np, chunks=(20, 30)))
        p = chunkernels.pipeline([("gaussian_filter", {"sigma": 1.0}),
                                  ("uniform_filter", {"size": 3})])
        want = ndi.uniform_filter(ndi.gaussian_filter(x_np, 1.0), 3)
        np.testing.assert_allclose(p(x).compute(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("params, chunks, shape", [
    ({"sigma": 2.0}, (40, 40), (160, 120)),
    ({"sigma": 6.0, "mode": "wrap"}, (16, 25), (160, 120)),  # halo wider than a chunk, wrapped
    ({"sigma": 1.0, "mode": "constant"}, (7, 50), (30, 101)),  # uneven edges
])
@pytest.mark.parametrize("workers", [1, 2])
def test_gpu_workers_run_placed_blocks_in_group_tasks(monkeypatch, params, chunks, shape,
                                                       workers):
    """On GPU workers (NumPy blocks stand in here) a worker's blocks run in a few group tasks,
    those whose halo crosses workers apart, and a cheap task per block picks its result."""
    monkeypatch.setattr(_halo, "group_placed", lambda metas: True)
    cap = 3 * 8 * chunks[0] * chunks[1]  # three whole blocks of float64
    monkeypatch.setattr(_halo, "PLACED_GROUP_BYTES", cap)
    x_np = np.random.default_rng(9).random(shape)
    want = ndi.gaussian_filter(x_np, **params)
    with processes(workers):
        x = cluster.distribute(da.from_array(x_np, chunks=chunks))
        z = ndimage.gaussian_filter(x, **params)
        graph = dict(z.__dask_graph__())
        groups = {k: t for k, t in graph.items() if k[0] == f"{z.name}-group"}
        picks = {k: t for k, t in graph.items() if k[0] == z.name}
        assert len(picks) == x.npartitions
        for k, t in picks.items():  # its group, and its input block (Dask then queues no pick)
            assert {d[0] for d in t.dependencies} == {f"{z.name}-group", x.name}
            assert (x.name, *k[1:]) in t.dependencies
            assert inspect.iscoroutinefunction(t.func)  # run on the worker's event loop
        assert -(-z.nbytes // cap) <= len(groups) < x.npartitions
        where = _graph.placement(x)
        for t in groups.values():  # a group reads the blocks of one worker, and batches
            homes = {where[d[1:]] for d in t.dependencies if d[0] == x.name}
            assert len(homes) >= 1
        if workers == 2:
            border = [t for t in groups.values()
                      if any(f"{z.name}-batch" in str(d) for d in t.dependencies)]
            assert border and len(border) < len(groups)
        np.testing.assert_allclose(z.compute(), want, rtol=1e-12, atol=1e-12)
        # a slice of the result in the same graph: Dask's optimisation would fuse a pick into
        # the slice's task, which would call the coroutine as a plain function
        view = (slice(1, None, 2), slice(None, None, -1))
        np.testing.assert_allclose((z[view] * 2).compute(), want[view] * 2, rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("chunks, shape, structure, workers, mask_of", [
    ((16, 16), (64, 48), None, 2, "threshold"),
    ((16, 16), (64, 48), None, 3, "persisted"),
    ((16, 16), (64, 48), None, 2, "dask"),        # Dask's elementwise layers: (x * 2) > 1.2
    ((16, 16), (64, 48), None, 3, "flipped"),     # a slice, then a comparison
    ((7, 50), (30, 101), np.ones((3, 3)), 3, "threshold"),  # uneven edges, 8-connected
    ((7, 50), (30, 101), np.ones((3, 3)), 2, "dask"),
    ((5, 6, 4), (10, 12, 8), None, 1, "threshold"),
    ((5, 6, 4), (10, 12, 8), None, 1, "dask"),
    ((5, 6, 4), (10, 12, 8), np.ones((3, 3, 3)), 2, "persisted"),
])
def test_gpu_workers_label_placed_blocks_in_worker_groups(monkeypatch, chunks, shape, structure,
                                                          workers, mask_of):
    """On GPU workers (NumPy blocks stand in here) the label of placed blocks, or of per-block
    steps over them (a threshold, Dask's elementwise operations and slices), runs a few tasks
    per worker: a local labelling, its summaries, a relabelling that reads one summary per
    worker; labels and count equal SciPy's."""
    import chunkernels

    monkeypatch.setattr(_halo, "group_placed", lambda metas: True)
    if workers == 3:  # groups of at most 3 blocks of labels (int32)
        monkeypatch.setattr(_halo, "PLACED_GROUP_BYTES", 3 * 4 * int(np.prod(chunks)))
    x_np = np.random.default_rng(11).random(shape)
    flip = (slice(None, None, -1),) if mask_of == "flipped" else ()
    want, want_n = ndi.label(x_np[flip] > 0.6, structure)
    lazy = mask_of != "persisted"
    with processes(workers) as client:
        x = cluster.distribute(da.from_array(x_np, chunks=chunks))
        mask = {"threshold": lambda: chunkernels.apply(x, "threshold", value=0.6),
                "persisted": lambda: cluster.distribute(x > 0.6),
                "dask": lambda: (x * 2) > 1.2,
                "flipped": lambda: x[flip] > 0.6}[mask_of]()
        assert _graph.placement(mask, computed=True) is not None
        labels, n = ndimage.label(mask, structure)
        graph = graph_on_a_cluster(labels)
        parts = [k for k in graph if k[0] == f"{labels.name}-part"]
        relabels = {k: t for k, t in graph.items() if k[0] == f"{labels.name}-relabel"}
        # a lazy per-block step runs inside the label's tasks: a pick is placed by the input
        # block its mask block reads, and the step's own tasks drop out of the graph
        placed_by = x.name if lazy else mask.name
        if workers == 1:  # one group: the three steps in one task, a pick per block
            assert not parts and not relabels
            picks = {k: t for k, t in graph.items() if k[0] == labels.name}
            assert len(picks) == mask.npartitions
            for k, t in picks.items():
                assert t.dependencies == {(f"{labels.name}-merge",), (placed_by, *k[1:])}
                assert inspect.iscoroutinefunction(t.func)
        else:
            assert len(parts) == len(relabels) >= workers
            assert all(inspect.iscoroutinefunction(t.func) for k, t in graph.items()
                       if k[0] == labels.name)
        needed, todo = set(), [k for k in graph if k[0] == labels.name]
        while todo:  # the keys the labels need: the graph culled as Dask optimises it
            key = todo.pop()
            if key not in needed:
                needed.add(key)
                todo.extend(getattr(graph[key], "dependencies", ()))
        assert any(k[0] == mask.name for k in needed) is not lazy
        if workers == 3:
            assert len(parts) >= -(-mask.npartitions // 3)
        for t in relabels.values():  # its part, and one summary per group
            assert sum(d[0] == f"{labels.name}-summaries" for d in t.dependencies) == len(parts)
        np.testing.assert_array_equal(labels[::2].compute(), want[::2])  # picks not fused
        labels, n = client.persist([labels, n])
        np.testing.assert_array_equal(labels.compute(), want)
        assert int(n.compute()) == want_n


@pytest.mark.parametrize("workers", [1, 3])
def test_gpu_workers_measure_placed_blocks_in_worker_groups(monkeypatch, workers):
    """On GPU workers (NumPy blocks stand in here) the measurements over placed blocks run one
    task per worker and one combine; the results equal SciPy's."""
    monkeypatch.setattr(_halo, "group_placed", lambda metas: True)
    rng = np.random.default_rng(12)
    x_np = rng.random((50, 37))
    labels_np, n = ndi.label(x_np > 0.55)
    with processes(workers):
        x = cluster.distribute(da.from_array(x_np, chunks=(12, 10)))
        labels = cluster.distribute(da.from_array(labels_np, chunks=(12, 10)))
        total = ndimage.sum_labels(x, labels, np.arange(1, n + 1))
        graph = graph_on_a_cluster(total)
        # a task per worker, then the combine; one worker: one task
        assert sum(1 for k in graph if "-group" in str(k[0])) == (0 if workers == 1 else workers)
        stats = [k for k in graph if str(k[0]).startswith("label_statistics-")]
        assert len(stats) == (1 if workers == 1 else workers + 1)
        np.testing.assert_allclose(total.compute(), ndi.sum_labels(x_np, labels_np,
                                                                   np.arange(1, n + 1)))
        table = ndimage.measure(x, labels, properties=("label", "area", "mean", "centroid"),
                                as_frame=False)
        got = dict(zip(table, dask.compute(*table.values())))
        np.testing.assert_array_equal(got["label"], np.arange(1, n + 1))
        np.testing.assert_array_equal(got["area"], ndi.sum_labels(np.ones_like(x_np), labels_np,
                                                                  np.arange(1, n + 1)))
        np.testing.assert_allclose(got["mean"], ndi.mean(x_np, labels_np, np.arange(1, n + 1)))
        centroids = np.array(ndi.center_of_mass(np.ones_like(x_np), labels_np,
                                                np.arange(1, n + 1)))
        for axis in range(2):
            np.testing.assert_allclose(got[f"centroid-{axis}"], centroids[:, axis])


@pytest.mark.parametrize("workers", [1, 3])
def test_gpu_workers_measure_lazy_labels_of_placed_blocks_in_worker_groups(monkeypatch, workers):
    """Labels not computed yet, of placed blocks, say where each of their blocks will be
    computed (their input block's worker): measurements built over them in the same graph run a
    task per worker, not a task per block, and the labels, count and table equal SciPy's."""
    monkeypatch.setattr(_halo, "group_placed", lambda metas: True)
    rng = np.random.default_rng(13)
    x_np = rng.random((48, 40))
    want, n = ndi.label(x_np > 0.55)
    index = np.arange(1, n + 1)
    with processes(workers) as client:
        x = cluster.distribute(da.from_array(x_np, chunks=(12, 10)))
        labels, count = ndimage.label(x > 0.55)
        assert _graph.placement(labels, computed=True) == _graph.placement(x)
        total = ndimage.sum_labels(x, labels, index)
        graph = graph_on_a_cluster(total)
        stats = [k for k in graph if str(k[0]).startswith("label_statistics-")]
        assert len(stats) == (1 if workers == 1 else workers + 1)
        # labels of those labels: their declared placement makes worker groups, but their
        # tasks are not a per-block step over persisted blocks, so none is absorbed
        again, again_n = ndimage.label(labels)
        labels, count, total, again, again_n = client.persist(
            [labels, count, total, again, again_n])
        np.testing.assert_array_equal(labels.compute(), want)
        assert int(count.compute()) == n
        np.testing.assert_allclose(total.compute(), ndi.sum_labels(x_np, want, index))
        np.testing.assert_array_equal(again.compute(), want)
        assert int(again_n.compute()) == n


# -- graph shapes chosen where the graph runs ---------------------------------------------------


def test_a_graph_built_without_a_client_spreads_over_the_cluster(monkeypatch):
    """Blocks in memory run in group tasks locally (CuPy blocks; NumPy blocks stand in here);
    the same graph computed on a cluster is a task per block, spread over the workers."""
    monkeypatch.setattr(_halo, "group_blocks", lambda held: None not in held)
    x_np = np.random.default_rng(7).random((64, 64))
    z = ndimage.gaussian_filter(da.from_array(x_np, chunks=16), 2.0)
    local = dict(z.__dask_graph__())
    assert any(k[0] == f"{z.name}-group" for k in local)
    remote = graph_on_a_cluster(z)
    assert not any(k[0] == f"{z.name}-group" for k in remote)
    assert set(k for k in remote if k[0] == z.name) == set(k for k in local if k[0] == z.name)
    want = ndi.gaussian_filter(x_np, 2.0)
    with processes(2) as c:
        from distributed import wait

        persisted = z.persist()
        wait(persisted)
        where = collections.Counter(_graph.placement(persisted).values())
        assert len(where) == 2, where  # both workers computed blocks
        np.testing.assert_allclose(persisted.compute(), want, rtol=1e-12, atol=1e-12)
        # a graph built while the client is open still runs on local threads
        again = ndimage.gaussian_filter(da.from_array(x_np, chunks=16), 2.0)
        np.testing.assert_allclose(again.compute(scheduler="threads"), want, rtol=1e-12,
                                   atol=1e-12)
        assert c.status == "running"


def test_a_graph_survives_serialisation_unmaterialised_and_materialised():
    import pickle

    x_np = np.random.default_rng(8).random((30, 40))
    z = ndimage.gaussian_filter(da.from_array(x_np, chunks=10), 1.0)
    dict(z.__dask_graph__())  # materialised locally first
    back = pickle.loads(pickle.dumps(z))
    np.testing.assert_allclose(back.compute(), ndi.gaussian_filter(x_np, 1.0), rtol=1e-12,
                               atol=1e-12)


# -- errors name the kernel and the block ---------------------------------------------------------


def test_an_error_in_a_block_names_the_kernel_and_the_block():
    import chunkernels

    def cpu(x, **params):
        if x.shape[0] == 3:
            raise ZeroDivisionError("the reference failed")
        return x

    chunkernels.register(name="fails_on_a_block", cpu=cpu, dtypes=("float64",))
    x = da.zeros((10, 4), chunks=(5, 4)).rechunk(((5, 3, 2), (4,)))
    with pytest.raises(ZeroDivisionError, match="the reference failed") as info:
        chunkernels.apply(x, "fails_on_a_block").compute(scheduler="sync")
    notes = " ".join(getattr(info.value, "__notes__", ()))
    assert "kernel 'fails_on_a_block'" in notes and "block (1, 0)" in notes


# -- on GPU workers -------------------------------------------------------------------------------


@pytest.mark.multigpu
@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
def test_filter_label_and_pipeline_over_gpu_workers(protocol):
    """Blocks placed over every GPU's worker; the filter, a fused pipeline and the label equal
    SciPy's, and the filter's output blocks stay where their input blocks are."""
    import chunkernels
    from chunkernels import cuda

    cp = pytest.importorskip("cupy")
    if protocol == "ucx":
        pytest.importorskip("distributed_ucxx")
    from distributed import wait

    n = cuda.gpu_count()
    x_np = np.random.default_rng(9).random((2048, 1536)).astype(np.float32)
    with cluster.client(gpus=n, protocol=protocol, **QUIET):
        lazy = da.from_array(x_np, chunks=256).map_blocks(cp.asarray,
                                                         meta=cp.empty((0, 0), np.float32))
        x = cluster.distribute(lazy)
        counts = sorted(cluster.blocks_per_worker(x).values())
        assert len(counts) == n and counts[-1] - counts[0] <= 1
        where = _graph.placement(x)  # before the filter: a block it copies is held twice then
        z = ndimage.gaussian_filter(x, 3.0).persist()
        wait(z)
        out = _graph.placement(z)
        # No task is pinned (a lost worker's must run elsewhere): the scheduler weighs a group's
        # dependencies against the workers' load, and with blocks this small (256 KiB) it moves
        # a few groups (33 of 48 blocks stayed on 4 H100s, 42 of 48 on 2 with a task per block);
        # at the benchmark's 256 MiB none move (its only transfers are the strip batches).
        assert sum(where[i] == out[i] for i in where) >= 0.6 * len(where)
        got = z.compute()
        assert cuda.is_cupy_array(got)
        np.testing.assert_allclose(got.get(), ndi.gaussian_filter(x_np.astype(np.float64), 3.0),
                                   rtol=1e-5, atol=1e-5)
        p = chunkernels.pipeline([("gaussian_filter", {"sigma": 1.0}),
                                  ("uniform_filter", {"size": 5}), ("sobel", {"axis": 0})])
        want = ndi.sobel(ndi.uniform_filter(ndi.gaussian_filter(x_np.astype(np.float64), 1.0),
                                            5), 0)
        np.testing.assert_allclose(p(x).compute().get(), want, rtol=1e-4, atol=1e-4)
        labels, count = ndimage.label(x < 0.4)
        labels, count = dask.compute(labels, count)
        want_labels, want_n = ndi.label(x_np < 0.4)
        assert int(count) == want_n
        assert_close(labels, want_labels.astype(labels.dtype))


# -- tasks run on a worker's event loop ------------------------------------------------------


async def _first(values, *dependencies):
    return values[0]


def test_a_task_on_the_loop_is_never_fused_and_takes_only_coroutines():
    """A coroutine task (run on a distributed worker's event loop) stays a task of its own
    through Dask's optimisation: fused into the task of a slice of it, it would be called as a
    plain function and return a coroutine."""
    import pickle

    import dask
    import dask.array as da

    tasks = _graph.Tasks()
    tasks.add(("g", 0), list, [np.arange(4.0), np.arange(4.0)])
    for i in range(2):
        tasks.add_on_loop(("picks", i), _first, tasks.ref(("g", 0)))
    with pytest.raises(TypeError, match="coroutine function"):
        tasks.add_on_loop(("picks", 2), len, tasks.ref(("g", 0)))
    assert len(tasks.graph) == 3  # the refused task was not added
    a = tasks.array("picks", ((4, 4),), np.float64, np.empty(0))
    (sliced,) = dask.optimize(a[1:6] * 2)
    graph = dict(sliced.__dask_graph__())
    for i in range(2):
        task = graph[("picks", i)]
        assert task.block_fusion and task.is_coro
        again = pickle.loads(pickle.dumps(task))  # as a scheduler and a worker get it
        assert type(again) is type(task) and again.is_coro and again.block_fusion
