"""``chunkernels bench``: kernels timed side by side with their peers on one GPU.

Every implementation's result is checked against the reference before it is timed. GPU times are
medians of CUDA-event timings after warm-up (``cupyx.profiler.benchmark``); chunked runs, which
include graph construction and Dask's scheduler, are medians of wall-clock times that end with a
device synchronisation. Results print as a Markdown table and are written as JSON under ``--out``.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from chunkernels import cuda

MiB = 2**20
GiB = 2**30

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


def add_arguments(parser) -> None:
    parser.add_argument("kernels", nargs="*", default=["broadcast_add"], metavar="KERNEL",
                        help="kernels to benchmark (default: broadcast_add)")
    parser.add_argument("--size-gib", type=float, default=1.0,
                        help="array size for the whole-array comparison (default 1 GiB)")
    parser.add_argument("--total-gib", type=float, default=16.0,
                        help="array size for the chunked runs (default 16 GiB)")
    parser.add_argument("--chunks-mib", type=int, nargs="+",
                        default=[16, 32, 64, 128, 256, 512, 1024],
                        help="chunk sizes for the chunked runs, in MiB")
    parser.add_argument("--repeat", type=int, default=20, help="timed repetitions (median)")
    parser.add_argument("--out", default="bench-results", help="folder for the JSON results")


def main(args) -> int:
    if cuda.gpu_count() == 0:
        print("chunkernels bench needs a CUDA GPU and CuPy; none found here.", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.kernels:
        if name not in BENCHMARKS:
            print(f"no benchmark for {name!r}; available: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        report = BENCHMARKS[name](args)
        (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2))
        print(report["markdown"])
    return 0


def device_info() -> dict:
    cp = cuda.cupy()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    return {"device": props["name"].decode(), "date": datetime.date.today().isoformat(),
            "cupy": cp.__version__}


def gpu_median(fn, repeat: int) -> float:
    """Median device time of ``fn()`` in seconds, after warm-up."""
    from cupyx.profiler import benchmark

    result = benchmark(fn, n_warmup=5, n_repeat=repeat)
    return float(np.median(result.gpu_times[0]))


def wall_median(fn, repeat: int, warmup: int = 2) -> float:
    """Median wall-clock time of ``fn()`` (which must synchronise) in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_broadcast_add(args) -> dict:
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

        def run_chunked(op, **kw):
            (z,) = dask.persist(op(), scheduler="threads", **kw)
            sync()
            return z

        runs = {
            "chunkernels": (lambda: chunkernels.apply(dx, "broadcast_add", dy), {}),
            "chunkernels, 1 thread": (lambda: chunkernels.apply(dx, "broadcast_add", dy), {"num_workers": 1}),
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
    lines += ["", f"Chunked: {r['chunked_total_gib']:g} GiB float32, Dask threaded scheduler, one GPU; "
              f"wall clock from building the graph to a synchronised device (persist), against one "
              f"`apply` on the whole array ({r['monolithic_s'] * 1e3:.2f} ms, same clock). Chunks "
              "are in device memory when the clock starts, except in the from_array column.", "",
              "| chunk | chunks | " + " | ".join(f"{k} (ms, of monolithic)" for k in _CHUNKED_RUNS) + " |",
              "|---:|---:|" + "---:|" * len(_CHUNKED_RUNS)]
    for c in r["chunked"]:
        cells = [f"{c[k]['seconds'] * 1e3:.2f}, **{c[k]['of monolithic']:.0%}**" for k in _CHUNKED_RUNS]
        lines.append(f"| {c['chunk MiB']} MiB | {c['chunks']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_CHUNKED_RUNS = ("chunkernels", "chunkernels, 1 thread", "chunkernels, from_array", "plain dask")

BENCHMARKS = {"broadcast_add": bench_broadcast_add}


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m chunkernels.bench", description=__doc__)
    add_arguments(p)
    sys.exit(main(p.parse_args()))
