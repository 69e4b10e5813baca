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
the time of each step, the peak device memory of each worker above what it held before
(CuPy's pool, where CuPy allocates from it) next to its share of the input and output plus four
chunks with their halo (the bound the issue sets), and the host memory each worker holds after
the filter (where results spilled). The labels of every cluster that completed must agree (their
count and per-block checksums); the filter is checked against SciPy on windows across chunk
corners before anything is timed.
"""

from __future__ import annotations

import time

import numpy as np

from chunkernels import bench, cluster, ndimage
from chunkernels.bench import scaling

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
    rows, clusters = [], []
    sweep = bench.sweep(args)
    with bench.Progress(len(sweep), "capacity") as progress:
        for kind, workers, client in bench.clusters(args):
            gpu = kind == "gpu"
            clusters.append({"kind": kind, "workers": workers,
                             "devices": cluster.gpu_names(client) if gpu else []})
            with progress.run(f"{workers} {kind} worker(s)"):
                rows.append({"kind": kind, "workers": workers,
                             **_attempt(client, gpu, shape, chunks, timeout, unit)})
    _agree(rows)
    report = {"benchmark": "capacity", "shape": list(shape), "chunks": list(chunks),
              "dtype": scaling.DTYPE.name, "nbytes": scaling._nbytes(shape), "sigma": scaling.SIGMA,
              "threshold": THRESHOLD, "chunk_halo_bytes": unit, "timeout_s": timeout,
              "environment": bench.environment(), "clusters": clusters, "rows": rows}
    report["markdown"] = markdown(report)
    return report


def _attempt(client, gpu, shape, chunks, timeout, unit) -> dict:
    """Make, filter and label on this cluster; what happened, each step's time and memory."""
    from distributed import futures_of, wait

    out: dict = {"steps": {}}
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
        client.run(scaling._synchronize)
        out["steps"]["filter"] = time.perf_counter() - start
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
        start = time.perf_counter()
        labels, count = client.persist(list(ndimage.label(smooth > THRESHOLD)))
        pending += [labels, count]
        wait([labels, count], timeout=timeout)
        client.run(scaling._synchronize)
        out["steps"]["label"] = time.perf_counter() - start
        out["count"] = int(count.compute())
        sums = labels.map_blocks(scaling._block_checksum, dtype=np.int64, chunks=(1, 2),
                                 meta=np.empty((0, 0), np.int64))
        out["checksums"] = np.asarray(sums.compute()).tolist()
        memory = scaling._memory(starts, client.run(scaling._memory_end, gpu))
        out["peak_above_start"] = None if memory is None else memory["peak_above_start"]
        share = 2 * scaling._nbytes(shape) / max(1, len(out["blocks_per_worker"]))
        out["bound"] = share + 4 * unit  # its share of input and output, plus 4 chunks + halo
        out["outcome"] = "completed"
    except TimeoutError:
        client.cancel(futures_of(pending))
        out["outcome"] = f"{step}: did not finish in {timeout:.0f} s (cancelled)"
    except Exception as exc:  # GPUOutOfMemoryError (a MemoryError) or another, from a worker:
        # the row says which step failed and how, and the sweep goes on
        client.cancel(futures_of(pending))
        out["outcome"] = f"{step}: {type(exc).__name__}: {(str(exc) or '-').splitlines()[0]}"
    return out


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
             f"waits at most {r['timeout_s']:.0f} s. Peak: device memory of the busiest worker "
             f"above what it held before (CuPy's pool); bound: its share of input and output "
             f"plus 4 chunks with their halo ({format_bytes(r['chunk_halo_bytes'])} each).", "",
             "| workers | outcome | blocks per worker | make (s) | filter (s) | label (s) | labels "
             "| peak | bound | host memory after the filter |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in r["rows"]:
        steps = row["steps"]
        peak = row.get("peak_above_start")
        lines.append(
            f"| {scaling._where(row)} | {row['outcome']} | "
            f"{' / '.join(map(str, row.get('blocks_per_worker', [])))} | "
            + " | ".join(f"{steps[s]:.2f}" if s in steps else "-"
                         for s in ("make", "filter", "label"))
            + f" | {row.get('count', '-')} | {'-' if peak is None else format_bytes(peak)} | "
            f"{format_bytes(row['bound']) if 'bound' in row else '-'} | "
            f"{', '.join(map(format_bytes, row.get('host_bytes_after_filter', []))) or '-'} |")
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    lines += ["", f"Versions: {versions}."]
    return "\n".join(lines)
