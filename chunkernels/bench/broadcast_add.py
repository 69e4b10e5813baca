"""``chunkernels bench broadcast_add``: the seed problem, whole array and chunked, on one GPU.

Whole array: ``x + y`` (1 GiB float32 plus a row vector) against a device copy of the same bytes,
CuPy's own add and the seed blog post's kernel. Chunked: ``apply`` over a Dask array of CuPy
chunks (16 GiB, chunk sizes ``--chunks-mib``) against one launch on the whole array.
"""

from __future__ import annotations

import numpy as np

from chunkernels import cuda
from chunkernels.bench import (GiB, MiB, dask_alone, device_info, gpu_median, launches_holding_gil,
                               wall_median)

# The seed blog post's kernel (one thread per element, y indexed with a modulo), kept as the
# baseline the library must beat.
_SEED_KERNEL = r"""
extern "C" __global__ void seed_add_broadcast(const float* x, const float* y, float* z,
                                               const int rows, const int cols, const int row_stride) {
    int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < rows * cols) {
        int r = tid / cols, c = tid % cols;
        z[tid] = x[r * row_stride + c] + y[c];
    }
}
"""


#: Ready tasks Dask's local scheduler hands a worker thread at once in the "chunksize" runs
#: (``dask.persist(..., chunksize=)``; its default is 1, one thread handoff per task).
SCHEDULER_CHUNKSIZE = 16


