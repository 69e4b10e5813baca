"""``chunkernels bench launch``: what a kernel launch costs the host, and what a launch that holds
the GIL costs a Dask worker, for choosing :data:`chunkernels.cuda.LAUNCH_HOLDS_GIL`'s default.

Host time per launch, on this process's GPU: a small kernel (``y = a * x + b`` on 256 elements)
launched :data:`LAUNCHES` times in a row, the clock stopped before the device is synchronised,
by chunkernels' driver launch holding the GIL (``LAUNCH_HOLDS_GIL = True``, through
``ctypes.PyDLL``), the same releasing it (``False``, ``ctypes.CDLL``) and CuPy's own
``RawKernel`` launch (which releases it); from one thread, and from :data:`THREADS` threads at
once, each launching as many into its own arrays, all on the null stream as under Dask's threaded
scheduler. Medians of ``--repeat`` rounds after warm-up; every way's results are compared with
NumPy's first.

A worker's event loop, on a ``LocalCUDACluster`` of one worker: a task launches :data:`FLOOD`
kernels of :data:`SPIN_US` µs each, several times what the device's launch queue holds, so that
most launches wait in ``cuLaunchKernel`` for room; meanwhile the client times round trips of
``client.run`` (a no-op the worker's event loop runs: what its heartbeats and data transfers
wait for), with the task's launches holding the GIL, releasing it, and as ``"auto"`` (the
default) decides there. Each flood's kernels count themselves; the count is checked first.
"""

from __future__ import annotations

import statistics
import threading
import time
from unittest import mock

import numpy as np

from chunkernels import cuda
from chunkernels.bench import device_info

#: Launches per thread and round in the host-time runs: well inside the device's launch queue
#: (about a thousand), so that no launch waits for the device.
LAUNCHES = 100
#: Threads launching at once in the multi-threaded runs.
THREADS = 8
#: Kernels one flood task launches, and how long each spins on the device: a flood queues
#: FLOOD * SPIN_US of work (0.4 s), most of it behind a full launch queue.
FLOOD = 4000
SPIN_US = 100
#: Floods per GIL setting (the round-trip statistics pool their samples).
FLOODS = 3

_SOURCE = r"""
extern "C" __global__ void axpb(const float* x, float* y, float a, float b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

__device__ __forceinline__ unsigned long long globaltimer_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void spin(long long ns, unsigned int* count)
{
    const unsigned long long start = globaltimer_ns();
    while (globaltimer_ns() - start < (unsigned long long)ns) { }
    if (threadIdx.x == 0) atomicAdd(count, 1u);
}
"""
_N = 256

#: The ways of launching the host-time runs: the GIL setting of chunkernels' launch, or None for
#: CuPy's RawKernel.
WAYS = {"chunkernels, GIL held (ctypes.PyDLL)": True,
        "chunkernels, GIL released (ctypes.CDLL)": False,
        "CuPy RawKernel": None}
#: The worker's GIL settings in the event-loop runs.
SETTINGS = {"held (1)": True, "released (0)": False, "auto (the default)": "auto"}


def run(args) -> dict:
    """Host µs per launch by way and thread count; then a worker's event loop under floods."""
    info = device_info()
    repeat = max(3, args.repeat)
    host = _host_times(repeat)
    loop = _event_loop()
    report = {**info, "launches_per_round": LAUNCHES, "threads": THREADS, "host": host,
              "flood": {"launches": FLOOD, "spin_us": SPIN_US, "floods": FLOODS}, "loop": loop}
    report["markdown"] = _markdown(report)
    return report


# -- host time per launch --------------------------------------------------------------------------


def _kernels(cp) -> dict:
    """This device's compiled kernels of :data:`_SOURCE`, as chunkernels and CuPy launch them."""
    device = cp.cuda.runtime.getDevice()
    found = _COMPILED.get(device)
    if found is None:
        raws = {name: cp.RawKernel(_SOURCE, name, options=cuda.COMPILE_OPTIONS)
                for name in ("axpb", "spin")}
        found = _COMPILED[device] = {name: (cuda.Kernel(raw, name), raw)
                                     for name, raw in raws.items()}
    return found


