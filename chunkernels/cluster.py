"""A Dask client on the right cluster: one worker per GPU, CPU workers, or an existing scheduler.

>>> import chunkernels
>>> with chunkernels.cluster.client(gpus=0, dashboard_address=None) as c:  # doctest: +SKIP
...     z = chunkernels.apply(x, "moving_sum").compute()    # runs on c's workers

:func:`client` starts a :class:`dask_cuda.LocalCUDACluster` (one worker process per GPU, each
seeing its GPU as device 0) where CuPy sees GPUs, a :class:`distributed.LocalCluster` otherwise,
or connects to the scheduler of a running cluster (``dask scheduler`` plus ``dask cuda worker`` on
each GPU machine). The client it returns is the default Dask scheduler while it is open, and
closing it (or leaving its ``with`` block) also closes the cluster it started, never one it only
connected to. Nothing here imports distributed or dask_cuda until :func:`client` is called.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

from chunkernels import cuda
from chunkernels._imports import current_client

#: The install that brings dask-cuda and CuPy, named in errors.
CUDA_EXTRA = "pip install 'chunkernels[cuda12]'  (or [cuda13])"
#: The install that brings UCX (NVLink transfers between GPU workers) and RMM, named in errors.
UCX_EXTRA = "pip install 'chunkernels[ucx-cu12]'  (or [ucx-cu13]; from a clone: '.[ucx-cu12]')"
#: Protocols :func:`client` starts local clusters with.
PROTOCOLS = ("tcp", "ucx", "inproc")


def client(gpus: int | None = None, scheduler: str | None = None, *, threads: int | None = None,
           processes: bool | None = None, protocol: str | None = None, **cluster_kwargs: Any):
    """A ``distributed.Client`` on a local GPU or CPU cluster, or on an existing scheduler.

    Parameters
    ----------
    gpus
        GPUs to use, one worker process each. ``None``: every GPU CuPy sees, or a CPU cluster
        where it sees none. ``0``: a CPU cluster even where there are GPUs. ``N``: the first
        ``N`` visible GPUs (the first ``N`` entries of ``CUDA_VISIBLE_DEVICES`` when it is set).
    scheduler
        Address of a running scheduler (``"tcp://10.0.0.5:8786"``): connect to it instead of
        starting a cluster. The cluster's workers are its own; no other argument applies.
    threads
        Threads per worker. GPU workers default to one (dask-cuda's default: one task at a time
        per GPU); a CPU cluster defaults to Dask's choice.
    processes
        CPU cluster only: worker processes (``True``) or one worker of threads in this process
        (``False``, the default). GPU workers are always processes, one per GPU.
    protocol
        How workers send each other data: ``"tcp"`` (Dask's default) or ``"ucx"``, which moves
        CuPy blocks between GPUs over NVLink (``cuda_ipc``) where the GPUs have it: measured on
        two H200s joined by NVLink, a 64 MiB block took 13 ms between workers against 56 ms over
        TCP, and 512 MiB 15 ms against 357 ms (docs/gpus.md). UCX needs the ``ucx-cu12`` /
        ``ucx-cu13`` extra (UCX, UCXX and RMM) and GPU workers (``ucx`` on a CPU cluster is
        refused); ``None``: TCP. A running cluster (``scheduler=``) has its own.
    **cluster_kwargs
        Passed to ``LocalCUDACluster`` / ``LocalCluster`` (``device_memory_limit``,
        ``rmm_pool_size``, ``n_workers``, ``dashboard_address``, ...); they override the
        defaults described in the Notes.

    Returns
    -------
    distributed.Client
        Usable as a context manager; closing it closes the cluster it started.

    Raises
    ------
    ValueError
        ``gpus`` is negative or more than the GPUs present, arguments for a local cluster are
        given with ``scheduler``, or ``processes=False`` is asked of GPU workers.
    ImportError
        GPUs are asked for but dask-cuda is not installed, or UCX is asked for but its extra
        is not installed.

    Notes
    -----
    GPU workers keep dask-cuda's defaults for device memory: task results spill to host memory
    once the device holds ``device_memory_limit`` of them (pass ``device_memory_limit=0`` to turn
    spilling off, or a size such as ``"40GB"``). Where RMM is installed, each worker allocates
    through RMM's asynchronous pool (``rmm_async=True``) and CuPy allocates from it
    (``rmm_allocator_external_lib_list=["cupy"]``), so memory freed by one task is reused by the
    next without a ``cudaMalloc`` and is returned to the device under pressure; without RMM,
    CuPy's own memory pool does the same within each worker.
    """
    from distributed import Client

    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; expected one of {PROTOCOLS} (or None: tcp)")
    if scheduler is not None:
        given = {"gpus": gpus, "threads": threads, "processes": processes, "protocol": protocol,
                 **cluster_kwargs}
        given = sorted(k for k, v in given.items() if v is not None)
        if given:
            raise ValueError(
                f"scheduler={scheduler!r} connects to a running cluster, whose workers are already "
                f"set up; {', '.join(given)} only describe(s) a local cluster. Pass either "
                f"scheduler or the local-cluster arguments"
            )
        return Client(scheduler)
    devices = _devices(gpus)
    if protocol == "ucx":
        if not devices:
            raise ValueError("protocol='ucx' moves GPU blocks between GPU workers; this is a CPU "
                             "cluster (no GPU asked for or visible). Use protocol='tcp', or GPUs")
        if importlib.util.find_spec("distributed_ucxx") is None or (
                importlib.util.find_spec("rmm") is None):
            raise ImportError(f"protocol='ucx' needs UCX for Dask (distributed-ucxx) and RMM, "
                              f"which are not installed: {UCX_EXTRA}; or use protocol='tcp'")
    if protocol is not None:
        cluster_kwargs = {"protocol": protocol, **cluster_kwargs}
    if devices:
        cluster = _cuda_cluster(devices, threads, processes, cluster_kwargs)
    else:
        cluster = _cpu_cluster(threads, processes, cluster_kwargs)
    try:
        c = _owning_client_class()(cluster)
    except BaseException:
        cluster.close()
        raise
    try:
        if devices:
            tune_gpu_workers(c)
        else:
            from chunkernels._worker_plugin import CPUWorkers

            c.register_plugin(CPUWorkers())
    except BaseException:
        c.close()
        raise
    return c


#: Seconds a GPU worker's task thread runs Python before its event loop gets a turn, in the
#: clusters :func:`client` starts (:func:`tune_gpu_workers`). Python's default is 5 ms.
SWITCH_INTERVAL = 0.0005


def tune_gpu_workers(c, switch_interval: float = SWITCH_INTERVAL) -> None:
    """Set up the GPU workers of client ``c``'s cluster for short tasks that only queue launches.

    A worker's event loop (its messages with the scheduler, the data other workers fetch from
    it or send it, heartbeats) shares the GIL with the thread running its tasks. While a task
    runs Python, between launches, the loop waits for the thread to give up the GIL, which
    Python asks of it every 5 ms: each step of a transfer that a neighbouring worker asks for
    can wait that long. Here each worker's thread switch interval becomes ``switch_interval``
    (:func:`sys.setswitchinterval`), for every worker of the cluster and any that joins or
    restarts later (a worker plugin). On four H100 workers (TCP), in back-to-back runs of the
    same code (medians of 5), the 16 GiB Gaussian of ``chunkernels bench scaling`` went from 89
    to 79 ms, and the label of its ``x < 0.4`` from 128 to 116 ms; runs of one host move by up
    to a tenth between calls.

    Where CuPy allocates from its own memory pool (no RMM), it also has Numba allocate from that
    pool (:func:`chunkernels._worker_plugin.share_cupy_pool_with_numba`): Dask moves CuPy blocks
    onto a GPU through Numba (received from another worker, or read back after dask-cuda
    spilled them to host memory), and outside the pool those allocations fail while the pool
    keeps the memory that spilling freed.

    :func:`client` does this for the GPU clusters it starts; call it once for a cluster started
    otherwise (``dask cuda worker``, ``client(scheduler=...)``). CPU workers keep Python's
    default: their tasks compute, and a shorter interval only makes their threads trade the
    GIL more often.
    """
    import numbers

    from chunkernels._worker_plugin import NumbaOnCuPyPool, SwitchInterval

    if isinstance(switch_interval, bool) or not isinstance(switch_interval, numbers.Real) or \
            not 0 < switch_interval <= 1:
        raise ValueError(f"switch_interval={switch_interval!r}; expected seconds, more than 0 "
                         f"and at most 1 (Python's default is 0.005)")
    c.register_plugin(SwitchInterval(float(switch_interval)))
    c.register_plugin(NumbaOnCuPyPool())


#: ``current()``: the ``distributed.Client`` Dask would compute on now, or ``None``, found
#: without importing distributed (:func:`chunkernels._imports.current_client`, which the graph
#: module asks too: it sits below both).
current = current_client


def distribute(x, client=None):
    """Dask array ``x`` persisted over the cluster's workers in contiguous, balanced tiles.

    Blocks go to the workers as tiles or slabs of neighbouring blocks (``chunkernels._graph.tiles``:
    the tiling with the least border between workers, or runs of blocks in C order where the
    block grid does not divide evenly), so that a halo crosses workers only at tile borders and
    every worker holds as many blocks as the others, give or take one. Each block is made on
    its worker (a lazy array's tasks run there); blocks already persisted on the cluster move
    there. Kernel tasks then run where their blocks live, and the halo exchange reads the
    neighbours on the same worker in place (:func:`chunkernels._graph.overlap`).

    Parameters
    ----------
    x : dask.array.Array
        The array (lazy, or persisted on this cluster).
    client : distributed.Client, optional
        The cluster's client; default, the current one (:func:`current`).

    Returns
    -------
    dask.array.Array
        ``x``'s values, chunks and meta, its blocks in the workers' memory (returned once they
        all are there).

    Raises
    ------
    ValueError
        No client is given or current, or the cluster has no worker.

    Examples
    --------
    >>> with chunkernels.cluster.client() as c:  # doctest: +SKIP
    ...     x = chunkernels.cluster.distribute(da.random.random((65536, 65536), chunks=8192))
    ...     chunkernels.cluster.blocks_per_worker(x)  # {'tcp://...': 32, 'tcp://...': 32}
    """
    from chunkernels import _graph

    client = client if client is not None else current()
    if client is None:
        raise ValueError("distribute() places blocks on a cluster's workers, but no Dask client "
                         "is current: start one with chunkernels.cluster.client() (or pass "
                         "client=)")
    workers = worker_addresses(client)
    if not workers:
        raise ValueError(f"the cluster of {client} has no worker to place blocks on; wait for "
                         f"its workers (client.wait_for_workers(n)) first")
    owner = _graph.tiles(x.numblocks, len(workers))
    by_worker: dict[str, list[tuple]] = {w: [] for w in workers}
    for index, tile in owner.items():
        by_worker[workers[tile]].append(index)
    return _graph.persist_blocks(x, by_worker, client)


def blocks_per_worker(x) -> dict[str, int]:
    """How many blocks of Dask array ``x`` each worker of the current cluster holds
    (``{address: count}``; every worker named, 0 where it holds none). ``{}`` when ``x``'s
    blocks are not all held on the cluster."""
    from chunkernels import _graph

    client = current()
    where = _graph.placement(x)
    if client is None or where is None:
        return {}
    counts = dict.fromkeys(worker_addresses(client), 0)
    for address in where.values():
        counts[address] = counts.get(address, 0) + 1
    return counts


def worker_addresses(c) -> list[str]:
    """The addresses of client ``c``'s workers, in the order of their names (a
    LocalCUDACluster names its workers by GPU), then addresses."""
    workers = c.scheduler_info(n_workers=-1)["workers"]
    return sorted(workers, key=lambda a: (str(workers[a].get("name", "")), a))


def worker_count(c) -> int:
    """Number of workers the client ``c``'s scheduler knows now."""
    return len(c.scheduler_info(n_workers=-1)["workers"])


