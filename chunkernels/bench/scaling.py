"""``chunkernels bench scaling``: a halo filter over a large array on 1, 2, 4, ... GPUs.

The issue's measurement: ``chunkernels.ndimage.gaussian_filter`` with sigma 4 (a halo of 16 per
side) over a 32768x32768 float32 array (4 GiB; ``--size``) in chunks of 4096, 8192 and 16384
squared (``--chunks``), on a local cluster of each GPU count (``--gpus 1 2``), side by side with

* the same kernel with no halo: ``dask.array.map_blocks`` of the kernel's block function, each
  block filtered alone with the edge mode at its own edges (wrong near chunk edges: the time a
  halo exchange would cost nothing);
* dask-image's ``gaussian_filter`` on the same chunks (``map_overlap`` around cupyx/scipy);
* a three-step pipeline, fused (:func:`chunkernels.pipeline`: one halo exchange) and as three
  ``apply`` calls (one exchange each).

The array is created on the workers (``dask.array.random``, CuPy's generator on GPU workers),
placed in contiguous, balanced tiles of blocks (:func:`chunkernels.cluster.distribute`) and
persisted before any clock starts; the report gives the blocks each worker holds, and, per run,
how many transfers between workers there were and how many bytes they moved. Each run persists the result, waits for it and synchronises
every worker's GPU; its keys are then forgotten by the scheduler, outside the clock, so that the
next run computes them again. Before timing, each implementation's result is checked on windows
across chunk corners and at the array's corners against the CPU reference run on the same window
of the input (widened by the halo); a wrong result stops the benchmark.

A second table labels ``x < 0.4`` (about 40% foreground) on the same clusters: the labels of
every cluster count must be the same (per-block checksums computed where the blocks live), and
equal SciPy's: compared whole on arrays of at most :data:`SCIPY_CHECK` elements, and through the
same per-block checksums (SciPy's labels summed block by block here) on larger arrays that this
machine's memory can label (about :data:`SCIPY_HOST_BYTES` bytes an element), on the first
cluster of the sweep. Peak memory per worker is
measured in a run of its own: on GPU workers the most bytes CuPy's memory pool has in use at
any allocation (not the freed blocks it caches), ``tracemalloc`` on CPU workers.

Without GPUs (or with ``--workers``) the same runs use NumPy chunks on CPU worker processes, which
is how the test suite exercises this module end to end on a tiny ``--size``.
"""

from __future__ import annotations

import functools
import sys
import time

import numpy as np

import chunkernels
from chunkernels import bench, cuda, ndimage
from chunkernels.testing import assert_close

NEEDS_GPU = False
CLUSTER = True

SIGMA = 4.0
DTYPE = np.dtype(np.float32)
DEFAULT_SHAPE = (32768, 32768)
DEFAULT_CHUNKS = [(4096, 4096), (8192, 8192), (16384, 16384)]
SEED = 7

#: The issue's pipeline, compared where its kernels are registered and take these parameters.
ISSUE_PIPELINE = (("gaussian_filter", {"sigma": SIGMA}), ("threshold", {}), ("label", {}))
#: Three registered halo kernels, compared otherwise.
HALO_PIPELINE = (("gaussian_filter", {"sigma": SIGMA}), ("uniform_filter", {"size": 5}),
                 ("sobel", {"axis": 0}))

#: Results are float32 sums of 33 taps in a different order than scipy's float64 ones.
CHECK_TOLERANCE = 1e-5
#: Foreground fraction of the labelled image, ``x < FOREGROUND``.
FOREGROUND = 0.4
#: Runs of one implementation vary by a few percent between runs: one halo exchange's cost (the
#: chunkernels time less the no-halo time) below this share of the no-halo time is noise, and
#: the pipeline table gives no ratio to it.
NOISE = 0.05
#: The largest array whose labels are compared with SciPy's on the host, whole (elements).
SCIPY_CHECK = 2**26
#: Host bytes per element that labelling a larger image with SciPy here takes (the boolean image,
#: SciPy's int32 labels, a block's int64 copies): it is compared block by block through the
#: checksums the workers compute (:func:`_scipy_checksums`) where that much memory is available.
SCIPY_HOST_BYTES = 6

CHUNKERNELS, NO_HALO, DASK_IMAGE = "chunkernels", "no halo (map_blocks)", "dask-image"
LABEL = "label (x < 0.4)"
FUSED, SEPARATE = "pipeline, fused", "pipeline, separate"
#: The implementations whose time is broken down in one more run (:func:`_profile`).
PROFILED = (CHUNKERNELS, NO_HALO, FUSED)


