"""``chunkernels bench capacity``: an array larger than one GPU, filtered and labelled on several.

The multi-GPU issue's capacity case: a float32 array of about 40 GiB (104000², ``--size``) in
8192² chunks (``--chunks``), made on the workers and placed in tiles
(:func:`chunkernels.cluster.distribute`), filtered (``gaussian_filter``, σ=4, persisted) and then
labelled (``label`` of ``filtered > 0.5``, persisted; the input is released first, as the
label reads the filtered array only), on each cluster of the sweep
(``--gpus 1 2``). One H100 (80 GB) cannot hold the input and the output at once; there the run
either completes by spilling results to host memory (dask-cuda's ``device_memory_limit``, on by
default) or fails with :class:`~chunkernels.GPUOutOfMemoryError`, which names the fix; in no case
may it hang: every step waits at most ``--timeout`` seconds (default 600), then the run is
reported as not finished and its work cancelled.

Per cluster the report gives what happened (completed, the error's first line, or the timeout),
the time of each step, and for each step and worker the peak device memory above what the
worker held as the step began (its input; the blocks in use in CuPy's pool, where CuPy
allocates from it, not those it caches), split into that worker's own share of the step's
output (the bytes of the output blocks it holds) and the rest, the step's working memory, which
the issue bounds by four of the step's chunks (the filter's float32 chunks with their halo; the
label's chunks of labels, whose dtype is SciPy's, int64 from 2**31 elements on, twice the
filtered array's bytes). The worker with the most working memory is reported. Shares differ
between workers where edge blocks are smaller (tiles balance blocks, not bytes: at 160000² in
8192² chunks on four GPUs, one tile holds 25.0 GiB of full blocks and another 22.7 GiB), which
is why the bound is each worker's own share and not the array's bytes divided evenly. It also
gives the
host memory each worker holds after the filter (where results spilled). A step with a failed
block is reported by its error. The labels of every cluster that completed must agree (their
count and per-block checksums); the filter is checked against SciPy on windows across chunk
corners before anything is timed.
"""

from __future__ import annotations

import time

import numpy as np

from chunkernels import bench, cluster, ndimage
from chunkernels.bench import scaling
from chunkernels.kernels.label import default_dtype

NEEDS_GPU = False
CLUSTER = True

DEFAULT_SHAPE = (104000, 104000)
DEFAULT_CHUNKS = [(8192, 8192)]
THRESHOLD = 0.5
TIMEOUT = 600.0


def run(args) -> dict:
    shape = bench.array_shape(args, DEFAULT_SHAPE, scaling.DTYPE)
    (chunks,) = bench.chunk_shapes(args, shape, DEFAULT_CHUNKS, scaling.DTYPE)[:1]
    timeout = float(getattr(args, "timeout", None) or TIMEOUT)
    depth = scaling._halo(len(shape))
    unit = scaling._nbytes(tuple(c + 2 * d for c, d in zip(chunks, depth)))
    label_dtype = default_dtype(int(np.prod(shape, dtype=np.int64)))
    rows, clusters = [], []
    sweep = bench.sweep(args)
    with bench.Progress(len(sweep), "capacity") as progress:
        for kind, workers, client in bench.clusters(args):
            gpu = kind == "gpu"
            clusters.append({"kind": kind, "workers": workers,
                             "devices": cluster.gpu_names(client) if gpu else []})
            with progress.run(f"{workers} {kind} worker(s)"):
                rows.append({"kind": kind, "workers": workers,
                             **_attempt(client, gpu, shape, chunks, timeout, unit,
                                        label_dtype)})
    _agree(rows)
    report = {"benchmark": "capacity", "shape": list(shape), "chunks": list(chunks),
              "dtype": scaling.DTYPE.name, "nbytes": scaling._nbytes(shape), "sigma": scaling.SIGMA,
              "threshold": THRESHOLD, "chunk_halo_bytes": unit,
              "label_dtype": label_dtype.name, "timeout_s": timeout,
              "environment": bench.environment(), "clusters": clusters, "rows": rows}
    report["markdown"] = markdown(report)
    return report


