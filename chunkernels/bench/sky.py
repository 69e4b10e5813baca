"""``chunkernels bench sky``: the synthetic sky of ``chunkernels demo`` made on one GPU, 8192² in
2048² chunks (``--size`` and ``--chunks`` change them).

Checked first: the GPU image against the CPU reference (``synthetic_sky`` on NumPy chunks, Dask's
threads): float32 pixels equal, but for a few one float32 ulp apart, which are counted.

Timed, wall clock from the call of ``synthetic_sky`` (source list and graph included) to a
synchronised device, median of ``--repeat`` runs after two warm-up runs, on Dask's threaded
scheduler in this process:

* ``synthetic_sky(..., gpu=True)`` computed (the image as one CuPy array) and persisted (its chunks
  in device memory): one launch of ``kernels_cuda/synthetic_sky.cu`` per chunk;
* the same with the per-source CuPy loop, the GPU path before the kernel (the reference code run
  on CuPy chunks: each source a few CuPy operations on its box);
* the first run in this process, which compiles the kernel (or loads it from CuPy's cache);
* one chunk's upload and launch alone (CUDA events, ``cupyx.profiler.benchmark``).

:func:`time_sky` gives the chunkernels rows alone, for other benchmarks (``demo``) to call.
"""

from __future__ import annotations

import pickle
import time

import numpy as np

from chunkernels import cuda
from chunkernels.bench import array_shape, chunk_shapes, device_info, wall_median

#: The image and chunk shapes unless --size / --chunks say otherwise (the first --chunks).
SHAPE = (8192, 8192)
CHUNK = (2048, 2048)
SEED = 0
#: The old per-source loop takes seconds per run: fewer repetitions.
LOOP_REPEAT = 3
#: What the per-source CuPy loop took on GPU workers (issue #22, 4x H100, 8192² in 2048² chunks,
#: the demo's "sky" step, seconds), for reading its row against.
ISSUE_22_SECONDS = (2.42, 3.34)


def run(args) -> dict:
    """Check, then time, the synthetic sky on the GPU; returns the report."""
    import dask

    from chunkernels.sources import synthetic_sky

    cp = cuda.cupy()
    info = device_info()
    shape = array_shape(args, SHAPE, np.float32)
    chunk = chunk_shapes(args, shape, [CHUNK], np.float32)[0]

    start = time.perf_counter()
    image, truth = synthetic_sky(shape, chunks=chunk, seed=SEED, gpu=True)
    gpu = image.compute(scheduler="threads")
    cp.cuda.Device().synchronize()
    first_s = time.perf_counter() - start
    cpu = synthetic_sky(shape, chunks=chunk, seed=SEED)[0].compute(scheduler="threads")
    differing = differing_pixels(gpu.get(), cpu)
    del gpu, cpu

    rows = time_sky(shape, chunk, args.repeat)
    sync = cp.cuda.Device().synchronize

    def loop_persisted():
        (persisted,) = dask.persist(per_source_loop_sky(shape, chunk), scheduler="threads")
        sync()
        return persisted

    def loop_computed():
        out = per_source_loop_sky(shape, chunk).compute(scheduler="threads")
        sync()
        return out

    rows += [{"impl": "per-source CuPy loop (before the kernel), computed",
              "seconds": wall_median(loop_computed, LOOP_REPEAT, warmup=1)},
             {"impl": "per-source CuPy loop (before the kernel), persisted",
              "seconds": wall_median(loop_persisted, LOOP_REPEAT, warmup=1)}]
    report = {**info, "benchmark": "sky", "shape": list(shape), "chunk": list(chunk),
              "sources": len(truth["id"]), "differing_pixels": differing, "first_run_s": first_s,
              "runs": rows,
              "launch": launch_times(shape, chunk, args.repeat),
              "graph_bytes": graph_bytes(image), "issue_22_seconds": list(ISSUE_22_SECONDS)}
    report["markdown"] = _markdown(report)
    return report


def time_sky(shape=SHAPE, chunk=CHUNK, repeat=20) -> list[dict]:
    """Median wall-clock seconds of ``synthetic_sky(shape, chunks=chunk, gpu=True)`` computed and
    persisted on this process's GPU (Dask's threads), each from the call to a synchronised
    device: ``[{"impl", "seconds"}, ...]``."""
    import dask

    from chunkernels.sources import synthetic_sky

    sync = cuda.cupy().cuda.Device().synchronize

    def computed():
        out = synthetic_sky(shape, chunks=chunk, seed=SEED, gpu=True)[0].compute(
            scheduler="threads")
        sync()
        return out

    def persisted():
        (image,) = dask.persist(synthetic_sky(shape, chunks=chunk, seed=SEED, gpu=True)[0],
                                scheduler="threads")
        sync()
        return image

    return [{"impl": "chunkernels, computed", "seconds": wall_median(computed, repeat)},
            {"impl": "chunkernels, persisted", "seconds": wall_median(persisted, repeat)}]


