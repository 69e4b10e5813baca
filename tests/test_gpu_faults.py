"""GPU faults and concurrency (issue #20): worker deaths, running out of device memory in the
middle of a graph, eight threads launching on one GPU, and the compute-sanitizer cases.

Everything here needs a GPU (``gpu``) or two (``multigpu``) and skips without; on a device::

    PYTHONPATH=$PWD python -m pytest -q -rs tests/test_gpu_faults.py

Nothing may hang: every wait has a timeout, and a test still running after :data:`HANG`
seconds ends the run with every thread's traceback (``faulthandler``). Results are compared with
SciPy: exactly where the arithmetic is exact (integer-valued data and weights, labels), within
float rounding elsewhere. The sanitizer itself runs as a script (``tests/gpu_sanitizer.py``); here
its cases run once without it, so that a broken case is caught in the suite.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from conftest import demo_in_a_thread
from gpu_pools import limited_pool, pool_used, unlimited_pool

import chunkernels
from chunkernels import GPUOutOfMemoryError, cluster
from chunkernels import ndimage as cnd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_sanitizer  # noqa: E402 - the script beside this file

#: Seconds any test here may run before faulthandler ends the run, with tracebacks.
HANG = 420
#: Seconds a worker's input block takes to copy (slowed down so that the kernel is still
#: running over the other blocks when a worker dies).
SLOW = 0.02
MiB = 2**20
QUIET = {"dashboard_address": None}
#: 1, 2, and every GPU where there are more than 2 (4 on an x4 machine): ``"all"``.
GPUS = [pytest.param(1, marks=pytest.mark.gpu, id="1-gpu"),
        pytest.param(2, marks=pytest.mark.multigpu, id="2-gpus"),
        pytest.param("all", marks=pytest.mark.multigpu, id="every-gpu")]


@pytest.fixture(autouse=True)
def _no_hang():
    faulthandler.dump_traceback_later(HANG, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# -- a GPU worker killed mid-compute ---------------------------------------------------------------


def _slow_copy(block):
    """A worker's copy of its input block, slowed down: the graph runs long enough to be
    interrupted."""
    time.sleep(SLOW)
    return block.copy()


def _on_gpus(x_np, chunks):
    import cupy as cp

    meta = cp.empty((0,) * x_np.ndim, dtype=x_np.dtype)
    return da.from_array(x_np, chunks=chunks).map_blocks(cp.asarray, meta=meta)


def _held(worker, prefix, dask_scheduler=None):
    """On the scheduler: results of tasks whose key name starts with ``prefix`` held by
    ``worker``."""
    mine = 0
    for key, ts in dask_scheduler.tasks.items():
        name = key[0] if isinstance(key, tuple) else key
        if isinstance(name, str) and name.startswith(prefix) and ts.state == "memory":
            mine += any(ws.address == worker for ws in ts.who_has)
    return mine


def _kill_when_holding(c, prefix, running, at_least=1, timeout=120.0):
    """SIGKILL the first worker once it holds ``at_least`` results of tasks named ``prefix...``
    while ``running()`` is true (the computation is not over); returns the killed pid."""
    pids = c.run(os.getpid)
    victim = sorted(pids)[0]
    deadline = time.monotonic() + timeout
    while c.run_on_scheduler(_held, victim, prefix) < at_least:
        assert running(), f"the computation ended before a worker held {at_least} {prefix} " \
                          f"result(s): make SLOW longer"
        assert time.monotonic() < deadline, f"no worker held {at_least} {prefix} result(s)"
        time.sleep(0.005)
    assert running(), "the computation ended before the worker was killed"
    os.kill(pids[victim], signal.SIGKILL)
    return pids[victim]


def _back_to(c, n, killed):
    """Wait for the nannies to replace the killed worker; the cluster is whole again."""
    c.wait_for_workers(n, timeout=120)
    assert killed not in c.run(os.getpid).values()


def _count(gpus) -> int:
    """``gpus`` of :data:`GPUS` as a number of GPUs; skips "all" where 2 GPUs cover it."""
    if gpus != "all":
        return gpus
    n = chunkernels.cuda.gpu_count()
    if n <= 2:
        pytest.skip(f"{n} GPU(s): the 1-gpu and 2-gpus cases cover them")
    return n


@contextlib.contextmanager
def _gpu_cluster(gpus):
    """A client on a LocalCUDACluster of ``gpus`` workers whose scheduler lets a task witness a
    few worker deaths (set before the scheduler starts: it reads the setting then)."""
    pytest.importorskip("dask_cuda")
    with dask.config.set({"distributed.scheduler.allowed-failures": 4}), \
            cluster.client(gpus=gpus, **QUIET) as c:
        yield c


@pytest.mark.parametrize("gpus", GPUS)
def test_a_gpu_worker_killed_mid_filter_changes_nothing(gpus):
    gpus = _count(gpus)
    import cupy as cp
    from distributed import futures_of, wait

    rng = np.random.default_rng(0)
    x_np = rng.integers(0, 1000, (512, 640)).astype(np.float64)  # sums of integers are exact
    weights = rng.integers(-3, 4, (7, 5)).astype(np.float64)
    expected = ndi.correlate(x_np, weights, mode="reflect")
    with _gpu_cluster(gpus) as c:
        x = c.persist(_on_gpus(x_np, (64, 80)))  # 64 blocks on the GPUs
        wait(x, timeout=120)
        slow = x.map_blocks(_slow_copy, meta=x._meta)
        z = c.persist(cnd.correlate(slow, weights, mode="reflect"))
        futures = futures_of(z)
        killed = _kill_when_holding(c, z.name, lambda: not all(f.done() for f in futures), 2)
        wait(z, timeout=180)
        got = cp.asnumpy(c.compute(z, sync=True))
        np.testing.assert_array_equal(got, expected)
        _back_to(c, gpus, killed)


@pytest.mark.parametrize("gpus", GPUS)
def test_a_gpu_worker_killed_mid_label_changes_nothing(gpus):
    gpus = _count(gpus)
    import cupy as cp
    from distributed import futures_of, wait

    rng = np.random.default_rng(1)
    x_np = rng.random((600, 520)) < 0.55  # around percolation: components span chunks
    structure = ndi.generate_binary_structure(2, 2)
    expected, expected_n = ndi.label(x_np, structure)
    with _gpu_cluster(gpus) as c:
        # lazy blocks: the label runs a task per block ("-local"), whose results the worker
        # loses (blocks persisted on the cluster would make worker groups, see placement)
        x = _on_gpus(x_np, (75, 65))
        labels, count = cnd.label(x.map_blocks(_slow_copy, meta=x._meta), structure)
        labels, count = c.persist([labels, count])
        futures = futures_of(labels) + futures_of(count)
        killed = _kill_when_holding(c, f"{labels.name}-local",
                                    lambda: not all(f.done() for f in futures))
        wait([labels, count], timeout=180)
        got, n = c.compute([labels, count], sync=True)
        assert int(n) == expected_n
        np.testing.assert_array_equal(cp.asnumpy(got), expected)
        _back_to(c, gpus, killed)


@pytest.mark.parametrize("gpus", GPUS)
def test_a_gpu_worker_killed_mid_demo_pipeline_changes_nothing(gpus, tmp_path, capsys):
    """The demo's pipeline (synthetic sky, κ-σ clipping, threshold, label, measure), checked by
    the demo itself against the lesson's CPU code and scipy.ndimage (exit status 0), with a GPU
    worker killed while it labels; with one GPU, a clear error after the no-workers timeout
    instead of a hang."""
    gpus = _count(gpus)
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    with _gpu_cluster(gpus) as c:
        thread, outcome = demo_in_a_thread(c, tmp_path, "--size", "2048", "--chunks", "256",
                                           "--seed", "3")
        killed = _kill_when_holding(c, "label-", thread.is_alive)
        thread.join(timeout=300)
        assert not thread.is_alive(), "the demo's pipeline hangs after a worker died"
        if gpus == 1:
            # Its only worker died: the placed blocks' recomputation is restricted to the dead
            # worker's address (distributed reschedules it onto no other: dask/distributed#7346),
            # so it fails after the clusters' no-workers timeout rather than wait for ever.
            from distributed.scheduler import NoValidWorkerError

            assert isinstance(outcome.get("error"), NoValidWorkerError), outcome
            _back_to(c, gpus, killed)
            return
        assert "error" not in outcome, repr(outcome.get("error"))
        report = capsys.readouterr()
        assert outcome["status"] == 0, report.out + report.err  # its CPU comparison failed
        _back_to(c, gpus, killed)


# -- out of device memory in the middle of a graph -------------------------------------------------


def _warm_up() -> None:
    """Compile the filter and upload its weights before any limit is measured."""
    import cupy as cp

    cnd.gaussian_filter(cp.ones((64, 64), cp.float32), 2)
    cp.cuda.Device().synchronize()


@pytest.mark.gpu
def test_out_of_memory_in_the_middle_of_a_graph_names_kernel_block_and_fix():
    """Small blocks fit the worker's memory, the last one does not: the graph fails with
    GPUOutOfMemoryError naming the kernel, the block (its shape with the halo, and its index in
    the grid, added by the graph layer) and a chunking that fits; then the same worker computes
    the next graph, right."""
    pytest.importorskip("dask_cuda")
    import cupy as cp
    from distributed import wait

    rng = np.random.default_rng(2)
    x_np = rng.random((3072, 1024)).astype(np.float32)
    chunks = ((256, 256, 256, 256, 2048), (1024,))  # 1 MiB blocks, then an 8 MiB one
    with cluster.client(gpus=1, rmm_async=False, rmm_allocator_external_lib_list=None,
                        **QUIET) as c:
        (worker, pid), = c.run(os.getpid).items()
        x = c.persist(_on_gpus(x_np, chunks))
        wait(x, timeout=120)
        c.run(_warm_up)
        (used,) = c.run(limited_pool, 12 * MiB).values()
        try:
            with pytest.raises(GPUOutOfMemoryError) as caught:
                cnd.gaussian_filter(x, 2).compute()
            err = caught.value
            text = "\n".join([str(err), *getattr(err, "__notes__", [])])
            assert re.match(r"gaussian_filter: the GPU ran out of memory on a block of shape "
                            r"\(20\d\d, 1024\) float32 ", str(err)), text
            assert "x = x.rechunk((1024, 512))" in str(err), text
            assert re.search(r"\(4, 0\)", text), f"the block's index (4, 0) is not named: {text}"
            deadline = time.monotonic() + 60  # the graph's other results are released too
            while c.run(pool_used) != {worker: used}:
                assert time.monotonic() < deadline, f"the failed graph left memory behind: " \
                                                    f"{c.run(pool_used)} != {used}"
                time.sleep(0.1)
            small_np = x_np[:512, :512]
            small = _on_gpus(small_np, 128)
            got = cnd.gaussian_filter(small, 2).compute()
            np.testing.assert_allclose(cp.asnumpy(got), ndi.gaussian_filter(small_np, 2),
                                       rtol=1e-5, atol=1e-6)
            assert c.run(os.getpid) == {worker: pid}  # the same worker process served both
        finally:
            c.run(unlimited_pool)


# -- eight threads launching on one GPU ------------------------------------------------------------


def _jobs(rng):
    """``[(name, run(cupy input) -> result, input, expected, exact)]``: kernels of every kind
    (separable and N-D filters, labels, resampling, a measurement, an elementwise kernel)."""
    import cupy as cp

    ints = rng.integers(0, 200, (70, 90)).astype(np.float64)
    weights = rng.integers(-2, 3, (5, 3)).astype(np.float64)
    smooth = rng.random((64, 80)).astype(np.float32)
    binary = rng.random((96, 77)) < 0.5
    labels = ndi.label(binary)[0]
    values = rng.integers(0, 9, labels.shape).astype(np.float64)
    row = rng.integers(0, 50, 90).astype(np.float64)
    labels_dev, row_dev = cp.asarray(labels), cp.asarray(row)
    index = np.arange(1, 40)
    return [
        ("correlate", lambda x: cnd.correlate(x, weights, mode="mirror"), ints,
         ndi.correlate(ints, weights, mode="mirror"), True),
        ("gaussian_filter", lambda x: cnd.gaussian_filter(x, 1.5), smooth,
         ndi.gaussian_filter(smooth, 1.5), False),
        ("uniform_filter", lambda x: cnd.uniform_filter(x, 5, mode="wrap"), ints,
         ndi.uniform_filter(ints, 5, mode="wrap"), False),
        ("label", cnd.label, binary, ndi.label(binary), True),
        ("zoom", lambda x: cnd.zoom(x, 1.3, order=1), smooth, ndi.zoom(smooth, 1.3, order=1),
         False),
        ("sum_labels", lambda x: cnd.sum_labels(x, labels_dev, index), values,
         ndi.sum_labels(values, labels, index), True),
        ("broadcast_add", lambda x: chunkernels.apply(x, "broadcast_add", row_dev), ints,
         ints + row, True),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("streams", ["default stream", "a stream per thread"])
def test_eight_threads_launching_on_one_gpu_agree_with_scipy(streams):
    """1000 calls from 8 threads at once (the launcher holds the GIL and packs arguments into a
    buffer per thread): every result equals SciPy's."""
    import cupy as cp

    jobs = _jobs(np.random.default_rng(4))
    inputs = [cp.asarray(job[2]) for job in jobs]
    for job, x in zip(jobs, inputs):  # compile every kernel before the threads start
        job[1](x)
    cp.cuda.Device().synchronize()
    calls, threads = 1000, 8
    start = threading.Barrier(threads)
    failures = []

    def check(got, expected, exact, where):
        if isinstance(expected, tuple):  # label: (labels, count)
            check(got[0], expected[0], True, where)
            assert int(got[1]) == expected[1], where
            return
        got = cp.asnumpy(got)
        if exact:
            np.testing.assert_array_equal(got, expected, err_msg=where)
        else:
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6, err_msg=where)

    def worker(t):
        start.wait(timeout=60)
        stream = cp.cuda.Stream(non_blocking=True) if streams != "default stream" \
            else cp.cuda.Stream.null
        with stream:
            for i in range(t, calls, threads):
                name, run, _, expected, exact = jobs[i % len(jobs)]
                where = f"call {i} ({name}) in thread {t}"
                try:
                    check(run(inputs[i % len(jobs)]), expected, exact, where)
                except Exception as exc:  # noqa: BLE001 - collected, reported below
                    failures.append(f"{where}: {type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(worker, t) for t in range(threads)]:
            future.result(timeout=300)
    assert not failures, f"{len(failures)} of {calls} calls wrong:\n" + "\n".join(failures[:10])


# -- the compute-sanitizer cases -------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(gpu_sanitizer.CASES))
def test_sanitizer_cases_are_right_without_the_sanitizer(name):
    """Each case of ``tests/gpu_sanitizer.py`` runs and checks its results in a process of its
    own (no memory pool there), as the script then runs it under compute-sanitizer."""
    done = subprocess.run([sys.executable, str(HERE / "gpu_sanitizer.py"), "--run", name],
                          capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"case {name}: results correct" in done.stdout


def test_sanitizer_script_lists_its_cases(capsys):
    assert gpu_sanitizer.main(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"label-2d", "label-3d", "label-chunked", "zoom", "kappa-sigma",
            "halo-gather"} <= set(listed)


def test_the_sanitizer_reports_the_kernels_errors_not_api_errors(tmp_path, capsys):
    """Issue #20: memcheck reported the launcher's query past the last kernel parameter (how a
    driver without cuFuncGetParamCount tells the count: CUDA_ERROR_INVALID_VALUE) as an error
    on every case. The tool runs with ``--report-api-errors no``: memory errors are what fail a
    case (a fake compute-sanitizer records how it is called)."""
    seen = tmp_path / "argv"
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f'#!/bin/sh\necho "$@" > {seen}\n')
    fake.chmod(0o755)
    assert gpu_sanitizer.main(["--tool", "racecheck", "--sanitizer", str(fake), "--no-warm",
                               "--case", "zoom"]) == 0
    argv = seen.read_text().split()
    assert argv[:2] == ["--tool", "racecheck"]
    assert argv[argv.index("--report-api-errors") + 1] == "no"
    assert argv[argv.index("--error-exitcode") + 1] == str(gpu_sanitizer.SANITIZER_ERROR)
    assert "ok    zoom" in capsys.readouterr().out


def test_label_halving_patch_applies_and_compiles(tmp_path):
    """``--label-halving`` rebuilds d79960e's label_tiles from today's label.cu: the lookup it
    replaces is still there, and the result compiles (nvcc, no GPU needed)."""
    from test_nvcc import compile_entries

    from chunkernels import cuda

    patched = gpu_sanitizer._with_halving(cuda.source("label"))
    assert patched.count("label_find_halving(") == 2  # defined, and called in label_tiles
    source = tmp_path / "label_halving.cu"
    source.write_text(patched)
    done = compile_entries(source, ["label_tiles<bool, int>", "label_tiles<float, long long>"],
                           tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
