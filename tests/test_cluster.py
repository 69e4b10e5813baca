"""``chunkernels.cluster.client``: CPU clusters here, GPU clusters on GPU machines, errors."""

from __future__ import annotations

import importlib.util
import os
import sys

import dask.array as da
import numpy as np
import pytest
from conftest import moving_sum_reference, random_array

import chunkernels
from chunkernels import cluster
from chunkernels.cli import main
from chunkernels.testing import assert_close

QUIET = {"dashboard_address": None}


def test_cpu_cluster_of_threads_runs_apply_and_closes_with_the_client(moving_sum):
    x_np = random_array(np.random.default_rng(0), (9, 14), "float64")
    with cluster.client(gpus=0, **QUIET) as c:
        assert cluster.worker_count(c) == 1
        assert c.cluster.processes is False
        assert cluster.describe(c).startswith("1 worker(s) on CPU, scheduler ")
        assert cluster.protocol(c) == "inproc"  # threads in this process
        got = chunkernels.apply(da.from_array(x_np, chunks=(4, 5)), "moving_sum", radius=2)
        assert_close(got.compute(), moving_sum_reference(x_np, radius=2))  # on c: the default
        started = c.cluster
    assert c.status == "closed"
    assert started.status.name == "closed"


def test_a_cpu_cluster_on_a_host_with_gpus_is_described_as_cpu(monkeypatch):
    # its worker of threads is this process, which sees the host's GPUs: it was still asked
    # for as a CPU worker (gpus=0), and the demo and the benchmarks make NumPy data on it
    from chunkernels import cuda

    monkeypatch.setattr(cuda, "gpu_count", lambda: 1)
    with cluster.client(gpus=0, **QUIET) as c:
        assert cluster.gpu_names(c) == []
        assert cluster.describe(c).startswith("1 worker(s) on CPU, scheduler ")
        assert c.run(cluster._gpu_name) == {w: "" for w in c.scheduler_info()["workers"]}


def test_cpu_cluster_of_processes(moving_sum):
    x_np = random_array(np.random.default_rng(1), (8, 12), "int64")
    with cluster.client(gpus=0, processes=True, n_workers=2, threads=1, **QUIET) as c:
        assert cluster.worker_count(c) == 2
        info = c.scheduler_info(n_workers=-1)["workers"].values()
        assert [w["nthreads"] for w in info] == [1, 1]
        assert len(set(c.run(os.getpid).values())) == 2  # two processes, neither this one
        assert os.getpid() not in c.run(os.getpid).values()
        # the user kernel travels with the tasks to processes that never registered it
        got = chunkernels.apply(da.from_array(x_np, chunks=3), "moving_sum", mode="wrap")
        assert_close(got.compute(), moving_sum_reference(x_np, mode="wrap"))


def test_no_gpu_here_means_a_cpu_cluster(monkeypatch):
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 0)
    with cluster.client(**QUIET) as c:
        assert cluster.describe(c).startswith("1 worker(s) on CPU")


def test_connecting_to_a_scheduler_leaves_its_cluster_running():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, **QUIET) as running:
        with cluster.client(scheduler=running.scheduler_address) as c:
            assert c.scheduler.address == running.scheduler_address
            assert int(da.arange(10, chunks=3).sum().compute()) == 45
        assert running.status.name == "running"


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": -1}, r"gpus=-1; expected None \(all GPUs, or CPU workers without one\), 0 \(CPU "
                   r"workers\) or a positive number of GPUs"),
    ({"gpus": True}, r"gpus=True; expected None"),
    ({"gpus": 1.5}, r"gpus=1.5; expected None"),
    ({"scheduler": "tcp://127.0.0.1:1", "gpus": 2, "n_workers": 3},
     r"scheduler='tcp://127.0.0.1:1' connects to a running cluster, whose workers are already set "
     r"up; gpus, n_workers only describe\(s\) a local cluster"),
    ({"protocol": "nvlink"}, r"protocol='nvlink'; expected one of \('tcp', 'ucx', 'inproc'\)"),
    ({"scheduler": "tcp://127.0.0.1:1", "protocol": "ucx"}, r"protocol only describe\(s\) a "
                                                             r"local cluster"),
    ({"gpus": 0, "protocol": "ucx"}, r"protocol='ucx' moves GPU blocks between GPU workers; this "
                                     r"is a CPU cluster"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cluster.client(**kwargs)


def test_more_gpus_than_present_says_how_many_there_are(monkeypatch):
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 0)
    with pytest.raises(ValueError, match=r"gpus=2 asks for more GPUs than there are: no CUDA GPU "
                                         r"is visible here \(CuPy is missing or found no device\)\. "
                                         r"Ask for at most 0, or gpus=0 for CPU workers"):
        cluster.client(gpus=2)
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with pytest.raises(ValueError, match=r"gpus=4 asks for more GPUs than there are: 2 CUDA "
                                         r"GPU\(s\) are visible here \(CUDA_VISIBLE_DEVICES='3,5'\)"):
        cluster.client(gpus=4)


