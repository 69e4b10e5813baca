"""``chunkernels bench kappa_sigma_clip``: κ-σ clipping of an 8192² float32 image on one GPU
(``--size`` and ``--chunks`` change the image and the chunks of the Dask run).

The image is the synthetic radio sky of ``chunkernels demo`` (noise, a gradient, point and extended
sources), made on the GPU. Every implementation is checked before it is timed: chunkernels' runs
must equal :func:`chunkernels.sources.clip_reference` on the NumPy copy (the lesson's loop with the
standard deviation in float64: same kept values, median, iterations), and everything must agree
with the GPU lesson's own loop (``ks_clipper_cpu`` of seed 002) up to float32 rounding (NumPy
sums float32 in float32, which can move a pixel lying on a window edge):

* chunkernels on the whole CuPy array;
* chunkernels on a Dask array of 2048² CuPy chunks (16), persisted (in device memory);
* the lesson's loop fed the CuPy array (its GPU challenge: ``cp.median``, ``cp.std``, ``compress``);
* the lesson's loop on the NumPy array, on the CPU, once (for scale).

GPU runs are timed by ``cupyx.profiler.benchmark`` (CUDA events around each call, which include
the host round trips between passes) and by the wall clock; the CPU run by the wall clock.
"""

from __future__ import annotations

import time

import numpy as np

from chunkernels import cuda
from chunkernels.bench import array_shape, chunk_shapes, device_info, gpu_median, wall_median

#: The image and chunk shapes unless --size / --chunks say otherwise (the first --chunks).
SHAPE = (8192, 8192)
CHUNK = (2048, 2048)
KAPPA = 3.0