def run(args) -> dict:
    """Time every implementation for each cluster of the sweep and each chunk shape."""
    shape = bench.array_shape(args, DEFAULT_SHAPE, DTYPE)
    chunkings = bench.chunk_shapes(args, shape, DEFAULT_CHUNKS, DTYPE)
    steps, pipeline_note = pipeline_steps()
    impls = implementations(steps)
    notes = [f"pipeline: {pipeline_note}"]
    if DASK_IMAGE not in impls:
        notes.append("dask-image is not installed: its column is empty "
                     f"({bench.BENCH_EXTRA})")
    depth = _halo(len(shape))
    sweep = bench.sweep(args)
    rows, clusters, labels, checked = [], [], [], set()
    total = len(sweep) * len(chunkings) * (len(impls) + 1)
    with bench.Progress(total, "scaling") as progress:
        for kind, workers, client in bench.clusters(args):
            gpu = kind == "gpu"
            names = chunkernels.cluster.gpu_names(client) if gpu else []
            clusters.append({"kind": kind, "workers": workers, "devices": names,
                             "protocol": chunkernels.cluster.protocol(client)})
            for chunks in chunkings:
                x = _input(client, shape, chunks, gpu)
                placed = sorted(chunkernels.cluster.blocks_per_worker(x).values())
                for label, (build, reference, check) in impls.items():
                    with progress.run(f"{workers} {kind} worker(s), chunks "
                                      f"{'x'.join(map(str, chunks))}, {label}"):
                        rows.append({
                            "kind": kind, "workers": workers, "chunks": list(chunks),
                            "blocks": x.npartitions, "blocks_per_worker": placed, "impl": label,
                            **_measure(client, gpu, x, label, build, reference, check,
                                       args.repeat)})
                with progress.run(f"{workers} {kind} worker(s), chunks "
                                  f"{'x'.join(map(str, chunks))}, {LABEL}"):
                    labels.append({"kind": kind, "workers": workers, "chunks": list(chunks),
                                   **_measure_label(client, gpu, x, args.repeat,
                                                    scipy_check=chunks not in checked)})
                checked.add(chunks)
                keys = _keys(x)
                del x
                _forget(client, keys)
    _derive(rows)
    _check_labels(labels)
    report = {
        "benchmark": "scaling", "kernel": "gaussian_filter", "sigma": SIGMA,
        "shape": list(shape), "dtype": DTYPE.name, "nbytes": _nbytes(shape),
        "halo": list(depth), "pipeline": [[n, p] for n, p in steps],
        "pipeline_exchanges": _exchanges(steps),
        "environment": bench.environment(), "clusters": clusters,
        "repeat": args.repeat, "notes": notes, "rows": rows, "labels": labels,
        "chunk_halo_bytes": {"x".join(map(str, c)): _nbytes(tuple(n + 2 * d for n, d in
                                                                   zip(c, depth)))
                             for c in chunkings},
    }
    report["markdown"] = markdown(report)
    report["plots"] = plots(report)
    return report


def implementations(steps) -> dict:
    """``{label: (build(x), reference, check)}`` for every implementation compared.

    ``check`` says what ``reference`` is: ``"array"``, the expected result on a NumPy window of
    the input, as for the whole array; ``"block"``, the same with each block filtered alone (no
    halo); ``"twin"``, another implementation's ``build``, whose result must be the same (the
    pipeline pair: a per-chunk step such as labelling need not equal its whole-array result).
    """
    import dask.array as da

    gaussian = functools.partial(chunkernels.apply, kernel="gaussian_filter", sigma=SIGMA)
    block = chunkernels.blockwise("gaussian_filter", sigma=SIGMA)
    fused = chunkernels.pipeline(steps)

    def no_halo(x):
        return da.map_blocks(block, x, dtype=x.dtype, meta=x._meta)

    def separate(x):
        for name, params in steps:
            x = chunkernels.apply(x, name, **params)
        return x

    impls = {
        CHUNKERNELS: (lambda x: ndimage.gaussian_filter(x, SIGMA), gaussian, "array"),
        NO_HALO: (no_halo, gaussian, "block"),
    }
    try:
        from dask_image.ndfilters import gaussian_filter as dask_image_gaussian
    except ImportError:
        pass
    else:
        impls[DASK_IMAGE] = (lambda x: dask_image_gaussian(x, SIGMA), gaussian, "array")
    impls[SEPARATE] = (separate, fused, "twin")
    impls[FUSED] = (fused, separate, "twin")
    return impls


def pipeline_steps() -> tuple[tuple, str]:
    """The pipeline to compare, and why it is that one."""
    registered = set(chunkernels.registered())
    missing = [name for name, _ in ISSUE_PIPELINE if name not in registered]
    if missing:
        why = f"the issue's kernels {', '.join(missing)} are not registered here"
    else:
        try:
            fused = chunkernels.pipeline(ISSUE_PIPELINE)
        except TypeError as exc:  # a step that cannot run per chunk (label is not blockwise)
            why = f"the issue's chain cannot be one pipeline ({exc})"
        else:
            try:
                fused.depth(2)  # validates every step's parameters
            except (TypeError, ValueError, KeyError) as exc:
                why = f"the issue's chain does not run with default parameters ({exc})"
            else:
                return ISSUE_PIPELINE, "the issue's chain " + _chain(ISSUE_PIPELINE)
    return HALO_PIPELINE, f"{_chain(HALO_PIPELINE)}, three halo kernels ({why})"


def _halo(ndim: int) -> tuple[int, ...]:
    """The Gaussian's halo per axis (16 for sigma 4)."""
    return tuple(chunkernels.blockwise("gaussian_filter", sigma=SIGMA).depth(ndim).values())


def _chain(steps) -> str:
    return " → ".join(f"{n}({', '.join(f'{k}={v}' for k, v in p.items())})" for n, p in steps)


# -- one implementation, one cluster, one chunking ------------------------------------------------