def gpu_names(c) -> list[str]:
    """The GPU name of each of client ``c``'s workers that has one (in worker order); none for
    the workers of a CPU cluster that :func:`client` started, even on a host with GPUs."""
    return [name for _, name in sorted(c.run(_gpu_name).items()) if name]


def describe(c) -> str:
    """One line saying what ``c`` runs on: workers, and their GPUs where they have any."""
    n = worker_count(c)
    gpus = gpu_names(c)
    where = f"{len(gpus)} GPU(s): {', '.join(sorted(set(gpus)))}" if gpus else "CPU"
    return f"{n} worker(s) on {where}, scheduler {c.scheduler.address}"


def protocol(c) -> str:
    """How the processes of ``c``'s cluster talk: the scheme of its scheduler's address
    (``"tcp"``, ``"ucx"``, ``"inproc"`` for a cluster of threads in this process)."""
    return c.scheduler.address.split("://", 1)[0]


def _gpu_name(dask_worker=None) -> str:
    """Runs on a worker: the name of its GPU, or '' when it has none (or no CuPy), or when it is
    a worker of a CPU cluster that :func:`client` started (it may see the host's GPUs)."""
    from chunkernels._worker_plugin import CPUWorkers

    if dask_worker is not None and CPUWorkers.name in dask_worker.plugins:
        return ""
    if cuda.gpu_count() == 0:
        return ""
    cp = cuda.cupy()
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()