def _attempt(client, gpu, shape, chunks, timeout, unit, label_dtype) -> dict:
    """Make, filter and label on this cluster; what happened, each step's time and memory."""
    from distributed import futures_of, wait

    out: dict = {"steps": {}, "memory": {}}
    pending: list = []  # what a timeout cancels
    step = "make"
    try:
        start = time.perf_counter()
        x = scaling._input(client, shape, chunks, gpu)
        out["steps"]["make"] = time.perf_counter() - start
        out["blocks_per_worker"] = sorted(cluster.blocks_per_worker(x).values())
        starts = client.run(scaling._memory_start, gpu)

        step = "filter"
        start = time.perf_counter()
        smooth = client.persist(ndimage.gaussian_filter(x, scaling.SIGMA))
        pending.append(smooth)
        wait(smooth, timeout=timeout)
        _raise_failed(smooth)
        client.run(scaling._synchronize)
        out["steps"]["filter"] = time.perf_counter() - start
        out["memory"]["filter"] = _step_memory(client, gpu, starts, smooth, unit)
        scaling._check("capacity", smooth, x, scaling.implementations(
            scaling.HALO_PIPELINE)[scaling.CHUNKERNELS][1], "array")
        out["host_bytes_after_filter"] = sorted(client.run(_host_bytes).values())
        # the label reads the filtered array only: its input goes, as a user's would (three
        # arrays of this size are 3/4 of four H100s' memory, and the label's merge did not fit
        # beside them)
        held = [f.key for f in futures_of(x)]
        del x
        _released(client, held)

        step = "label"
        starts = client.run(scaling._memory_start, gpu)
        start = time.perf_counter()
        labels, count = client.persist(list(ndimage.label(smooth > THRESHOLD)))
        pending += [labels, count]
        wait([labels, count], timeout=timeout)
        _raise_failed([labels, count])
        client.run(scaling._synchronize)
        out["steps"]["label"] = time.perf_counter() - start
        label_chunk = label_dtype.itemsize * int(np.prod(chunks, dtype=np.int64))
        out["memory"]["label"] = _step_memory(client, gpu, starts, labels, label_chunk)
        out["count"] = int(count.compute())
        sums = labels.map_blocks(scaling._block_checksum, dtype=np.int64, chunks=(1, 2),
                                 meta=np.empty((0, 0), np.int64))
        out["checksums"] = np.asarray(sums.compute()).tolist()
        out["outcome"] = "completed"
    except TimeoutError:
        client.cancel(futures_of(pending))
        out["outcome"] = f"{step}: did not finish in {timeout:.0f} s (cancelled)"
    except Exception as exc:  # GPUOutOfMemoryError (a MemoryError) or another, from a worker:
        # the row says which step failed and how, and the sweep goes on
        client.cancel(futures_of(pending))
        out["outcome"] = f"{step}: {type(exc).__name__}: {(str(exc) or '-').splitlines()[0]}"
    return out


def _raise_failed(collections) -> None:
    """Raise the error of the first task of ``collections`` that failed: ``distributed.wait``
    returns once every future is done, failed or not, and a step with a failed block did not
    complete (its time is not reported)."""
    from distributed import futures_of

    for future in futures_of(collections):
        if future.status == "error":
            future.result()


def _step_memory(client, gpu, starts, output, chunk: int) -> dict:
    """Per step: each worker's peak above what it held as the step began (``starts``), its
    share of the step's ``output`` (the bytes of the blocks it holds) and the rest, its working
    memory, against the bound of four of the step's chunks (``chunk`` bytes each); the worker
    with the most working memory (None where not measurable)."""
    ends = client.run(scaling._memory_end, gpu)
    shares = _output_shares(output)
    worst = None
    for worker, start in starts.items():
        end = ends.get(worker)
        if start is None or end is None:
            return {"peak_above_start": None, "limit": 4 * chunk, "chunk": chunk}
        peak = end[1] - start
        share = shares.get(worker, 0)
        row = {"worker": worker, "peak_above_start": peak, "share": share,
               "working": peak - share}
        if worst is None or row["working"] > worst["working"]:
            worst = row
    return {**(worst or {"peak_above_start": None}), "limit": 4 * chunk, "chunk": chunk}