def run(args) -> dict:
    """Check, then time, κ-σ clipping of an 8192² float32 sky; returns the report."""
    import dask.array as da

    from chunkernels._graph import in_memory_blocks
    from chunkernels.kernels import kappa_sigma_clip as ksc
    from chunkernels.sources import clip_reference, kappa_sigma_clip, synthetic_sky
    from chunkernels.sources._passes import DevicePasses, clip_with_passes
    from chunkernels.sources.lesson import ks_clipper_cpu

    cp = cuda.cupy()
    info = device_info()
    shape = array_shape(args, SHAPE, np.float32)
    chunk = chunk_shapes(args, shape, [CHUNK], np.float32)[0]
    sky, _ = synthetic_sky(shape, chunks=chunk, seed=0, gpu=True)
    x = sky.compute(scheduler="threads")
    host = x.get()

    start = time.perf_counter()
    kept = ks_clipper_cpu(host.ravel(), KAPPA)
    cpu_seconds = time.perf_counter() - start
    lesson = {"count": kept.size, "median": np.median(kept), "std": float(np.std(kept))}
    reference = clip_reference(host, KAPPA)  # the lesson's loop with the std in float64

    dx = da.from_array(x, chunks=chunk, asarray=False).persist()
    runs = {
        "chunkernels, CuPy whole array": ([x], lambda: kappa_sigma_clip(x, KAPPA)),
        f"chunkernels, Dask CuPy chunks {chunk[0]}x{chunk[1]} ({dx.npartitions}, persisted)":
            (list(in_memory_blocks(dx).values()), lambda: kappa_sigma_clip(dx, KAPPA)),
    }
    rows = []
    for label, (blocks, fn) in runs.items():
        result = fn()
        if (result.count, result.median, result.iterations) != (
                reference.count, reference.median, reference.iterations) or \
                abs(result.std - reference.std) > 1e-12 * reference.std:
            raise AssertionError(f"{label} gave {result}; the CPU reference (the lesson's loop "
                                 f"with a float64 std) gives {reference}; not timing it")
        passes = DevicePasses(blocks)  # the same clipping, counting its passes
        clip_with_passes(passes, x.dtype, KAPPA, None)
        rows.append({"impl": label, "iterations": result.iterations, "passes": passes.passes,
                     "kept": result.count,
                     "gpu_s": gpu_median(fn, args.repeat), "wall_s": wall_median(fn, args.repeat)})

    flat = x.ravel()
    on_gpu = ks_clipper_cpu(flat, KAPPA)
    # a peer, not a reference: CuPy's float32 std rounds otherwise than NumPy's, which can move
    # its window by a rounding and keep a few edge pixels more or fewer; checked more loosely
    _check_lesson("the lesson's loop on CuPy", on_gpu.size, cp.median(on_gpu).get()[()],
                  float(cp.std(on_gpu)), lesson, host.size, loose=True)
    repeat = max(3, args.repeat // 4)
    rows.append({"impl": "lesson's ks_clipper_cpu fed the CuPy array", "iterations": None,
                 "kept": int(on_gpu.size),
                 "gpu_s": gpu_median(lambda: ks_clipper_cpu(flat, KAPPA), repeat),
                 "wall_s": wall_median(lambda: ks_clipper_cpu(flat, KAPPA), repeat)})
    rows.append({"impl": "lesson's ks_clipper_cpu on NumPy (CPU, one run)", "iterations": None,
                 "kept": int(lesson["count"]),
                 "gpu_s": None, "wall_s": cpu_seconds})
    _check_lesson("chunkernels", reference.count, reference.median, reference.std, lesson,
                  host.size)
    report = {**info, "kernel": "kappa_sigma_clip", "shape": list(shape), "dtype": "float32",
              "chunk": list(chunk), "kappa": KAPPA, "kept": reference.count,
              "median": float(reference.median), "std": reference.std,
              "lesson": {"kept": int(lesson["count"]), "median": float(lesson["median"]),
                         "std": lesson["std"]},
              "runs": rows, "bins": ksc.bins_cap(cp.cuda.runtime.getDevice())}
    report["markdown"] = _markdown(report)
    return report


def _check_lesson(label, count, median, std, lesson, size, loose=False):
    """Raise unless ``label`` kept what the lesson's loop on the CPU keeps, up to float32
    rounding: NumPy's std of float32 data sums in float32, so its window edges may differ by a
    rounding, and a pixel on an edge be kept by one and not the other. ``loose`` for an
    implementation whose float32 sums round otherwise (CuPy's): its iterations may then part
    from NumPy's by a few edge pixels, and these move the median and std by a little more."""
    edge, tol = (max(2, int(1e-5 * size)), 1e-4) if loose else (max(2, int(1e-6 * size)), 1e-5)
    if abs(count - lesson["count"]) > edge or abs(float(median) - float(lesson["median"])) > \
            tol * lesson["std"] or abs(std - lesson["std"]) > tol * lesson["std"]:
        raise AssertionError(
            f"{label} disagrees with the lesson's loop on the CPU: kept {count}, median "
            f"{median!r}, std {std!r}; the lesson keeps {lesson['count']}, median "
            f"{lesson['median']!r}, std {lesson['std']!r}")


def _markdown(r) -> str:
    lesson = r["lesson"]
    lines = [f"### kappa_sigma_clip on {r['device']} ({r['date']}, CuPy {r['cupy']})", "",
             f"κ-σ clipping (κ = {r['kappa']:g}) of the {r['shape'][0]}x{r['shape'][1]} float32 "
             f"synthetic sky of `chunkernels demo` until nothing more is clipped: {r['kept']} "
             f"pixels kept, median "
             f"{r['median']:.6g}, std {r['std']:.6g} (the lesson's loop on the CPU: "
             f"{lesson['kept']}, {lesson['median']:.6g}, {lesson['std']:.6g}). chunkernels' rows "
             f"equal the CPU reference before they are timed. GPU time: median of CUDA-event "
             f"timings (the host round trips between passes included); wall: median wall clock. "
             f"Histograms of {r['bins']} bins.", "",
             "| implementation | iterations | passes (host round trips) | pixels kept | GPU time (ms) "
             "| wall (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in r["runs"]:
        it = row["iterations"] if row["iterations"] is not None else "-"
        passes = row.get("passes", "-")
        gpu = f"{row['gpu_s'] * 1e3:.2f}" if row["gpu_s"] is not None else "-"
        lines.append(f"| {row['impl']} | {it} | {passes} | {row['kept']} | {gpu} | "
                     f"{row['wall_s'] * 1e3:.2f} |")
    return "\n".join(lines)