_COMPILED: dict[int, dict] = {}


def _launcher(cp, way):
    """``launch(x, y, a, b)`` the way ``way`` says (a :data:`WAYS` value)."""
    kernel, raw = _kernels(cp)["axpb"]
    n = np.int32(_N)
    call = raw if way is None else kernel
    return lambda x, y, a, b: call((1,), (_N,), (x, y, a, b, n))


def _host_times(repeat: int) -> list[dict]:
    cp = cuda.cupy()
    sync = cp.cuda.Device().synchronize
    x = cp.arange(_N, dtype=cp.float32)
    a, b = np.float32(2.0), np.float32(-1.0)
    want = (2 * np.arange(_N, dtype=np.float32) - 1).astype(np.float32)
    rows = []
    for label, way in WAYS.items():
        setting = cuda.LAUNCH_HOLDS_GIL if way is None else way
        with mock.patch.object(cuda, "LAUNCH_HOLDS_GIL", setting):
            launch = _launcher(cp, way)
            ys = [cp.zeros(_N, dtype=cp.float32) for _ in range(THREADS)]
            for y in ys:  # the check, which is also the warm-up of each thread's buffers
                launch(x, y, a, b)
            got = cp.stack(ys).get()
            if not (got == want).all():
                raise AssertionError(f"{label}: y = a * x + b differs from NumPy's; not timing it")
            for threads in (1, THREADS):
                rounds = _rounds(launch, x, ys[:threads], a, b, repeat, sync)
                per_launch = statistics.median(rounds) / (threads * LAUNCHES)
                rows.append({"way": label, "threads": threads, "us_per_launch": per_launch * 1e6,
                             "round_ms": statistics.median(rounds) * 1e3})
    cupy_us = {r["threads"]: r["us_per_launch"] for r in rows if WAYS[r["way"]] is None}
    for r in rows:
        r["of_cupy"] = r["us_per_launch"] / cupy_us[r["threads"]]
    return rows


def _rounds(launch, x, ys, a, b, repeat, sync) -> list[float]:
    """Seconds per round (after one warm-up round): each of ``len(ys)`` threads launches
    :data:`LAUNCHES` times into its own ``y``; the clock runs from the threads' start to the
    last one's end, the device idle at the start."""
    threads = len(ys)
    start, end = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
    stop = threading.Event()
    errors = []

    def work(y):
        try:
            while True:
                start.wait()
                if stop.is_set():
                    return
                for _ in range(LAUNCHES):
                    launch(x, y, a, b)
                end.wait()
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread
            errors.append(exc)
            start.abort()
            end.abort()

    pool = [threading.Thread(target=work, args=(y,), daemon=True) for y in ys]
    for t in pool:
        t.start()
    times = []
    try:
        for i in range(repeat + 1):
            sync()
            start.wait()
            t0 = time.perf_counter()
            end.wait()
            if i:
                times.append(time.perf_counter() - t0)
        stop.set()
        start.wait()
    except threading.BrokenBarrierError:
        raise errors[0] if errors else RuntimeError("a launching thread stopped") from None
    for t in pool:
        t.join()
    sync()
    return times


# -- a worker's event loop under a full launch queue -----------------------------------------------


def _flood(launches: int, spin_us: float, setting) -> dict:
    """On a worker: ``launches`` spin kernels with ``LAUNCH_HOLDS_GIL = setting``; how long
    the launches took, the whole flood took, and whether they held the GIL."""
    cp = cuda.cupy()
    kernel, _ = _kernels(cp)["spin"]
    ns = np.int64(spin_us * 1000)
    count = cp.zeros(1, dtype=cp.uint32)
    sync = cp.cuda.Device().synchronize
    with mock.patch.object(cuda, "LAUNCH_HOLDS_GIL", setting):
        sync()
        t0 = time.perf_counter()
        for _ in range(launches):
            kernel((1,), (32,), (ns, count))
        launched = time.perf_counter() - t0
        sync()
        total = time.perf_counter() - t0
        holds = cuda.launch_holds_gil()
    return {"count": int(count.get()[0]), "launch_s": launched, "total_s": total,
            "holds_gil": holds, "launch_counts": cuda.launch_counts()}