def _input(client, shape, chunks, gpu):
    """The random input, created on the workers (CuPy chunks on GPUs) and persisted there."""
    import dask.array as da
    from distributed import wait

    if gpu:
        cp = cuda.cupy()
        rs = da.random.RandomState(SEED, RandomState=cp.random.RandomState)
        x = rs.random_sample(shape, chunks=chunks, dtype=DTYPE)
    else:
        x = da.random.default_rng(SEED).random(shape, dtype=DTYPE, chunks=chunks)
    x = chunkernels.cluster.distribute(x, client)
    wait(x)
    return x


def _measure(client, gpu, x, label, build, reference, check, repeat) -> dict:
    """Check one implementation, measure its memory, then time it."""
    from distributed import wait

    def once():
        z = client.persist(build(x))
        wait(z)
        client.run(_synchronize)
        return z

    z = once()  # also the warm-up: kernels compile, modules load
    keys = _keys(z)
    # a failed check raises as it is: its traceback holds the result, which would never be
    # forgotten (the wait below would time out instead of saying what differed)
    _check(label, z, x, reference, check)
    del z  # the last reference: its results are released, then forgotten
    _forget(client, keys)
    starts = client.run(_memory_start, gpu)
    z = once()
    # measured while the result is held: dropped first, its blocks would be on their way out
    # (what a worker holds at the end, less than its share, made the working memory look larger)
    ends = client.run(_memory_end, gpu)
    keys = _keys(z)
    del z
    _forget(client, keys)

    def timed():
        return _keys(once())  # the result is dropped here, its keys forgotten outside the clock

    before = _transfers(client)
    seconds = bench.wall_median(timed, repeat, warmup=1, after=lambda keys: _forget(client, keys))
    count, nbytes = (b - a for a, b in zip(before, _transfers(client)))
    profile = None
    if label in PROFILED:
        profile = _profile(client, lambda: build(x), lambda z: [client.persist(z)])
    return {"seconds": seconds, "GB/s": x.nbytes / seconds / 1e9,
            "memory": _memory(starts, ends), "transfers_per_run": count / (repeat + 1),
            "bytes_moved_per_run": nbytes / (repeat + 1), "profile": profile}


def _profile(client, build, persist) -> dict:
    """One more run under distributed's task stream: where its wall time goes.

    ``build()`` makes the graph (timed apart: placement queries and batches submitted while
    building count there), ``persist(graph)`` submits it and returns the persisted collections.
    The phases, in seconds: ``build``; ``to_first_task``, from the submission to the first task's
    start on a worker (the scheduler's latency); ``busy``, the largest sum of task run times on
    one worker (its thread launching kernels, or computing on CPUs); ``transfers``, the largest
    sum of incoming transfer times on one worker; ``after_last_task``, from the last task's end
    to the persisted result with every GPU synchronised (the GPU finishing launched work, and
    the scheduler's reply). GPU launches return before the kernels run, so ``busy`` is the
    workers' host time, not the GPUs'.
    """
    from dask.utils import key_split
    from distributed import get_task_stream, wait

    with get_task_stream(client) as stream:
        start = time.time()
        graph = build()
        built = time.time()
        results = persist(graph)
        wait(results)
        client.run(_synchronize)
        end = time.time()
    keys = [k for r in results for k in _keys(r)]
    del results, graph
    _forget(client, keys)
    busy: dict = {}
    moving: dict = {}
    by_prefix: dict = {}
    first, last = end, built
    for task in stream.data:
        for phase in task.get("startstops", ()):
            span = phase["stop"] - phase["start"]
            if phase["action"] == "compute":
                busy[task["worker"]] = busy.get(task["worker"], 0.0) + span
                prefix = key_split(task["key"])
                by_prefix[prefix] = by_prefix.get(prefix, 0.0) + span
                first, last = min(first, phase["start"]), max(last, phase["stop"])
            elif phase["action"] == "transfer":
                moving[task["worker"]] = moving.get(task["worker"], 0.0) + span
    top = sorted(by_prefix.items(), key=lambda kv: -kv[1])[:3]
    return {"wall": end - start, "build": built - start, "tasks": len(stream.data),
            "to_first_task": max(0.0, first - built), "busy": max(busy.values(), default=0.0),
            "transfers": max(moving.values(), default=0.0),
            "after_last_task": max(0.0, end - last), "top": [[k, v] for k, v in top]}


def _transfers(client) -> tuple[int, int]:
    """Transfers between workers so far, and the bytes they moved (every worker's outgoing
    counters summed)."""
    counts = client.run(_worker_transfers).values()
    return sum(c for c, _ in counts), sum(b for _, b in counts)