def _output_shares(a) -> dict[str, int]:
    """The bytes of Dask array ``a``'s blocks each worker holds (persisted on the cluster)."""
    from chunkernels import _graph

    where = _graph.placement(a) or {}
    shares: dict[str, int] = {}
    for index, worker in where.items():
        size = int(np.prod([c[i] for c, i in zip(a.chunks, index)], dtype=np.int64))
        shares[worker] = shares.get(worker, 0) + size * a.dtype.itemsize
    return shares


def _released(client, keys, timeout: float = 30.0) -> None:
    """Wait until no worker holds ``keys`` (results whose last reference this process dropped:
    the client tells the scheduler a moment later)."""
    deadline = time.monotonic() + timeout
    while any(client.who_has(keys).values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def _host_bytes() -> int:
    """On a worker: its resident host memory (results spilled from the GPU land there)."""
    import psutil

    return psutil.Process().memory_info().rss


def _agree(rows) -> None:
    """Every cluster that completed computed the same labels."""
    done = [r for r in rows if r["outcome"] == "completed"]
    for r in done[1:]:
        assert (r["count"], r["checksums"]) == (done[0]["count"], done[0]["checksums"]), (
            f"the labels on {r['workers']} workers differ from those on {done[0]['workers']}")


def markdown(r) -> str:
    from dask.utils import format_bytes

    devices = sorted({d for c in r["clusters"] for d in c["devices"]}) or ["CPU workers"]
    shape = "×".join(map(str, r["shape"]))
    env = r["environment"]
    lines = [f"### capacity: {shape} {r['dtype']} ({format_bytes(r['nbytes'])}) in "
             f"{'×'.join(map(str, r['chunks']))} chunks on {', '.join(devices)} "
             f"({env['date'][:10]})", "",
             f"Made on the workers and placed in tiles, `gaussian_filter` σ={r['sigma']:g} "
             f"persisted, then `label(filtered > {r['threshold']:g})` persisted; each step "
             f"waits at most {r['timeout_s']:.0f} s. Memory, per step: the peak device "
             f"memory of a worker above what it held as the step began (its input; the blocks "
             f"in use in CuPy's pool) = its share of the step's output (the blocks it holds) + "
             f"the rest, the step's working memory, in the step's chunks (the filter's with "
             f"their halo, {format_bytes(r['chunk_halo_bytes'])} each; the label's of "
             f"{r.get('label_dtype', 'int64')} labels), against the bound of 4; the worker "
             f"with the most working memory.", "",
             "| workers | outcome | blocks per worker | make (s) | filter (s) | label (s) | labels "
             "| filter: peak = share + working | label: peak = share + working "
             "| host memory after the filter |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in r["rows"]:
        steps = row["steps"]
        lines.append(
            f"| {scaling._where(row)} | {row['outcome']} | "
            f"{' / '.join(map(str, row.get('blocks_per_worker', [])))} | "
            + " | ".join(f"{steps[s]:.2f}" if s in steps else "-"
                         for s in ("make", "filter", "label"))
            + f" | {row.get('count', '-')} | "
            + " | ".join(_peak_cell(row.get("memory", {}).get(s)) for s in ("filter", "label"))
            + f" | {', '.join(map(format_bytes, row.get('host_bytes_after_filter', []))) or '-'} |")
    return "\n".join(lines)  # the versions line follows (bench.write_report)


def _peak_cell(memory) -> str:
    """``peak = share + working (chunks)`` of one step (``-`` where not measured), marked where
    the working memory is over its bound of four chunks."""
    from dask.utils import format_bytes

    if not memory or memory.get("peak_above_start") is None:
        return "-"
    over = "" if memory["working"] <= memory["limit"] else " (over 4)"
    return (f"{format_bytes(memory['peak_above_start'])} = {format_bytes(memory['share'])} + "
            f"{format_bytes(max(0, memory['working']))} "
            f"({max(0, memory['working']) / memory['chunk']:.1f} chunks){over}")
