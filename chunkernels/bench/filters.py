"""``chunkernels bench filters``: the Gaussian filter and the GPU lesson's convolution, side by side
with SciPy, dask-image and cupyx on one GPU.

Gaussian filter, sigma 4, on an 8192 x 8192 float32 image (256 MiB): SciPy on one core,
dask-image on NumPy chunks of 2048 x 2048 with 16 threads, cupyx on the whole array, dask-image on
CuPy chunks of 2048 x 2048, chunkernels on the whole array and on Dask CuPy chunks of 2048 x 2048
(with Dask's default thread pool, one thread, and 16 tasks per thread handoff).
convolve2d of a 2048 x 2048 float64 image with a 15 x 15 kernel ('full' mode, zero fill: the
lesson's call): SciPy, cupyx and chunkernels. Every result is checked against SciPy's before it is
timed. Chunkernels' figures are compared with cupyx's and with a device copy of the same bytes,
measured in the same run: the copy is the floor for a filter that reads its input and writes its
output once.
"""

from __future__ import annotations

import contextlib
import time
from unittest import mock

import numpy as np

from chunkernels import cuda
from chunkernels.bench import (MiB, dask_alone, device_info, gpu_median, launches_holding_gil,
                               wall_median)

GAUSS_SHAPE, GAUSS_SIGMA, GAUSS_CHUNK = (8192, 8192), 4.0, 2048
CONV_SHAPE, CONV_TAPS = (2048, 2048), 15
#: Dask options of the chunked chunkernels runs (label suffix: options of ``dask.persist``): the
#: threaded scheduler with its default pool, with one thread, and handing its threads 16 ready
#: tasks at a time; and the synchronous scheduler, one host thread launching every block, which
#: docs/gpus.md recommends for one GPU in one process. ``hold_gil=False``: the kernels launch
#: through CuPy, which releases the GIL (:func:`chunkernels.bench.launches_holding_gil`).
#: ``grouped=False``: the graph of NumPy blocks, a task per block, instead of one task filtering
#: every block of the persisted input (:func:`chunkernels._halo.group_blocks`).
SCHEDULER_OPTIONS = {
    ", threads": {"scheduler": "threads"},
    ", 1 thread": {"scheduler": "threads", "num_workers": 1},
    ", threads, chunksize 16": {"scheduler": "threads", "chunksize": 16},
    ", synchronous scheduler": {"scheduler": "sync"},
    ", threads, a task per chunk": {"scheduler": "threads", "grouped": False},
    ", synchronous scheduler, a task per chunk": {"scheduler": "sync", "grouped": False},
    ", threads, CuPy's launches": {"scheduler": "threads", "hold_gil": False},
    ", synchronous scheduler, CuPy's launches": {"scheduler": "sync", "hold_gil": False},
}
#: Calls of the back-to-back convolve2d rows.
BACK_TO_BACK = 20
#: Threads of dask-image's NumPy run (the CPU baseline a multi-core workstation gets).
CPU_THREADS = 16
#: float32 results against SciPy's (float32 sums on the GPU); float64 as testing.TOLERANCES.
RTOL = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12)}


def run(args) -> dict:
    """Both comparisons; the dict holds the raw numbers and, under ``"markdown"``, the tables."""
    repeat = args.repeat
    report = {**device_info(), "benchmark": "filters", "repeat": repeat,
              "gaussian": _gaussian(repeat), "convolve2d": _convolve2d(repeat)}
    report["markdown"] = _markdown(report)
    return report