def _measure_label(client, gpu, x, repeat, scipy_check=True) -> dict:
    """Label ``x < FOREGROUND`` (persisted first, where ``x`` lives): check, then time.
    ``scipy_check``: also compare with SciPy's labels (whole, or by block checksums for an
    image too large to compare whole), where this machine can label the image."""
    from distributed import wait

    image = client.persist(x < FOREGROUND)
    wait(image)

    def once():
        labels, count = client.persist(list(ndimage.label(image)))
        wait([labels, count])
        client.run(_synchronize)
        return labels, count

    labels, count = once()
    sums = labels.map_blocks(_block_checksum, dtype=np.int64, chunks=(1, 2),
                             meta=np.empty((0, 0), np.int64))
    check = {"count": int(count.compute()), "checksums": np.asarray(sums.compute()).tolist()}
    del sums
    if x.size <= SCIPY_CHECK:
        import scipy.ndimage as ndi

        host, got = bench.on_host(image, labels)
        want, n = ndi.label(host)
        assert n == check["count"], f"label: {check['count']} labels, SciPy finds {n}"
        assert_close(got, want.astype(got.dtype), err_msg="label differs from SciPy's")
        check["scipy"] = True
    elif scipy_check and _host_can_label(x.size):
        _scipy_checksums(image, check)
    keys = _keys(labels) + _keys(count)
    del labels, count
    _forget(client, keys)

    def timed():
        labels, count = once()
        return _keys(labels) + _keys(count)

    before = _transfers(client)
    seconds = bench.wall_median(timed, repeat, warmup=1, after=lambda keys: _forget(client, keys))
    moved = [b - a for a, b in zip(before, _transfers(client))]
    check["profile"] = _profile(client, lambda: list(ndimage.label(image)), client.persist)
    keys = _keys(image)
    image = None  # the last reference: its blocks are released, then forgotten
    _forget(client, keys)
    return {"seconds": seconds, "transfers_per_run": moved[0] / (repeat + 1),
            "bytes_moved_per_run": moved[1] / (repeat + 1), **check}


#: What the label table says of the comparison with SciPy (``row["scipy"]``).
_SCIPY_CHECKED = {True: "yes", "checksums": "yes (block checksums)", None: "no (too large)",
                  False: "no (too large)"}


def _host_can_label(size: int) -> bool:
    """Whether this machine has the memory to label an image of ``size`` elements with SciPy
    (:data:`SCIPY_HOST_BYTES` an element, against the memory available now)."""
    import psutil

    return size * SCIPY_HOST_BYTES <= psutil.virtual_memory().available


def _scipy_checksums(image, check: dict) -> None:
    """Compare ``check``'s label count and per-block checksums (from the workers) with SciPy's
    labels of ``image`` brought here; sets ``check["scipy"]`` to ``"checksums"``. The checksums
    of SciPy's labels are summed by this process's threads, a block each."""
    import dask.array as da
    import scipy.ndimage as ndi

    (host,) = bench.on_host(image)
    want, n = ndi.label(host)
    del host
    assert n == check["count"], f"label: {check['count']} labels, SciPy finds {n}"
    sums = da.from_array(want, chunks=image.chunks).map_blocks(
        _block_checksum, dtype=np.int64, chunks=(1, 2), meta=np.empty((0, 0), np.int64))
    got = np.asarray(sums.compute(scheduler="threads")).tolist()
    different = [(i, j) for i, row in enumerate(got) for j in range(0, len(row), 2)
                 if row[j:j + 2] != check["checksums"][i][j:j + 2]]
    assert not different, (f"label differs from SciPy's in {len(different)} of "
                           f"{image.npartitions} blocks, e.g. block row {different[0][0]}, "
                           f"checksum pair {different[0][1] // 2}")
    check["scipy"] = "checksums"


def _check_labels(labels) -> None:
    """Every cluster's labels of one chunking must be the same (count and block checksums)."""
    by_chunks: dict = {}
    for row in labels:
        by_chunks.setdefault(tuple(row["chunks"]), []).append(row)
    for chunks, rows in by_chunks.items():
        first = rows[0]
        for row in rows[1:]:
            assert (row["count"], row["checksums"]) == (first["count"], first["checksums"]), (
                f"label on {_where(row)} differs from {_where(first)} in chunks {chunks}")
            if not row.get("scipy"):  # equal to the first cluster's, compared with SciPy's
                row["scipy"] = first.get("scipy")
    for row in labels:
        base = next(r for r in labels if r["chunks"] == row["chunks"])
        row["speedup"] = base["seconds"] / row["seconds"]


def _check(label, z, x, reference, check) -> None:
    """``z`` against ``reference`` on windows of ``x`` (see :func:`implementations`)."""
    context = (f"the {'x'.join(map(str, x.shape))} array in chunks "
               f"{'x'.join(str(c[0]) for c in x.chunks)}; not timing it")
    if check == "twin":
        other = reference(x)
        windows = [w for w, _ in _windows(x, (0,) * x.ndim, per_block=False)]
        pieces = bench.on_host(*(a[w] for w in windows for a in (z, other)))
        for i, window in enumerate(windows):
            assert_close(pieces[2 * i], pieces[2 * i + 1], rtol=CHECK_TOLERANCE,
                         atol=CHECK_TOLERANCE,
                         err_msg=f"{label} differs from its twin on window {window} of {context}")
        return
    depth = _halo(x.ndim)
    plan = []
    for window, bounds in _windows(x, depth, per_block=check == "block"):
        wide = tuple(slice(max(b.start, w.start - d), min(b.stop, w.stop + d))
                     for w, b, d in zip(window, bounds, depth))
        inner = tuple(slice(w.start - s.start, w.stop - s.start) for w, s in zip(window, wide))
        plan.append((window, wide, inner))
    pieces = bench.on_host(*(a for window, wide, _ in plan for a in (z[window], x[wide])))
    for i, (window, _, inner) in enumerate(plan):
        assert_close(pieces[2 * i], reference(pieces[2 * i + 1])[inner], rtol=CHECK_TOLERANCE,
                     atol=CHECK_TOLERANCE, err_msg=f"{label} is wrong on window {window} of "
                                                  f"{context}")