def differing_pixels(got: np.ndarray, want: np.ndarray) -> dict:
    """How many float32 pixels of ``got`` differ from the reference's ``want``: ``count`` in all,
    ``near_zero`` of them more than one float32 ulp apart but less than ``1e-12`` of the noise
    (values near 0, where terms the size of the noise cancel and their float64 roundings show),
    and ``max_ulps``, the largest difference of the others in float32 ulps. Raises
    AssertionError where a pixel is further off."""
    from chunkernels.sources._sky import NOISE

    differ = got != want
    a, b = got[differ], want[differ]
    apart = np.abs(a.astype(np.float64) - b)
    ulps = apart / np.spacing(np.maximum(np.abs(a), np.abs(b)))
    near_zero = (ulps > 1) & (apart <= 1e-12 * NOISE)
    bad = (ulps > 1) & ~near_zero
    if bad.any():
        where = np.argwhere(differ)[bad][:5].tolist()
        raise AssertionError(f"the GPU sky differs from the CPU reference by more than one "
                             f"float32 ulp at pixels {where}")
    return {"count": int(differ.sum()), "near_zero": int(near_zero.sum()),
            "max_ulps": float(ulps[~near_zero].max()) if (~near_zero).any() else 0.0}


def launch_times(shape, chunk, repeat) -> dict:
    """One chunk's upload and launch (``_render_cuda``; an interior chunk where there is one),
    median CUDA-event and host times."""
    import dask.array as da
    from cupyx.profiler import benchmark

    from chunkernels.sources import _sky

    table = _sky.render_table(_sky.sky_sources(shape, seed=SEED), shape, _sky.NOISE)
    chunks = da.core.normalize_chunks(chunk, shape, dtype=np.float32)
    index = tuple(min(1, len(c) - 1) for c in chunks)
    location = tuple((sum(c[:i]), sum(c[:i + 1])) for c, i in zip(chunks, index))
    rows = table[_sky.chunk_sources(table["box"], chunks)[index]]
    result = benchmark(lambda: _sky._render_cuda(location, rows, shape=shape, seed=SEED,
                                                 noise=_sky.NOISE), n_warmup=5, n_repeat=repeat)
    return {"location": [list(r) for r in location], "sources": len(rows),
            "gpu_s": float(np.median(result.gpu_times[0])),
            "cpu_s": float(np.median(result.cpu_times))}


def graph_bytes(image) -> dict:
    """The image's graph pickled once, and task by task (as a scheduler sends tasks to workers)."""
    graph = dict(image.__dask_graph__())
    sizes = [len(pickle.dumps(task, protocol=5)) for task in graph.values()]
    return {"whole": len(pickle.dumps(graph, protocol=5)), "tasks": sum(sizes),
            "largest_task": max(sizes)}


def _per_source_cupy(location, table, **params):
    """A chunk as the GPU path made it before the kernel: the reference code on CuPy."""
    from chunkernels.sources._sky import render_reference

    return render_reference(location, table, xp=cuda.cupy(), **params)


def per_source_loop_sky(shape=SHAPE, chunk=CHUNK):
    """``synthetic_sky(shape, chunks=chunk, gpu=True)`` as it was made before the kernel: each
    chunk the reference code run on CuPy, each source a few CuPy operations on its box."""
    import dask.array as da

    from chunkernels.sources import _sky

    chunks = da.core.normalize_chunks(chunk, shape, dtype=np.float32)
    meta = cuda.cupy().empty((0, 0), dtype=np.float32)
    truth = _sky.sky_sources(shape, seed=SEED)
    return _sky._image(_per_source_cupy, meta, shape, chunks, SEED, _sky.NOISE, truth)


def _markdown(r) -> str:
    launch = r["launch"]
    g = r["graph_bytes"]
    d = r["differing_pixels"]
    summary = (
        f"`synthetic_sky({r['shape'][0]}x{r['shape'][1]}, chunks={r['chunk'][0]}x"
        f"{r['chunk'][1]}, gpu=True)`, {r['sources']} sources, on one GPU (Dask's threads). "
        f"Checked first against the CPU reference: {d['count']} of "
        f"{r['shape'][0] * r['shape'][1]} float32 pixels differ, by at most "
        f"{d['max_ulps']:.2g} ulp ({d['near_zero']} of them near zero, by less than 1e-12 of "
        f"the noise). Wall clock from the call to a synchronised device, "
        f"median after warm-up. The first run in this process (compiling the kernel, or loading "
        f"it from CuPy's cache) took {r['first_run_s'] * 1e3:.0f} ms. Issue #22 measured the "
        f"per-source loop at {r['issue_22_seconds'][0]:g}–{r['issue_22_seconds'][1]:g} s on "
        f"GPU workers.")
    details = (
        f"One chunk {launch['location']} ({launch['sources']} sources), upload and launch: "
        f"{launch['gpu_s'] * 1e3:.3f} ms on the device (CUDA events), "
        f"{launch['cpu_s'] * 1e3:.3f} ms on the host. Graph: {g['whole']} bytes pickled once, "
        f"{g['tasks']} bytes task by task (largest task {g['largest_task']} bytes).")
    lines = [f"### sky on {r['device']} ({r['date']}, CuPy {r['cupy']})", "", summary, "",
             "| implementation | time (ms) |", "|---|---:|"]
    lines += [f"| {row['impl']} | {row['seconds'] * 1e3:.1f} |" for row in r["runs"]]
    lines += ["", details]
    return "\n".join(lines)
