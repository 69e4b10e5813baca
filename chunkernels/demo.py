"""``chunkernels demo``: the GPU lesson's source finding (seed 002), chunked, validated on the CPU.

The four steps of the lesson's radio-astronomy example — κ-σ clipping of the background,
segmentation at 5 σ, connected-component labelling, per-source centre of mass and flux — run
through chunkernels on a Dask array: CuPy chunks on a ``LocalCUDACluster`` (one worker per GPU)
where there are GPUs, NumPy chunks on Dask's threads otherwise. The image is a FITS, TIFF, Zarr or
``.npy`` file, or a synthetic sky with a known source list, made chunk by chunk where the chunks
live. The same image is then brought to the host and run through the lesson's own CPU code
(:mod:`chunkernels.sources.lesson`: ``ks_clipper_cpu``, ``np.where``, ``scipy.ndimage.label``,
``center_of_mass``, ``sum_labels``), the two are compared number by number, and for the synthetic
sky the catalogue is matched against the injected sources. Writes ``catalogue.csv`` and
``preview.png`` (and ``injected.csv`` for the synthetic sky) into the output folder.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chunkernels import cuda

#: κ of the background clipping and the detection threshold in σ, as in the lesson.
KAPPA = 3.0
NSIGMA = 5.0
DEFAULT_SIZE = 8192
MAX_CHUNK = 2048
#: Longest side of the preview image, in pixels of the image (larger images are max-pooled).
PREVIEW = 1024
#: Tolerances of the comparison with the CPU reference: NumPy's std of float32 data accumulates
#: in float32; centres of mass and sums are float64 on both sides.
STD_RTOL = {"float32": 1e-5}
CENTROID_ATOL = 1e-6
FLUX_RTOL = 1e-9


def add_arguments(parser) -> None:
    from chunkernels.cli import _count, _positive, add_cluster_arguments

    parser.add_argument("image", nargs="?", metavar="IMAGE", type=_image_path,
                        help="FITS, TIFF, Zarr or .npy image (2-D; default: a synthetic sky)")
    parser.add_argument("--size", type=_positive, metavar="N",
                        help=f"side of the synthetic sky in pixels (default {DEFAULT_SIZE})")
    parser.add_argument("--chunks", type=_positive, metavar="N",
                        help=f"chunk side in pixels (default: half the image side, at most "
                             f"{MAX_CHUNK})")
    parser.add_argument("--seed", type=_count, default=0, metavar="S",
                        help="seed of the synthetic sky (default 0)")
    parser.add_argument("--out", default="chunkernels-demo", metavar="DIR",
                        help="folder for catalogue.csv and preview.png (default ./chunkernels-demo)")
    add_cluster_arguments(parser)


def _image_path(text):
    from chunkernels.sources._io import image_format

    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no image file at {text!r}")
    try:
        image_format(path)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return path


def run(args) -> int:
    """The ``chunkernels demo`` command; returns the exit status (1: the CPU comparison failed)."""
    from chunkernels.cli import cluster_from_args

    if args.image is not None and args.size is not None:
        return _usage_error("--size sets the side of the synthetic sky; an IMAGE has its own")
    missing = [name for name in ("matplotlib", "tqdm") if importlib.util.find_spec(name) is None]
    if missing:
        return _usage_error(f"needs {' and '.join(missing)}, not installed here: "
                            f"pip install 'chunkernels[demo]'")
    if args.gpus is None and args.scheduler is None and cuda.gpu_count() > 0:
        args.gpus = cuda.gpu_count()  # GPUs here: a LocalCUDACluster, one worker per GPU
    try:
        context = cluster_from_args(args)
    except (ValueError, ImportError) as exc:
        return _usage_error(str(exc))
    with context as client:
        try:
            return _pipeline(args, client)
        except _InputError as exc:
            return _usage_error(str(exc))


def _usage_error(message) -> int:
    print(f"chunkernels demo: {message}", file=sys.stderr)
    return 2


class _InputError(ValueError):
    """An image the demo cannot work on (its shape or dtype)."""


@dataclass
class _Steps:
    """Wall-clock time of each step, with a progress bar on a terminal."""

    total: int
    times: dict = field(default_factory=dict)

    def __post_init__(self):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, unit="step", disable=None, file=sys.stderr,
                        bar_format="{desc:<26}{bar:24}{n_fmt}/{total_fmt} [{elapsed}]")

    @contextlib.contextmanager
    def __call__(self, name):
        self.bar.set_description_str(name)
        start = time.perf_counter()
        yield
        self.times[name] = time.perf_counter() - start
        self.bar.update()

    def close(self):
        self.bar.close()


def _pipeline(args, client) -> int:
    import dask

    from chunkernels.ndimage import label, measure
    from chunkernels.sources import kappa_sigma_clip, read_image, synthetic_sky, threshold
    from chunkernels.sources._detect import CATALOGUE
    from chunkernels.sources.lesson import find_sources_cpu

    gpu_names = _gpu_names(client)
    gpu = bool(gpu_names)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = _Steps(total=7 if args.image is None else 6)
    try:
        if args.image is None:
            size = args.size or DEFAULT_SIZE
            chunk = args.chunks or _default_chunk((size, size))
            with steps("synthetic sky"):
                image, truth = synthetic_sky(size, chunks=chunk, seed=args.seed, gpu=gpu)
                image = _persist(image, client)
            source = f"synthetic sky {size}x{size} (seed {args.seed}, {len(truth['id'])} sources)"
        else:
            with steps("read image"):
                image = _open(args.image, args.chunks, gpu, read_image)
                image = _persist(image, client)
            truth, source = None, str(args.image)
        with steps("κσ clipping"):
            background = kappa_sigma_clip(image, KAPPA)
        level = float(background.median) + NSIGMA * background.std
        with steps("threshold + label"):
            labels, count = label(threshold(image, np.float64(level)))
            if hasattr(count, "compute"):
                # one graph for both: computed apart, the labels' persist (whose optimisation
                # fuses the threshold into the labelling) and the count's compute would send
                # the scheduler one key with two definitions
                labels, count = _persist((labels, count), client)
            count = int(_host(count.compute() if hasattr(count, "compute") else count))
        with steps("measure"):
            table = measure(image, labels, properties=CATALOGUE, as_frame=False)
            table = dict(zip(table, map(_host, dask.compute(*table.values()))))
        with steps("CPU reference"):
            data = _host(image.compute())
            reference = find_sources_cpu(data, KAPPA, NSIGMA)
            checks = _compare(background, level, count, _host(labels.compute()), table, data,
                              reference)
        recovery = None
        if truth is not None:
            with steps("recovery"):
                recovery = _recovery(truth, table)
        with steps("write"):
            written = _write(out, table, data, level, background, truth, recovery)
    finally:
        steps.close()
    if gpu:
        where = f"{len(gpu_names)} GPU worker(s): {', '.join(sorted(set(gpu_names)))}"
    else:
        where = "CPU, " + ("Dask workers" if client is not None else "Dask's threads")
    _summary(source, image, where, steps.times, background, level, count, checks, recovery,
             written)
    return 0 if all(ok for _, ok, _ in checks) else 1


def _default_chunk(shape) -> int:
    return min(MAX_CHUNK, max(1, max(shape) // 2))


def _open(path, chunk, gpu, read_image):
    from chunkernels.kernels.kappa_sigma_clip import check_dtype

    image = read_image(path)
    if image.ndim != 2:
        raise _InputError(f"{path} holds an array of shape {image.shape}; the demo finds sources "
                          f"in 2-D images")
    try:
        check_dtype(image.dtype)
    except TypeError as exc:
        raise _InputError(f"{path}: {exc}") from None
    chunk = chunk or _default_chunk(image.shape)
    image = read_image(path, chunks=(chunk, chunk))
    if image.chunksize != (min(chunk, image.shape[0]), min(chunk, image.shape[1])):
        image = image.rechunk((chunk, chunk))  # a Zarr / TIFF file keeps its own chunks
    if gpu:
        cp = cuda.cupy()
        image = image.map_blocks(cp.asarray, meta=cp.empty((0, 0), dtype=image.dtype))
    return image


def _persist(x, client):
    """``x`` (a Dask collection, or a tuple of them persisted together) in memory; with a
    client, once the workers hold it."""
    import dask

    persisted = dask.persist(*x) if isinstance(x, tuple) else (x.persist(),)
    if client is not None:
        from distributed import wait

        wait(list(persisted))
    return persisted if isinstance(x, tuple) else persisted[0]


def _gpu_names(client) -> list[str]:
    """The GPUs of the cluster's workers; none without a cluster (Dask's threads, NumPy chunks:
    with GPUs present and no option given, ``run`` starts a GPU cluster)."""
    from chunkernels.cluster import gpu_names

    return [] if client is None else gpu_names(client)


def _host(a):
    """A NumPy array (or scalar) from a NumPy or CuPy one."""
    return a.get() if cuda.is_cupy_array(a) else np.asarray(a)


# -- the comparison with the CPU reference ------------------------------------------------------

def _compare(background, level, count, labels, table, data, reference):
    """``[(what, passed, details)]``: chunkernels against the lesson's CPU code.

    The lesson's loop takes NumPy's float32 standard deviation of float32 data and computes its
    window and threshold in float32; chunkernels takes both in float64. The two agree to float32
    rounding, and a pixel whose value lies within that rounding of a window edge or of the
    threshold may be kept (or segmented) by one and not the other: the checks allow exactly that
    (see :func:`chunkernels.sources.kappa_sigma_clip`'s notes), and say when it happened.
    """
    from scipy import ndimage

    checks = []
    tolerance = STD_RTOL.get(data.dtype.name, 1e-12)
    ref_median, ref_std = float(reference["median"]), float(reference["std"])
    median_diff = abs(float(background.median) - ref_median) / max(abs(ref_std), 1e-300)
    checks.append(("background median", median_diff <= tolerance,
                   f"{float(background.median):.6g}, CPU {ref_median:.6g} "
                   + ("(equal)" if median_diff == 0 else f"(differs by {median_diff:.1e} σ)")))
    rel = abs(background.std - ref_std) / ref_std if ref_std else abs(background.std)
    checks.append(("background std", rel <= tolerance,
                   f"{background.std:.6g}, CPU {ref_std:.6g} (rel. diff {rel:.1e}; NumPy sums "
                   f"float32 in float32)"))
    edge = max(2, int(1e-6 * data.size))
    kept_diff = abs(background.count - int(reference["count"]))
    checks.append(("background pixels", kept_diff <= edge,
                   f"{background.count} kept, CPU {reference['count']} "
                   + ("(equal" if kept_diff == 0 else f"({kept_diff} on a window edge")
                   + f"; {background.iterations} iterations)"))
    ref_level = float(reference["threshold"])
    rel = abs(level - ref_level) / max(abs(ref_level), 1e-300)
    ours, theirs = labels > 0, reference["labels"] > 0
    between = (data > np.float64(level)) != (data > reference["threshold"])
    only_between = not np.any((ours != theirs) & ~between)
    checks.append(("segmentation", rel <= tolerance and only_between,
                   f"threshold {level:.6g} = median + {NSIGMA:g} σ, CPU {ref_level:.6g} (rel. diff "
                   f"{rel:.1e}); " + ("same pixels above it" if not between.any() else
                                      f"{int(between.sum())} pixel(s) lie between the two")))
    if between.any():  # the segmentations differ: compare with SciPy's labels of ours
        own, own_count = ndimage.label(ours)
        identical = own_count == count and np.array_equal(labels, own)
    else:
        identical = count == reference["num_features"] and np.array_equal(labels,
                                                                          reference["labels"])
    checks.append(("labels", bool(identical),
                   f"{count} sources, CPU scipy.ndimage.label {reference['num_features']}; "
                   + ("label images identical" if identical and not between.any() else
                      "identical to scipy.ndimage.label of the same segmentation" if identical
                      else "DIFFERENT")))
    # measurements against SciPy on the same labels: how the measurements themselves compare
    index = np.arange(1, count + 1)
    ok = np.array_equal(table["label"], index)
    if count:
        if identical and not between.any():  # the lesson's own measurements are of these labels
            centres, fluxes = reference["positions"], reference["fluxes"]
        else:
            centres = np.array(ndimage.center_of_mass(data, labels, index)).reshape(count, 2)
            fluxes = ndimage.sum_labels(data, labels, index)
        areas = np.bincount(labels.ravel(), minlength=count + 1)[1:]
        peaks = ndimage.maximum(data, labels, index)
        boxes = np.array([(s[0].start, s[1].start, s[0].stop, s[1].stop)
                          for s in ndimage.find_objects(labels)[:count]])
        d_centre = float(np.max(np.abs(np.column_stack([table["center_of_mass-0"], table["center_of_mass-1"]])
                                       - centres)))
        d_flux = float(np.max(np.abs(table["sum"] - fluxes) / np.maximum(np.abs(fluxes), 1e-300)))
        ok &= bool(d_centre <= CENTROID_ATOL and d_flux <= FLUX_RTOL
                   and np.array_equal(table["area"], areas)
                   and np.array_equal(np.asarray(table["max"], dtype=data.dtype), peaks)
                   and np.array_equal(np.column_stack([table[f"bbox-{i}"] for i in range(4)]), boxes))
        detail = (f"centres of mass max |diff| {d_centre:.1e} px, fluxes max rel. diff "
                  f"{d_flux:.1e}; areas, peaks, boxes " + ("equal" if ok else "DIFFERENT"))
    else:
        detail = "no sources"
    checks.append(("measurements", bool(ok), detail + " (vs scipy.ndimage on the same labels)"))
    return checks


# -- recovery of the injected sources -------------------------------------------------------------

@dataclass
class _Recovery:
    bright: tuple[int, int]  # recovered, injected with peak S/N >= 10
    faint: tuple[int, int]  # recovered, injected with 5 <= S/N < 10
    spurious: int  # detections with no injected source near them
    offset: float  # median distance of recovered bright point sources, pixels
    recovered: np.ndarray  # per injected source


def _recovery(truth, table) -> _Recovery:
    """Which injected sources have a detection within max(3 px, 2 σ_major) of them, and which
    detections lie farther than max(3 px, 3 σ_major) from every injected source (an extended
    source near the threshold breaks up into pieces, whose centres lie off its own)."""
    from scipy.spatial import cKDTree

    injected = np.column_stack([truth["x"], truth["y"]])
    radius = np.maximum(3.0, 2.0 * truth["sigma_major"])
    found = np.column_stack([table["center_of_mass-1"], table["center_of_mass-0"]])
    if len(found):
        distance, _ = cKDTree(found).query(injected)
        reach = np.maximum(3.0, 3.0 * truth["sigma_major"])
        near = cKDTree(injected).query_ball_point(found, r=float(reach.max()))
        spurious = sum(not any(np.hypot(*(injected[j] - f)) <= reach[j] for j in js)
                       for f, js in zip(found, near))
    else:
        distance, spurious = np.full(len(injected), np.inf), 0
    recovered = distance <= radius
    snr = truth["snr"]
    bright, faint = snr >= 10, (snr >= 5) & (snr < 10)
    point = bright & recovered & ~truth["extended"]
    offset = float(np.median(distance[point])) if point.any() else math.nan
    return _Recovery((int(recovered[bright].sum()), int(bright.sum())),
                     (int(recovered[faint].sum()), int(faint.sum())), spurious, offset, recovered)


# -- outputs ----------------------------------------------------------------------------------------

CSV_COLUMNS = ("id", "x", "y", "flux", "area", "peak", "x_min", "y_min", "x_max", "y_max")


def _write(out, table, data, level, background, truth, recovery) -> list[Path]:
    catalogue = out / "catalogue.csv"
    columns = (table["label"], table["center_of_mass-1"], table["center_of_mass-0"], table["sum"],
               table["area"], table["max"], table["bbox-1"], table["bbox-0"], table["bbox-3"],
               table["bbox-2"])
    _write_csv(catalogue, CSV_COLUMNS, columns)
    written = [catalogue]
    if truth is not None:
        injected = out / "injected.csv"
        _write_csv(injected, ("id", "x", "y", "flux", "peak", "snr", "sigma_major", "sigma_minor",
                              "angle", "extended", "recovered"),
                   [truth[k] for k in ("id", "x", "y", "flux", "peak", "snr", "sigma_major",
                                       "sigma_minor", "angle", "extended")] + [recovery.recovered])
        written.append(injected)
    preview = out / "preview.png"
    _preview(preview, data, table, level, background, truth, recovery)
    written.append(preview)
    return written


def _write_csv(path, header, columns):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in zip(*columns):
            writer.writerow([_cell(v) for v in row])


def _cell(value):
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    return repr(float(value))  # the shortest text that reads back as the same float64


def _preview(path, data, table, level, background, truth, recovery):
    """The image max-pooled to at most PREVIEW pixels a side, on a log scale (as the lesson shows
    its radio image, black for bright), detections circled in red, injected sources brighter than
    5 σ that were missed crossed in blue."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    factor = max(1, math.ceil(max(data.shape) / PREVIEW))
    rows, cols = (n // factor * factor for n in data.shape)
    small = data[:rows, :cols].reshape(rows // factor, factor, cols // factor, factor).max(axis=(1, 3)) \
        if factor > 1 else data
    fig = Figure(figsize=(9.5, 8.5 * small.shape[0] / small.shape[1] + 0.5), dpi=110,
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    floor = max(background.std, np.finfo(np.float64).tiny) if math.isfinite(background.std) else 1.0
    top = max(float(np.nanmax(small)) if small.size else floor, floor * 10)
    shown = ax.imshow(np.clip(small, floor, None), cmap="gray_r", origin="lower",
                      norm=LogNorm(vmin=floor, vmax=top), interpolation="nearest")
    fig.colorbar(shown, ax=ax, shrink=0.9, label="pixel value")
    to_preview = lambda v: (np.asarray(v, dtype=np.float64) + 0.5) / factor - 0.5  # noqa: E731
    if len(table["label"]):
        ax.scatter(to_preview(table["center_of_mass-1"]), to_preview(table["center_of_mass-0"]),
                   s=12 + 4 * np.sqrt(np.asarray(table["area"], dtype=float)) / factor,
                   facecolors="none", edgecolors="red", linewidths=0.7, label="detected")
    if truth is not None:
        missed = (truth["snr"] >= NSIGMA) & ~recovery.recovered
        if missed.any():
            ax.scatter(to_preview(truth["x"][missed]), to_preview(truth["y"][missed]), marker="x",
                       s=18, color="tab:blue", linewidths=0.8,
                       label=f"injected, S/N ≥ {NSIGMA:g}, missed")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{len(table['label'])} sources above median + {NSIGMA:g} σ = {level:.3g}"
                 + (f" (max-pooled {factor}x{factor})" if factor > 1 else ""), fontsize=10)
    ax.set_xlabel("x (pixels / %d)" % factor if factor > 1 else "x (pixels)")
    ax.set_ylabel("y (pixels / %d)" % factor if factor > 1 else "y (pixels)")
    fig.savefig(path)


# -- the summary ------------------------------------------------------------------------------------

def _summary(source, image, where, times, background, level, count, checks, recovery, written):
    chunks = image.numblocks[0] * image.numblocks[1]
    print(f"image:   {source}, {image.dtype}, {chunks} chunk(s) of up to "
          f"{image.chunksize[0]}x{image.chunksize[1]}, on {where}")
    print(f"sources: {count} above median + {NSIGMA:g} σ = {level:.6g} "
          f"(background median {float(background.median):.6g}, σ {background.std:.6g}, "
          f"κ = {KAPPA:g})")
    print()
    width = max(len(name) for name in times)
    for name, seconds in times.items():
        print(f"  {name:<{width}}  {seconds:8.2f} s")
    print(f"  {'total':<{width}}  {sum(times.values()):8.2f} s")
    print()
    print("validation against the lesson's CPU code on the same image:")
    width = max(len(name) for name, _, _ in checks)
    for name, ok, detail in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {name:<{width}}  {detail}")
    if recovery is not None:
        (rb, nb), (rf, nf) = recovery.bright, recovery.faint
        print()
        print(f"recovery of the injected sources: {rb} of {nb} with peak S/N >= 10 "
              f"({rb / max(nb, 1):.0%}), {rf} of {nf} with 5 <= S/N < 10; {recovery.spurious} "
              f"detection(s) with no injected source within max(3 px, 3 σ_major); median offset "
              f"of bright point sources {recovery.offset:.2f} px")
    print()
    print("wrote:   " + ", ".join(os.fspath(p) for p in written))
    passed = all(ok for _, ok, _ in checks)
    print("result:  " + ("validated: chunkernels agrees with the CPU reference" if passed else
                         "FAILED: chunkernels differs from the CPU reference (see above)"))