def _devices(gpus) -> list[str]:
    """CUDA device ids for the workers: ``[]`` means a CPU cluster."""
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise ValueError(f"gpus={gpus!r}; expected None (all GPUs, or CPU workers without one), "
                         f"0 (CPU workers) or a positive number of GPUs")
    if gpus == 0:
        return []
    present = cuda.gpu_count()
    if gpus is None:
        gpus = present
    elif gpus > present:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else ""
        found = f"{present} CUDA GPU(s) are visible here{where}" if present else (
            "no CUDA GPU is visible here (CuPy is missing or found no device)")
        raise ValueError(f"gpus={gpus} asks for more GPUs than there are: {found}. Ask for at "
                         f"most {present}, or gpus=0 for CPU workers")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else []
    return (ids or [str(i) for i in range(present)])[:gpus]


def _cuda_cluster(devices, threads, processes, kwargs):
    import dask

    if processes is False:
        raise ValueError("GPU workers are processes, one per GPU (each sees its GPU as device 0); "
                         "processes=False applies to CPU clusters only (gpus=0)")
    if importlib.util.find_spec("dask_cuda") is None:
        raise ImportError(f"a cluster of GPU workers needs dask-cuda, which is not installed: "
                          f"{CUDA_EXTRA}; or pass gpus=0 for CPU workers")
    from dask_cuda import LocalCUDACluster

    options: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": ",".join(devices),
                               "threads_per_worker": threads or 1}
    if importlib.util.find_spec("rmm") is not None:
        options.update(rmm_async=True, rmm_allocator_external_lib_list=["cupy"])
    if kwargs.get("protocol") == "ucx":
        # NVLink between the GPUs of a host (cuda_ipc), and TCP over UCX for the rest
        options.update(enable_nvlink=True, enable_tcp_over_ucx=True)
    options.update(kwargs)
    # No work stealing: blocks are placed on purpose (distribute) and a kernel task must run
    # where its block lives; stealing moved placed blocks and their tasks to idle GPUs, whole
    # blocks over the network (measured: 25 / 39 blocks of a 32 / 32 placement on two H100s).
    with dask.config.set({"distributed.scheduler.work-stealing": False, **_no_workers()}):
        return LocalCUDACluster(**options)