def _windows(x, depth, *, per_block: bool):
    """``(window, bounds)`` pairs to check: slices of ``x`` and the region the filter treats as
    the whole array there (``x`` itself, or the block holding the window when ``per_block``).

    Windows straddle the first interior chunk corner (all four blocks meet there) and the chunk
    corner nearest the array's middle (where the tiles of :func:`chunkernels.cluster.distribute`
    meet on 2 and 4 workers: the strips there crossed workers), and sit at the array's first and
    last corners, where the edge mode applies; per block, they sit at the first block's inner
    corner and at the last block's outer one.
    """
    margin = [d + 8 for d in depth]
    first = [c[0] for c in x.chunks]
    whole = tuple(slice(0, n) for n in x.shape)
    if per_block:
        last = tuple(slice(n - c[-1], n) for n, c in zip(x.shape, x.chunks))
        yield tuple(slice(max(0, f - m), f) for f, m in zip(first, margin)), \
            tuple(slice(0, f) for f in first)
        yield tuple(slice(max(b.start, b.stop - m), b.stop) for b, m in zip(last, margin)), last
        return
    yield tuple(slice(max(0, f - m), min(n, f + m)) for f, m, n in zip(first, margin, x.shape)), \
        whole
    middle = [min((int(b) for b in np.cumsum(c[:-1])), key=lambda b, n=n: abs(2 * b - n),
                  default=None) for c, n in zip(x.chunks, x.shape)]
    if None not in middle and middle != first:
        yield tuple(slice(max(0, b - m), min(n, b + m))
                    for b, m, n in zip(middle, margin, x.shape)), whole
    yield tuple(slice(0, min(n, m)) for n, m in zip(x.shape, margin)), whole
    yield tuple(slice(max(0, n - m), n) for n, m in zip(x.shape, margin)), whole


def _keys(z) -> list:
    from dask.core import flatten

    return list(flatten(z.__dask_keys__()))


def _forget(client, keys, timeout: float = 120.0) -> None:
    """Wait until the scheduler has forgotten ``keys`` and no worker holds their results any more
    (the scheduler tells the workers to free them asynchronously: a memory measurement started
    before they have would count the previous run's results as the worker's baseline)."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_held, keys) or any(client.run(_worker_holds, keys).values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler still holds results of a finished run after "
                               f"{timeout:.0f} s; the next run would reuse them instead of "
                               f"computing")
        time.sleep(0.005)


def _held(keys, dask_scheduler=None) -> int:
    """On the scheduler: how many of ``keys`` it still knows."""
    return sum(key in dask_scheduler.tasks for key in keys)


# -- on the workers (module-level functions, so that workers import them by name) ---------------


def _worker_holds(keys, dask_worker=None) -> int:
    """On a worker: how many of ``keys`` it still has results of."""
    return sum(key in dask_worker.data for key in keys)


def _worker_transfers(dask_worker=None) -> tuple[int, int]:
    """On a worker: how many transfers it has sent to other workers, and their bytes."""
    return dask_worker.transfer_outgoing_count_total, dask_worker.transfer_outgoing_bytes_total


#: Elements of a block checksummed at a time (:func:`_block_checksum`): its int64 temporaries
#: stay at 3 x 32 MiB, which a worker whose GPU holds an array larger than one GPU still finds.
CHECKSUM_PIECE = 2**22


def _block_checksum(block):
    """On a worker: an exact checksum of a block of labels (int64 sums of the labels and of the
    labels weighted by their position), as a (1, 2) int64 NumPy array; a piece of the block at
    a time (the same sums: integers add exactly in any order)."""
    xp = cuda.array_module(block)
    flat = block.reshape(-1)
    total = weighted = 0
    for start in range(0, flat.size, CHECKSUM_PIECE):
        piece = flat[start:start + CHECKSUM_PIECE].astype(np.int64)
        weights = (xp.arange(start, start + piece.size, dtype=np.int64) % 1009) + 1
        total += int(piece.sum())
        weighted += int((piece * weights).sum())
    return np.array([[total, weighted]], dtype=np.int64)


def _synchronize() -> None:
    """Wait for the worker's GPU to finish what was launched (launches are asynchronous)."""
    cp = sys.modules.get("cupy")
    if cp is not None:
        cp.cuda.Device().synchronize()