def test_gpu_workers_are_the_first_visible_devices(monkeypatch):
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cluster._devices(None) == ["0", "1", "2", "3"]
    assert cluster._devices(2) == ["0", "1"]
    assert cluster._devices(0) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6, 2,7,1")
    assert cluster._devices(3) == ["6", "2", "7"]


def test_gpu_cluster_errors_without_dask_cuda_or_with_threads_only(monkeypatch):
    import importlib.util

    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"GPU workers are processes, one per GPU .*processes=False "
                                         r"applies to CPU clusters only \(gpus=0\)"):
        cluster.client(gpus=1, processes=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "dask_cuda" else real(name, *a))
    with pytest.raises(ImportError, match=r"a cluster of GPU workers needs dask-cuda, which is not "
                                          r"installed: pip install 'chunkernels\[cuda12\]'"):
        cluster.client(gpus=1)


def test_ucx_without_its_extra_names_the_extra(monkeypatch):
    import importlib.util

    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 2)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "distributed_ucxx" else real(name, *a))
    with pytest.raises(ImportError, match=r"protocol='ucx' needs UCX for Dask \(distributed-ucxx\) "
                                          r"and RMM, which are not installed: pip install "
                                          r"'chunkernels\[ucx-cu12\]'"):
        cluster.client(gpus=2, protocol="ucx")


def test_a_cpu_cluster_takes_a_protocol():
    with cluster.client(gpus=0, processes=True, n_workers=1, threads=1, protocol="tcp",
                        **QUIET) as c:
        assert c.scheduler.address.startswith("tcp://")
        assert int(da.arange(10, chunks=3).sum().compute()) == 45