def _gaussian(repeat: int) -> dict:
    import dask
    import dask.array as da
    import scipy.ndimage as ndi
    from cupyx.scipy import ndimage as cndi

    from chunkernels import ndimage

    cp = cuda.cupy()
    sync = cp.cuda.Device().synchronize
    host = np.random.default_rng(0).random(GAUSS_SHAPE, dtype=np.float32)
    t0 = time.perf_counter()
    expected = ndi.gaussian_filter(host, GAUSS_SIGMA)
    rows = [_row("SciPy, 1 core", time.perf_counter() - t0, "wall, one run (it is the reference)")]

    dask_image = _dask_image()
    chunks = (GAUSS_CHUNK, GAUSS_CHUNK)
    if dask_image is not None:
        lazy = da.from_array(host, chunks=chunks)
        run_cpu = lambda: dask_image.gaussian_filter(lazy, GAUSS_SIGMA).compute(  # noqa: E731
            scheduler="threads", num_workers=CPU_THREADS)
        _check("dask-image, NumPy chunks", run_cpu(), expected)
        rows.append(_row(f"dask-image, NumPy chunks {GAUSS_CHUNK}², {CPU_THREADS} threads",
                         wall_median(run_cpu, max(3, repeat // 4), warmup=1), "wall"))

    x = cp.asarray(host)
    dx = da.from_array(x, chunks=chunks, asarray=False).persist()

    def chunked(filter_fn, hold_gil=True, grouped=True, **options):
        def go():
            with launches_holding_gil(hold_gil), _grouping(grouped):
                (z,) = dask.persist(filter_fn(dx, GAUSS_SIGMA),
                                    **{"scheduler": "threads", **options})
                sync()
            return z
        return go

    copy = _device_copy(x)
    whole = {
        "cupyx, whole array": lambda: cndi.gaussian_filter(x, GAUSS_SIGMA),
        "chunkernels, whole array": lambda: ndimage.gaussian_filter(x, GAUSS_SIGMA),
    }
    for label, fn in whole.items():
        _check(label, fn(), expected)
        rows.append(_row(label, gpu_median(fn, repeat), "GPU (CUDA events)"))
    runs = {f"chunkernels, Dask CuPy chunks{suffix}": chunked(ndimage.gaussian_filter, **options)
            for suffix, options in SCHEDULER_OPTIONS.items()}
    if dask_image is not None:
        runs = {"dask-image, Dask CuPy chunks": chunked(dask_image.gaussian_filter), **runs}
    for label, fn in runs.items():
        _check(label, fn().compute(scheduler="threads"), expected)
        rows.append(_row(f"{label} {GAUSS_CHUNK}², persisted input", wall_median(
            fn, repeat), "wall, ends in a device sync"))
    # Dask's own share of those runs: the same graph, every task a no-op
    for suffix in (", threads", ", synchronous scheduler"):
        rows.append(_row(f"(Dask alone{suffix}: the same graph, every task a no-op)", wall_median(
            dask_alone(ndimage.gaussian_filter(dx, GAUSS_SIGMA), **SCHEDULER_OPTIONS[suffix]),
            repeat), "wall"))
    t_copy = gpu_median(copy, repeat)
    return {"shape": list(GAUSS_SHAPE), "dtype": "float32", "sigma": GAUSS_SIGMA,
            "chunk": GAUSS_CHUNK, "copy_s": t_copy, "copy_mib": x.nbytes / MiB,
            "dask_image": dask_image is not None, "rows": _ratios(rows, t_copy)}


def _convolve2d(repeat: int) -> dict:
    import scipy.signal as sg
    from cupyx.scipy import signal as csg

    from chunkernels.signal import convolve2d

    cp = cuda.cupy()
    rng = np.random.default_rng(1)
    host = rng.random(CONV_SHAPE)
    weights = rng.random((CONV_TAPS, CONV_TAPS))
    t0 = time.perf_counter()
    expected = sg.convolve2d(host, weights)
    rows = [_row("SciPy, 1 core", time.perf_counter() - t0, "wall, one run (it is the reference)")]
    x, w = cp.asarray(host), cp.asarray(weights)
    calls = {"cupyx": lambda: csg.convolve2d(x, w), "chunkernels": lambda: convolve2d(x, w)}
    for label, fn in calls.items():
        _check(label, fn(), expected)
        rows.append(_row(label, gpu_median(fn, repeat), "GPU (CUDA events)"))
    # one call is timed from before its host work to the end of its kernel: on a GPU left idle
    # the host's preparation is part of it. In a pipeline the host prepares the next call while
    # the GPU runs this one; these rows time calls queued back to back, per call.
    for label, fn in calls.items():
        rows.append(_row(f"{label}, {BACK_TO_BACK} calls back to back (per call)",
                         gpu_median(_queued(fn, BACK_TO_BACK), repeat) / BACK_TO_BACK,
                         "GPU (CUDA events)"))
    t_copy = gpu_median(_device_copy(x), repeat)
    fmas = expected.size * weights.size
    for row in rows:
        row["TFLOP/s"] = 2 * fmas / row["seconds"] / 1e12
    return {"shape": list(CONV_SHAPE), "taps": CONV_TAPS, "dtype": "float64", "mode": "full",
            "out_shape": list(expected.shape), "fmas": fmas, "copy_s": t_copy,
            "copy_mib": x.nbytes / MiB, "rows": _ratios(rows, t_copy)}


def _grouping(grouped: bool):
    """A context in which blocks in memory run in group tasks (``grouped``, the library's
    default for CuPy blocks under a local scheduler) or a task each."""
    from chunkernels import _halo

    if grouped:
        return contextlib.nullcontext()
    return mock.patch.object(_halo, "group_blocks", lambda held: False)


def _queued(fn, count: int):
    """``fn`` called ``count`` times in a row, without synchronising in between."""
    def run():
        for _ in range(count):
            result = fn()
        return result
    return run


def _dask_image():
    """dask-image's ndfilters, or ``None`` where it is not installed (its rows are left out)."""
    try:
        import dask_image.ndfilters
    except ImportError:
        return None
    return dask_image.ndfilters


def _device_copy(x):
    """A device-to-device copy of ``x``'s bytes into a buffer allocated once."""
    cp = cuda.cupy()
    dst = cp.empty_like(x)
    stream = cp.cuda.get_current_stream()
    return lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, x.data.ptr, x.nbytes,
                                               cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)


def _check(label, got, expected):
    got = got.get() if cuda.is_cupy_array(got) else np.asarray(got)
    rtol, atol = RTOL[expected.dtype.name]
    if got.dtype != expected.dtype or got.shape != expected.shape or not np.allclose(
            got, expected, rtol=rtol, atol=atol):
        raise AssertionError(f"{label} gave a wrong result (dtype {got.dtype}, shape {got.shape},"
                             f" max error {np.max(np.abs(got - expected)):.3g}); not timing it")


def _row(label, seconds, clock):
    return {"impl": label, "seconds": float(seconds), "clock": clock}


def _ratios(rows, t_copy):
    """cupyx's time over each row's (a speed-up), and the copy floor's time over each row's.

    A chunkernels row is compared with the cupyx row timed the same way where there is one
    ("chunkernels, whole array" with "cupyx, whole array"), else with the first cupyx row.
    """
    times = {r["impl"]: r["seconds"] for r in rows}
    first = next(r["seconds"] for r in rows if r["impl"].startswith("cupyx"))
    for r in rows:
        if r["impl"].startswith("(Dask alone"):  # no kernel ran: nothing to compare
            r["vs cupyx"] = r["of copy"] = None
            continue
        peer = r["impl"].replace("chunkernels", "cupyx", 1)
        cupyx = times.get(peer, first) if r["impl"].startswith("chunkernels") else first
        r["vs cupyx"] = cupyx / r["seconds"]
        r["of copy"] = t_copy / r["seconds"]
    return rows


def _markdown(r) -> str:
    g, c = r["gaussian"], r["convolve2d"]
    lines = [f"### Filters on {r['device']} ({r['date']}, CuPy {r['cupy']})", "",
             f"**gaussian_filter**, sigma {g['sigma']:g}, {g['shape'][0]}×{g['shape'][1]} "
             f"float32 ({g['copy_mib']:.0f} MiB). Device copy of the same bytes: "
             f"{g['copy_s'] * 1e3:.3f} ms. \"× cupyx\": cupyx's time over this one; \"of copy\": "
             f"the copy's time over this one. Medians of {r['repeat']} runs unless the clock "
             f"column says otherwise. \"Dask alone\": the chunked graph with every task "
             f"replaced by a no-op, persisted: Dask's own share of the chunked rows on this host "
             f"(building the graph, which those rows include, left out).", ""]
    if not g["dask_image"]:
        lines += ["dask-image is not installed here: its rows are left out.", ""]
    lines += _table(g["rows"], ())
    lines += ["", f"**convolve2d**, {c['shape'][0]}×{c['shape'][1]} float64 ⊛ "
              f"{c['taps']}×{c['taps']}, mode '{c['mode']}' (output {c['out_shape'][0]}×"
              f"{c['out_shape'][1]}, {c['fmas'] / 1e9:.2f} G multiply-adds). Device copy of the "
              f"input's {c['copy_mib']:.0f} MiB: {c['copy_s'] * 1e3:.3f} ms.", ""]
    lines += _table(c["rows"], ("TFLOP/s",))
    return "\n".join(lines)


def _table(rows, extra):
    head = "| implementation | time (ms) | clock | × cupyx | of copy |" + "".join(
        f" {e} |" for e in extra)
    lines = [head, "|---|---:|---|---:|---:|" + "---:|" * len(extra)]
    for row in rows:
        cells = "".join(f" {row[e]:.3g} |" for e in extra)
        if row["vs cupyx"] is None:
            lines.append(f"| {row['impl']} | {row['seconds'] * 1e3:.4g} | {row['clock']} | - | - |"
                         + " - |" * len(extra))
            continue
        lines.append(f"| {row['impl']} | {row['seconds'] * 1e3:.4g} | {row['clock']} | "
                     f"{row['vs cupyx']:.3g} | {100 * row['of copy']:.3g}% |{cells}")
    return lines