def _memory_start(gpu: bool):
    """Start measuring the worker's peak memory; the bytes it holds now (None: not measurable).

    GPU: the most bytes CuPy's memory pool has in use at any allocation from here
    (:class:`_PeakAllocator`: the pool's blocks in use, not those it keeps cached for reuse,
    which its total would count). Where CuPy allocates through RMM (dask-cuda's RMM options),
    RMM's allocation statistics (:mod:`rmm.statistics`): a fresh counter from here, so the
    bytes held now count as 0. CPU: ``tracemalloc`` (NumPy reports its buffers to it).
    """
    global _PEAK
    if gpu:
        cp = cuda.cupy()
        pool = cp.get_default_memory_pool()
        cp.cuda.Device().synchronize()
        allocator = cp.cuda.get_allocator()
        # the pool's, or a measure a failed run did not end (it starts afresh)
        if allocator == pool.malloc or (_PEAK is not None and allocator == _PEAK.malloc):
            _PEAK = _PeakAllocator(pool)
            cp.cuda.set_allocator(_PEAK.malloc)
            return pool.used_bytes()
        rmm = _rmm_statistics()
        if rmm is None:
            return None
        rmm.enable_statistics()
        rmm.push_statistics()
        return 0
    import tracemalloc

    tracemalloc.start()
    tracemalloc.reset_peak()
    return tracemalloc.get_traced_memory()[0]


class _PeakAllocator:
    """CuPy's allocator (``cupy.cuda.set_allocator``, process-wide) that allocates from the
    memory pool ``pool`` and keeps the most bytes the pool had in use after any allocation:
    the high-water mark of live device memory (in the pool's 512-byte rounding), where the
    pool's total also counts the freed blocks it caches, which a later allocation of another
    size cannot reuse. Blocks Numba allocates from the pool (Dask receiving a CuPy block) count
    from the next CuPy allocation on."""

    __slots__ = ("pool", "peak")

    def __init__(self, pool):
        self.pool = pool
        self.peak = pool.used_bytes()

    def malloc(self, size):
        memory = self.pool.malloc(size)
        used = self.pool.used_bytes()
        if used > self.peak:
            self.peak = used
        return memory


#: The worker's :class:`_PeakAllocator` between :func:`_memory_start` and :func:`_memory_end`.
_PEAK: _PeakAllocator | None = None


def _rmm_statistics():
    """:mod:`rmm.statistics` where CuPy allocates through RMM, else None."""
    allocator = cuda.cupy().cuda.get_allocator()
    if "rmm" not in (getattr(allocator, "__module__", None) or ""):
        return None
    try:
        import rmm.statistics
    except ImportError:
        return None
    return rmm.statistics


def _memory_end(gpu: bool):
    """``(held now, peak)`` in bytes since :func:`_memory_start` (None: not measurable)."""
    global _PEAK
    if gpu:
        cp = cuda.cupy()
        pool = cp.get_default_memory_pool()
        if _PEAK is not None and cp.cuda.get_allocator() == _PEAK.malloc:
            cp.cuda.set_allocator(pool.malloc)
            peak, _PEAK = _PEAK.peak, None
            held = pool.used_bytes()
            return held, max(peak, held)
        rmm = _rmm_statistics()
        counts = None if rmm is None else rmm.pop_statistics()
        if counts is None:
            return None
        return counts.current_bytes, counts.peak_bytes
    import tracemalloc

    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held, peak


def _memory(starts: dict, ends: dict) -> dict | None:
    """Per run: the largest peak above what a worker held before it, and working memory.

    ``working`` is the peak less what the worker holds at the end (its input and its share of
    the result): the transient memory of the tasks, when the peak comes as the last ones run.
    """
    per_worker = []
    for worker, start in starts.items():
        end = ends.get(worker)
        if start is None or end is None:
            return None
        held, peak = end
        per_worker.append({"peak_above_start": peak - start, "working": max(0, peak - held)})
    return {"peak_above_start": max(w["peak_above_start"] for w in per_worker),
            "working": max(w["working"] for w in per_worker)}


# -- the report -----------------------------------------------------------------------------------


def _nbytes(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) * DTYPE.itemsize


def _derive(rows) -> None:
    """Add the ratios to each row: to the no-halo time, to the fewest workers' time, to
    dask-image's best chunking (chunkernels rows)."""
    by = {(r["kind"], r["workers"], tuple(r["chunks"]), r["impl"]): r for r in rows}
    fewest, best = {}, {}
    for r in sorted(rows, key=lambda r: r["workers"]):
        fewest.setdefault((r["kind"], tuple(r["chunks"]), r["impl"]), r)
        if r["impl"] == DASK_IMAGE:
            key = (r["kind"], r["workers"])
            best[key] = min(best.get(key, np.inf), r["seconds"])
    for r in rows:
        base = by.get((r["kind"], r["workers"], tuple(r["chunks"]), NO_HALO))
        first = fewest[(r["kind"], tuple(r["chunks"]), r["impl"])]
        r["of_no_halo"] = r["seconds"] / base["seconds"]
        r["speedup"] = first["seconds"] / r["seconds"]
        r["speedup_over"] = first["workers"]
        if r["impl"] == CHUNKERNELS and (r["kind"], r["workers"]) in best:
            r["dask_image_best_over"] = best[(r["kind"], r["workers"])] / r["seconds"]


def _exchanges(steps) -> int:
    """Halo exchanges of the steps applied one by one: one per step with a halo."""
    return sum(any(chunkernels.pipeline([step]).depth(2)) for step in steps)


def _fmt_chunk(chunks) -> str:
    return "×".join(map(str, chunks))


def _where(r) -> str:
    """``"2 GPUs"``, ``"1 CPU worker"``: where row ``r`` ran."""
    what = "GPU" if r["kind"] == "gpu" else "CPU worker"
    return f"{r['workers']} {what}{'s' if r['workers'] > 1 else ''}"