def test_cli_check_on_a_cpu_cluster(capsys):
    assert main(["check", "--cpu-only", "--gpus", "0", "broadcast_add"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cluster: 1 worker(s) on CPU, scheduler ")
    assert "broadcast_add  cpu, dask chunks  10     pass" in out


def test_cli_gpus_and_scheduler_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", "--gpus", "1", "--scheduler", "tcp://127.0.0.1:8786"])
    assert info.value.code == 2
    assert "argument --scheduler: not allowed with argument --gpus" in capsys.readouterr().err


# -- GPU clusters -------------------------------------------------------------------------------


def _cupy_chunks(x_np, chunks):
    cp = chunkernels.cuda.cupy()
    return da.from_array(x_np, chunks=chunks).map_blocks(cp.asarray,
                                                         meta=cp.empty((0,) * x_np.ndim, x_np.dtype))


@pytest.mark.gpu
def test_one_gpu_worker_runs_the_cuda_kernel():
    x_np = random_array(np.random.default_rng(2), (64, 96), "float32")
    y_np = random_array(np.random.default_rng(3), (96,), "float32")
    with cluster.client(gpus=1, **QUIET) as c:
        assert cluster.worker_count(c) == 1
        assert " GPU(s): " in cluster.describe(c)
        z = chunkernels.apply(_cupy_chunks(x_np, (16, 32)), "broadcast_add", y_np).compute()
        assert chunkernels.cuda.is_cupy_array(z)
        assert_close(z, x_np + y_np)


@pytest.mark.multigpu
def test_one_worker_per_gpu():
    n = chunkernels.cuda.gpu_count()
    x_np = random_array(np.random.default_rng(4), (256, 64), "float32")
    with cluster.client(gpus=n, **QUIET) as c:
        assert cluster.worker_count(c) == n
        gpus = set(c.run(_pci_bus_of_device_0).values())
        assert len(gpus) == n  # each worker sees a different GPU as its device 0
        z = chunkernels.apply(_cupy_chunks(x_np, (16, 64)), "broadcast_add", 1.0).persist()
        from distributed import futures_of, wait

        wait(z)
        holders = {w for ws in c.who_has(futures_of(z)).values() for w in ws}
        assert len(holders) == n  # the blocks were spread over every GPU worker
        assert_close(z.compute(), x_np + np.float32(1))


def _pci_bus_of_device_0() -> str:
    """On a worker: the PCI bus of the GPU it sees as device 0."""
    import cupy

    return cupy.cuda.Device(0).pci_bus_id


def test_current_client_is_none_without_a_client_and_imports_nothing():
    import subprocess
    import sys

    code = ("import sys; from chunkernels import cluster; assert cluster.current() is None; "
            "assert 'distributed' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    with cluster.client(gpus=0, **QUIET) as c:
        assert cluster.current() is c
    assert cluster.current() is None


#: Run in a fresh interpreter, where distributed is not imported yet: threads build and compute
#: chunked labellings (``label`` asks ``cluster.current()`` while building its graph) while the
#: main thread imports distributed. The import of ``distributed.client`` is slowed down by a
#: second, so that ``distributed`` sits half-initialised in ``sys.modules``, without its
#: ``default_client``, for as long as the threads need to meet it there: the race of issue #20
#: made deterministic.
_RACE = r"""
import importlib.machinery, sys, threading, time

class SlowClientImport:
    def find_spec(self, name, path, target=None):
        if name != "distributed.client":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module
        def slowly(module):
            time.sleep(1.0)
            exec_module(module)
        spec.loader.exec_module = slowly
        return spec

import dask.array as da
import numpy as np
import chunkernels.ndimage as cnd

x_np = np.random.default_rng(0).random((40, 50)) > 0.5
x = da.from_array(x_np, chunks=(16, 20))
cnd.label(x)  # warm up: the kernels' modules imported, the graph built once
assert "distributed" not in sys.modules, "the test needs a process without distributed"
expected = cnd.label(x_np)[0]
sys.meta_path.insert(0, SlowClientImport())
errors, calls, stop = [], [0], threading.Event()

def loop():
    while not stop.is_set():
        try:
            labels, _ = cnd.label(x)
            assert (labels.compute(scheduler="threads") == expected).all()
            calls[0] += 1
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            return

threads = [threading.Thread(target=loop) for _ in range(4)]
for t in threads:
    t.start()
time.sleep(0.05)
import distributed  # noqa: E402,F401 - the import under test
stop.set()
for t in threads:
    t.join(timeout=60)
assert not any(t.is_alive() for t in threads), "a labelling thread hangs"
print("calls", calls[0])
print("errors", errors)
"""


def test_current_is_safe_while_another_thread_imports_distributed():
    """Issue #20: ``cluster.current()`` met ``distributed`` half-imported by another thread and
    called its missing ``default_client``; labelling threads crashed with AttributeError."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(chunkernels.__file__)), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["errors"] == "[]"
    assert int(lines["calls"]) > 0  # the threads labelled while distributed was imported


def test_tune_gpu_workers_sets_the_switch_interval_of_every_worker_and_of_restarted_ones():
    with cluster.client(gpus=0, processes=True, n_workers=2, threads=1,
                        dashboard_address=None) as c:
        default = sys.getswitchinterval()
        assert set(c.run(sys.getswitchinterval).values()) == {default}  # CPU workers: untouched
        cluster.tune_gpu_workers(c)
        assert set(c.run(sys.getswitchinterval).values()) == {cluster.SWITCH_INTERVAL}
        c.restart()
        assert set(c.run(sys.getswitchinterval).values()) == {cluster.SWITCH_INTERVAL}
        assert sys.getswitchinterval() == default  # this process: untouched


@pytest.mark.parametrize("bad", [0, -1e-3, 2.0, True, "1ms", float("nan")])
def test_tune_gpu_workers_refuses_a_switch_interval_that_is_not_seconds(bad):
    with pytest.raises(ValueError, match=r"switch_interval=.*expected seconds, more than 0"):
        cluster.tune_gpu_workers(object(), bad)


@pytest.mark.gpu
def test_gpu_clusters_started_here_have_a_short_switch_interval():
    pytest.importorskip("dask_cuda")
    with cluster.client(gpus=1, dashboard_address=None) as c:
        assert set(c.run(sys.getswitchinterval).values()) == {cluster.SWITCH_INTERVAL}


def _numba_allocates_from_cupys_pool():
    """On a worker: the bytes CuPy's pool holds for a Numba array of 64 MiB, and after it."""
    import cupy
    from numba import cuda as numba_cuda

    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    a = numba_cuda.device_array(16 * 2**20, dtype="float32")
    during = pool.used_bytes() - before
    name = type(numba_cuda.current_context().memory_manager).__name__
    del a
    return during, pool.used_bytes() - before, name


@pytest.mark.gpu
def test_gpu_workers_numba_allocates_from_cupys_pool_and_a_block_reaches_a_worker():
    # without RMM, Dask moves CuPy blocks onto a worker's GPU through Numba: from CuPy's pool,
    # the memory that dask-cuda's spilling gives back to the pool serves them
    pytest.importorskip("dask_cuda")
    pytest.importorskip("numba")
    import cupy

    if importlib.util.find_spec("rmm") is not None:
        pytest.skip("with RMM, Dask and CuPy allocate through RMM")
    with cluster.client(gpus=1, dashboard_address=None) as c:
        (during, after, name), = c.run(_numba_allocates_from_cupys_pool).values()
        assert name == "CuPyPoolMemoryManager"
        assert during >= 64 * 2**20 and after == 0
        block = cupy.arange(1_000_000, dtype=cupy.float64)
        (future,) = c.scatter([block])  # deserialised on the worker, onto its GPU
        assert c.submit(lambda b: float(b.sum()), future).result() == float(block.sum())