#: How long a task may wait for a worker it can run on, in the clusters :func:`client` starts
#: (where Dask's configuration sets none), before it fails with distributed's
#: ``NoValidWorkerError`` instead of waiting for ever. Placed blocks are made with loose worker
#: restrictions (:func:`distribute`); when every worker dies at once (a cluster of one), their
#: recomputation waits for the dead workers' addresses, which the restarted ones do not have
#: (distributed reschedules such tasks only onto the workers they name: dask/distributed#7346).
NO_WORKERS_TIMEOUT = "60s"


def _no_workers() -> dict:
    """The scheduler's ``no-workers-timeout``: :data:`NO_WORKERS_TIMEOUT` unless configured."""
    import dask

    key = "distributed.scheduler.no-workers-timeout"
    return {} if dask.config.get(key, None) is not None else {key: NO_WORKERS_TIMEOUT}


def _cpu_cluster(threads, processes, kwargs):
    import dask
    from distributed import LocalCluster

    options: dict[str, Any] = {"processes": bool(processes)}
    if threads is not None:
        options["threads_per_worker"] = threads
    if not processes:
        options["n_workers"] = 1  # one worker of threads: no process boundary to copy across
    options.update(kwargs)
    with dask.config.set(_no_workers()):
        return LocalCluster(**options)


@functools.cache
def _owning_client_class():
    """``distributed.Client`` that also closes the cluster it was given when it closes.

    Dask's ``Client(cluster)`` leaves the cluster running on ``close()`` (only a cluster the
    client started itself is closed with it); :func:`client` starts the cluster, so it must
    end with the client. Built on first use so that importing this module imports no distributed.
    """
    from distributed import Client

    class ClusterClient(Client):
        """A ``distributed.Client`` that owns its local cluster (from :func:`client`)."""

        def close(self, *args, **kwargs):
            try:
                return super().close(*args, **kwargs)
            finally:
                if self.cluster is not None and self.cluster.status.name not in ("closed",
                                                                                  "closing"):
                    self.cluster.close()

    return ClusterClient