def markdown(r) -> str:
    """The report's tables."""
    from dask.utils import format_bytes

    env, rows = r["environment"], r["rows"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    devices = sorted({d for c in r["clusters"] for d in c["devices"]}) or ["CPU workers"]
    get = {(x["kind"], x["workers"], tuple(x["chunks"]), x["impl"]): x for x in rows}
    places = list(dict.fromkeys((x["kind"], x["workers"]) for x in rows))
    chunkings = list(dict.fromkeys(tuple(x["chunks"]) for x in rows))
    impls = list(dict.fromkeys(x["impl"] for x in rows))
    shape = "×".join(map(str, r["shape"]))
    lines = [
        f"### scaling: gaussian_filter σ={r['sigma']:g}, {shape} {r['dtype']} "
        f"({format_bytes(r['nbytes'])}) on {', '.join(devices)} ({env['date'][:10]})", "",
        f"Versions: {versions}. Halo {'×'.join(map(str, r['halo']))} per side. Wall clock from "
        f"building the graph to a persisted result (with every GPU synchronised), median of "
        f"{r['repeat']} runs; the input is created and persisted on the workers first. "
        f"Workers connected over {bench.protocols(r['clusters'])}.", "",
        "| workers | chunk | blocks per worker | chunkernels (s) | no halo, map_blocks (s) | "
        "dask-image (s) | chunkernels ÷ no halo | dask-image best ÷ chunkernels | "
        "chunkernels GB/s | transfers per run | MiB moved per run |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(key, field="seconds", fmt="{:.3f}"):
        row = get.get(key)
        return "-" if row is None or row.get(field) is None else fmt.format(row[field])

    for kind, workers in places:
        for chunks in chunkings:
            k = (kind, workers, chunks)
            ours = get[(*k, CHUNKERNELS)]
            per_worker = " / ".join(map(str, ours.get("blocks_per_worker") or [ours["blocks"]]))
            lines.append(
                f"| {_where(ours)} | {_fmt_chunk(chunks)} | {per_worker} | "
                f"{cell((*k, CHUNKERNELS))} | {cell((*k, NO_HALO))} | {cell((*k, DASK_IMAGE))} | "
                f"{cell((*k, CHUNKERNELS), 'of_no_halo', '{:.2f}×')} | "
                f"{cell((*k, CHUNKERNELS), 'dask_image_best_over', '{:.1f}×')} | "
                f"{cell((*k, CHUNKERNELS), 'GB/s', '{:.3g}')} | "
                f"{cell((*k, CHUNKERNELS), 'transfers_per_run', '{:.1f}')} | "
                f"{_mib(ours.get('bytes_moved_per_run'))} |")

    if len(places) > 1:
        first = _where(get[(*places[0], chunkings[0], CHUNKERNELS)])
        lines += ["", f"Speed-up over {first} (same implementation and chunk):", "",
                  "| implementation | chunk | " + " | ".join(
                      _where(get[(*p, chunkings[0], CHUNKERNELS)]) for p in places) + " |",
                  "|---|---|" + "---:|" * len(places)]
        for impl in impls:
            for chunks in chunkings:
                lines.append(f"| {impl} | {_fmt_chunk(chunks)} | " + " | ".join(
                    cell((*p, chunks, impl), "speedup", "{:.2f}×") for p in places) + " |")

    lines += _profile_table(r, places, chunkings, get)

    lines += ["", "Peak memory per worker above what it held before the run (largest over the "
              "workers; the blocks in use in CuPy's pool on GPUs, tracemalloc on CPUs), and "
              "working memory: the peak "
              "less what the worker holds after the run (its input and its share of the "
              "result), in multiples of one chunk with its halo:", "",
              "| workers | chunk | chunk + halo | " + " | ".join(
                  f"{i}: peak, working" for i in impls) + " |",
              "|---|---|---:|" + "---:|" * len(impls)]
    for kind, workers in places:
        for chunks in chunkings:
            unit = r["chunk_halo_bytes"]["x".join(map(str, chunks))]
            cells = []
            for impl in impls:
                mem = get[(kind, workers, chunks, impl)]["memory"]
                cells.append("-" if mem is None else
                             f"{format_bytes(mem['peak_above_start'])}, "
                             f"{mem['working'] / unit:.1f}×")
            lines.append(f"| {_where(get[(kind, workers, chunks, CHUNKERNELS)])} | "
                         f"{_fmt_chunk(chunks)} | {format_bytes(unit)} | " + " | ".join(cells)
                         + " |")

    saved = r["pipeline_exchanges"] - 1
    lines += ["", f"Pipeline {_chain(r['pipeline'])}: the steps as {saved + 1} `apply` calls "
              f"({saved + 1} halo exchanges) against `chunkernels.pipeline` (one). One exchange "
              "costs about the chunkernels time less the no-halo time (last column: time "
              "saved in units of that, where one exchange costs more than the runs vary, "
              f"{NOISE:.0%} of the no-halo time).", "",
              "| workers | chunk | separate (s) | fused (s) | time saved (s) | exchanges saved | "
              "one exchange (s) | time saved ÷ one exchange |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for kind, workers in places:
        for chunks in chunkings:
            k = (kind, workers, chunks)
            sep, fused = get[(*k, SEPARATE)]["seconds"], get[(*k, FUSED)]["seconds"]
            exchange = get[(*k, CHUNKERNELS)]["seconds"] - get[(*k, NO_HALO)]["seconds"]
            noise = NOISE * get[(*k, NO_HALO)]["seconds"]
            ratio = f"{(sep - fused) / exchange:.1f}" if exchange > noise else "-"
            lines.append(f"| {_where(get[(*k, CHUNKERNELS)])} | {_fmt_chunk(chunks)} | "
                         f"{sep:.3f} | {fused:.3f} | {sep - fused:.3f} | {saved} | "
                         f"{exchange:.3f} | {ratio} |")
    if r.get("labels"):
        lines += ["", f"Label of `x < {FOREGROUND}` (the same blocks; labels identical on every "
                  f"cluster, checked by per-block checksums, and equal to SciPy's where "
                  f"marked):", "",
                  "| workers | chunk | labels | seconds | speed-up | transfers per run | "
                  "MiB moved per run | SciPy checked |", "|---|---|---:|---:|---:|---:|---:|---|"]
        for row in r["labels"]:
            lines.append(f"| {_where(row)} | {_fmt_chunk(row['chunks'])} | {row['count']} | "
                         f"{row['seconds']:.3f} | {row.get('speedup', 1.0):.2f}× | "
                         f"{row['transfers_per_run']:.1f} | {_mib(row['bytes_moved_per_run'])} | "
                         f"{_SCIPY_CHECKED[row.get('scipy')]} |")
    lines += [""] + [f"Note: {n}" for n in r["notes"]]
    return "\n".join(lines).rstrip()


def _profile_table(r, places, chunkings, get) -> list[str]:
    """Where one run's wall time goes (:func:`_profile`), per cluster and implementation."""
    rows = []
    for kind, workers in places:
        for chunks in chunkings:
            found = [(impl, get.get((kind, workers, chunks, impl))) for impl in PROFILED]
            found += [(LABEL, row) for row in r.get("labels", [])
                      if (row["kind"], row["workers"], tuple(row["chunks"])) == (kind, workers,
                                                                                 chunks)]
            for impl, row in found:
                p = None if row is None else row.get("profile")
                if p is None:
                    continue
                top = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in p["top"])
                rows.append(f"| {_where(row)} | {_fmt_chunk(chunks)} | {impl} | "
                            f"{p['wall'] * 1e3:.0f} | {p['build'] * 1e3:.0f} | "
                            f"{p['to_first_task'] * 1e3:.0f} | {p['busy'] * 1e3:.0f} | "
                            f"{p['transfers'] * 1e3:.0f} | {p['after_last_task'] * 1e3:.0f} | "
                            f"{p['tasks']} | {top} |")
    if not rows:
        return []
    return ["", "Where the time of one more run goes, in ms (distributed's task stream): building "
            "the graph on the client; from its submission to the first task; the busiest "
            "worker's task time (its thread: on GPUs the launches, which return before the "
            "kernels finish); the busiest worker's incoming transfers; from the last task's end "
            "to the result with every GPU synchronised; the tasks run; the task groups with the "
            "most task time (ms):", "",
            "| workers | chunk | implementation | wall | build | to first task | busiest worker | "
            "transfers | after last task | tasks | most task time |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|", *rows]


def _mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def plots(r) -> list[dict]:
    """Throughput against chunk size; speed-up against the number of workers."""
    rows = r["rows"]
    places = list(dict.fromkeys((x["kind"], x["workers"]) for x in rows))
    impls = list(dict.fromkeys(x["impl"] for x in rows))
    chunkings = list(dict.fromkeys(tuple(x["chunks"]) for x in rows))
    throughput = []
    for impl in impls:
        for place in places:
            sel = [x for x in rows if x["impl"] == impl and (x["kind"], x["workers"]) == place]
            throughput.append({"label": f"{impl}, {_where(sel[0])}",
                               "x": [x["chunks"][0] for x in sel], "y": [x["GB/s"] for x in sel]})
    shape = "×".join(map(str, r["shape"]))
    out = [{"name": "throughput", "title": f"gaussian_filter σ={r['sigma']:g}, {shape} "
            f"{r['dtype']}", "xlabel": "chunk side (elements)", "ylabel": "GB/s of input",
            "xlog": 2, "xticks": sorted({c[0] for c in chunkings}), "series": throughput}]
    if len(places) > 1:
        counts = [w for _, w in places]
        speedup = [{"label": "ideal", "x": counts, "y": [w / counts[0] for w in counts],
                    "style": "k--"}]
        for impl in (CHUNKERNELS, NO_HALO, DASK_IMAGE):
            for chunks in chunkings:
                sel = [x for x in rows if x["impl"] == impl and tuple(x["chunks"]) == chunks]
                if sel:
                    speedup.append({"label": f"{impl}, chunks {_fmt_chunk(chunks)}",
                                    "x": [x["workers"] for x in sel],
                                    "y": [x["speedup"] for x in sel]})
        out.append({"name": "speedup", "title": f"speed-up, {shape} {r['dtype']}",
                    "xlabel": "workers (GPUs, or CPU processes)",
                    "ylabel": f"speed-up over {counts[0]} worker(s)", "xticks": counts,
                    "series": speedup})
    return out