def _noop() -> None:
    return None


def _round_trips(client, worker, future) -> list[float]:
    """``client.run`` round trips to ``worker`` until ``future`` is done (seconds)."""
    times = []
    while not future.done():
        t0 = time.perf_counter()
        client.run(_noop, workers=[worker])
        times.append(time.perf_counter() - t0)
        time.sleep(0.002)
    return times


def _event_loop() -> dict:
    from chunkernels import cluster

    with cluster.client(1, dashboard_address=None) as client:
        (worker,) = client.scheduler_info()["workers"]
        client.submit(_flood, 10, 1.0, "auto", pure=False).result()  # compile, warm up
        idle = []
        for _ in range(50):
            t0 = time.perf_counter()
            client.run(_noop, workers=[worker])
            idle.append(time.perf_counter() - t0)
        rows = []
        for label, setting in SETTINGS.items():
            samples, floods = [], []
            for _ in range(FLOODS):
                future = client.submit(_flood, FLOOD, SPIN_US, setting, pure=False)
                samples += _round_trips(client, worker, future)
                result = future.result()
                if result["count"] != FLOOD:
                    raise AssertionError(f"GIL {label}: {result['count']} of {FLOOD} kernels "
                                         f"ran; not timing it")
                floods.append(result)
            rows.append({"setting": label, "holds_gil": floods[0]["holds_gil"],
                         "samples": len(samples), **_spread(samples),
                         "launch_s": statistics.median(f["launch_s"] for f in floods),
                         "total_s": statistics.median(f["total_s"] for f in floods),
                         "worker_launch_counts": floods[-1]["launch_counts"]})
    return {"idle": _spread(idle), "rows": rows}


def _spread(seconds: list[float]) -> dict:
    """Median, 90th percentile and largest of ``seconds``, in milliseconds."""
    if not seconds:
        return {"median_ms": float("nan"), "p90_ms": float("nan"), "max_ms": float("nan")}
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p90_ms": p90 * 1e3,
            "max_ms": ordered[-1] * 1e3}


def _markdown(r) -> str:
    lines = [f"### launch on {r['device']} ({r['date']}, CuPy {r['cupy']})", "",
             f"Host time per launch of a 256-element kernel: {r['launches_per_round']} launches "
             f"per thread and round, the clock stopped before the device is synchronised, "
             f"median of rounds; {r['threads']} threads launch at once, each into its own "
             f"arrays, on the null stream. Every way's result was checked against NumPy first.",
             "", "| launch | threads | µs per launch | of CuPy's |", "|---|---:|---:|---:|"]
    for h in r["host"]:
        lines.append(f"| {h['way']} | {h['threads']} | {h['us_per_launch']:.2f} | "
                     f"{h['of_cupy']:.2f}× |")
    f, loop = r["flood"], r["loop"]
    idle = loop["idle"]
    lines += ["", f"A worker's event loop (a LocalCUDACluster of one worker): a task launches "
              f"{f['launches']} kernels of {f['spin_us']} µs each, most of them waiting for room "
              f"in the launch queue, {f['floods']} times per setting; meanwhile the client times "
              f"`client.run` round trips of a no-op (idle worker: median {idle['median_ms']:.2f} "
              f"ms, largest {idle['max_ms']:.2f} ms). \"auto\" is the library's default.", "",
              "| worker's launches | hold the GIL | round trips | median (ms) | 90% (ms) | "
              "largest (ms) | launching (s) | flood (s) |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in loop["rows"]:
        lines.append(f"| {row['setting']} | {'yes' if row['holds_gil'] else 'no'} | "
                     f"{row['samples']} | {row['median_ms']:.2f} | {row['p90_ms']:.2f} | "
                     f"{row['max_ms']:.2f} | {row['launch_s']:.3f} | {row['total_s']:.3f} |")
    return "\n".join(lines)