def run(args) -> dict:
    """broadcast_add whole-array against device copy, CuPy and the seed kernel; then chunked."""
    import dask
    import dask.array as da

    import chunkernels
    from chunkernels.kernels import broadcast_add

    cp = cuda.cupy()
    info = device_info()
    cols = 4096
    rows = int(args.size_gib * GiB) // (4 * cols)
    x = cp.random.random((rows, cols), dtype=cp.float32)
    y = cp.random.random(cols, dtype=cp.float32)
    nbytes = x.nbytes
    expected = x + y

    seed = cp.RawKernel(_SEED_KERNEL, "seed_add_broadcast")

    def seed_add():
        z = cp.empty_like(x)
        seed(((x.size + 255) // 256,), (256,), (x, y, z, np.int32(rows), np.int32(cols),
                                               np.int32(x.strides[0] // 4)))
        return z

    dst = cp.empty_like(x)
    stream = cp.cuda.get_current_stream()

    def device_copy():
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, x.data.ptr, nbytes,
                                    cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        return dst

    impls = {
        "device copy (cudaMemcpy D2D)": (device_copy, x),
        "CuPy x + y": (lambda: x + y, expected),
        "seed RawKernel (blog post)": (seed_add, expected),
        "chunkernels broadcast_add (GPU dispatch)": (lambda: broadcast_add.dispatch(x, y), expected),
        "chunkernels.apply, whole array": (lambda: chunkernels.apply(x, "broadcast_add", y), expected),
    }
    whole = []
    for label, (fn, want) in impls.items():
        if not bool(cp.array_equal(fn(), want)):
            raise AssertionError(f"{label} gave a wrong result; not timing it")
        t = gpu_median(fn, args.repeat)
        whole.append({"impl": label, "seconds": t, "TB/s": 2 * nbytes / t / 1e12})
    copy_bw = whole[0]["TB/s"]
    for row in whole:
        row["of copy"] = row["TB/s"] / copy_bw
    del dst, expected, x
    cp.get_default_memory_pool().free_all_blocks()

    # Chunked: the same kernel through Dask (threaded scheduler, one GPU) against one launch on
    # the whole array, timed the same way (wall clock, ending with a device synchronisation). The
    # chunks are in device memory before the clock starts, as after any earlier step of a
    # pipeline; "from_array" repeats the run with x still a from_array graph, whose slicing tasks
    # Dask fuses into every kernel task.
    trows = int(args.total_gib * GiB) // (4 * cols)
    big = cp.random.random((trows, cols), dtype=cp.float32)
    sync = cp.cuda.Device().synchronize

    def monolithic():
        z = chunkernels.apply(big, "broadcast_add", y)
        sync()
        return z

    # checked in slices: a whole-array reference would need another full copy of device memory
    z, step = monolithic(), max(1, trows // 16)
    if not all(bool(cp.array_equal(z[i:i + step], big[i:i + step] + y)) for i in range(0, trows, step)):
        raise AssertionError("chunkernels.apply on the whole chunked-run array is wrong")
    del z
    t_mono = wall_median(monolithic, args.repeat)
    chunked = []
    dy = da.from_array(y, chunks=cols, asarray=False, name=False).persist()
    repeat = max(5, args.repeat // 2)
    for mib in args.chunks_mib:
        crows = max(1, mib * MiB // (4 * cols))
        lazy_x = da.from_array(big, chunks=(crows, cols), asarray=False, name=False)
        dx = lazy_x.persist()

        def run_chunked(op, hold_gil=True, **kw):
            with launches_holding_gil(hold_gil):
                (z,) = dask.persist(op(), **{"scheduler": "threads", **kw})
                sync()
            return z

        def apply_persisted():
            return chunkernels.apply(dx, "broadcast_add", dy)

        batched = {"chunksize": SCHEDULER_CHUNKSIZE}
        runs = {
            "chunkernels": (apply_persisted, {}),
            "chunkernels, 1 thread": (apply_persisted, {"num_workers": 1}),
            "chunkernels, chunksize": (apply_persisted, batched),
            "chunkernels, 1 thread, chunksize": (apply_persisted, {"num_workers": 1, **batched}),
            "chunkernels, synchronous": (apply_persisted, {"scheduler": "sync"}),
            "chunkernels, CuPy's launches": (apply_persisted, {"hold_gil": False}),
            "chunkernels, from_array": (lambda: chunkernels.apply(lazy_x, "broadcast_add", dy), {}),
            "plain dask": (lambda: dx + dy, {}),
        }
        row = {"chunk MiB": mib, "chunks": dx.npartitions}
        for label, (op, kw) in runs.items():
            z = run_chunked(op, **kw)
            if not bool((z == dx + dy).all().compute(scheduler="threads")):
                raise AssertionError(f"{label} with {mib} MiB chunks gave a wrong result")
            del z
            t = wall_median(lambda: run_chunked(op, **kw), repeat)
            row[label] = {"seconds": t, "of monolithic": t_mono / t}
        # Dask's own share of the threaded run: the same graph, every task a no-op
        row["dask alone"] = wall_median(dask_alone(apply_persisted(), scheduler="threads"), repeat)
        chunked.append(row)
        del dx, lazy_x
        cp.get_default_memory_pool().free_all_blocks()
    report = {**info, "kernel": "broadcast_add", "shape": [rows, cols], "dtype": "float32",
              "whole": whole, "chunked_total_gib": args.total_gib, "monolithic_s": t_mono,
              "chunked": chunked}
    report["markdown"] = _markdown_broadcast_add(report)
    return report


def _markdown_broadcast_add(r) -> str:
    lines = [f"### broadcast_add on {r['device']} ({r['date']}, CuPy {r['cupy']})", "",
             f"Whole array: {r['shape'][0]}×{r['shape'][1]} float32 (1 GiB) plus a row vector; "
             "bytes moved = read x + write z. Median of CUDA-event timings.", "",
             "| implementation | time (ms) | TB/s | of device copy |", "|---|---:|---:|---:|"]
    for w in r["whole"]:
        lines.append(f"| {w['impl']} | {w['seconds'] * 1e3:.3f} | {w['TB/s']:.2f} | {w['of copy']:.0%} |")
    lines += ["", f"Chunked: {r['chunked_total_gib']:g} GiB float32, one GPU, Dask's threaded "
              "scheduler unless the column says otherwise; "
              f"wall clock from building the graph to a synchronised device (persist), against one "
              f"`apply` on the whole array ({r['monolithic_s'] * 1e3:.2f} ms, same clock). Chunks "
              "are in device memory when the clock starts, except in the from_array column. "
              f"\"chunksize\": Dask's local scheduler hands each worker thread "
              f"{SCHEDULER_CHUNKSIZE} ready tasks at a time (`chunksize={SCHEDULER_CHUNKSIZE}`) "
              "instead of one; \"synchronous\": Dask's synchronous scheduler (`scheduler=\"sync\"`), "
              "one host thread launching every chunk; \"CuPy's launches\": the kernels launched "
              "through CuPy, which releases the GIL around each launch (chunkernels holds it); "
              "\"Dask alone\": the threaded run's graph "
              "with every task replaced by a no-op (Dask's own share; building the graph left "
              "out).", "",
              "| chunk | chunks | " + " | ".join(f"{k} (ms, of monolithic)" for k in _CHUNKED_RUNS)
              + " | Dask alone, threads (ms) |",
              "|---:|---:|" + "---:|" * (len(_CHUNKED_RUNS) + 1)]
    for c in r["chunked"]:
        cells = [f"{c[k]['seconds'] * 1e3:.2f}, **{c[k]['of monolithic']:.0%}**" for k in _CHUNKED_RUNS]
        cells.append(f"{c['dask alone'] * 1e3:.2f}" if "dask alone" in c else "-")
        lines.append(f"| {c['chunk MiB']} MiB | {c['chunks']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_CHUNKED_RUNS = ("chunkernels", "chunkernels, 1 thread", "chunkernels, chunksize",
                 "chunkernels, 1 thread, chunksize", "chunkernels, synchronous",
                 "chunkernels, CuPy's launches", "chunkernels, from_array", "plain dask")
