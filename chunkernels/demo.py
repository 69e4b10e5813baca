"""``chunkernels demo``: the GPU lesson's source finding (seed 002), chunked, validated on the CPU.

The four steps of the lesson's radio-astronomy example — κ-σ clipping of the background,
segmentation at 5 σ, connected-component labelling, per-source centre of mass and flux — run
through chunkernels on a Dask array: CuPy chunks on a ``LocalCUDACluster`` (one worker per GPU)
where there are GPUs, NumPy chunks on Dask's threads otherwise. The image is a FITS, TIFF, Zarr or
``.npy`` file, or a synthetic sky with a known source list, made chunk by chunk where the chunks
live. Those four steps are the pipeline, timed on their own. Then, unless ``--no-validate``, the
same image is brought to the host and run through the lesson's own CPU code
(:mod:`chunkernels.sources.lesson`: ``ks_clipper_cpu``, ``np.where``, ``scipy.ndimage.label``,
``center_of_mass``, ``sum_labels``), and the two are compared number by number; for the synthetic
sky the catalogue is matched against the injected sources. Writes ``catalogue.csv`` and
``preview.png`` (and ``injected.csv`` for the synthetic sky) into the output folder;
:data:`OUTPUTS` says what they hold.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkernels import cuda
from chunkernels._cli_args import (
    add_cluster_arguments,
    cluster_from_args,
    positive_whole_number,
    whole_number,
)

#: κ of the background clipping and the detection threshold in σ, as in the lesson.
KAPPA = 3.0
NSIGMA = 5.0
DEFAULT_SIZE = 8192
MAX_CHUNK = 2048
#: Longest side of the preview's full field, in pixels of the image (larger images are
#: max-pooled), and the side of its cutout at native resolution.
PREVIEW = 1024
CUTOUT = 256
#: Tolerances of the comparison with the CPU reference: NumPy's std of float32 data accumulates
#: in float32; centres of mass and sums are float64 on both sides.
STD_RTOL = {"float32": 1e-5}
CENTROID_ATOL = 1e-6
FLUX_RTOL = 1e-9


#: What the demo writes, for ``--help`` and the README (each line at most 100 columns).
OUTPUTS = """\
outputs, in --out:
  catalogue.csv  one row per detection, in label order:
                   id           its label in the label image (1..n)
                   x, y         its centre of mass (pixel values as weights): column and row, in
                                pixels from 0 at the centre of the first pixel
                   flux         the sum of its pixel values (the lesson's sum_labels), in image
                                units times pixels (Jy/beam x pixels for a radio image)
                   area         its number of pixels
                   peak         its largest pixel value
                   x_min y_min  its bounding box: first column and row,
                   x_max y_max  last column and row + 1
                 and for the synthetic sky:
                   injected     id of the injected source it belongs to (0: none), the nearest
                                relative to its reach, max(3 px, 3 sigma_major)
                   fragment     1 when a brighter detection belongs to the same injected source
  injected.csv   the synthetic sky's sources, one row each:
                   id           from 1
                   x, y         its centre: column and row, in pixels
                   flux         the integral of its profile; peak: its peak value
                   snr          peak over the noise's sigma (sources below 5 are rarely found)
                   sigma_major  its width in pixels along its major and minor axes (the PSF's,
                   sigma_minor  1.5, for point sources)
                   angle        of its major axis, from x towards y, in radians
                   extended     1: an elliptical Gaussian; 0: a point source (the PSF's shape)
                   recovered    1: a detection lies within max(3 px, 2 sigma_major) of it
                   detections   how many detections belong to it (more than 1: fragments)
  preview.png    the full field (max-pooled) and its detection density, a cutout at native
                 resolution with the detections' outlines and the injected sources marked, and
                 the pixel histogram with the clipping window and the threshold

More detections than injected sources: a detection is a connected region above the threshold,
and an extended source whose surface brightness is near the threshold breaks into several
such regions (noise lifts some of its pixels above it and drops others below); each counts.
The summary says how many detections are such fragments (a brighter detection belongs to the
same injected source), and how many belong to no injected source. Faint sources (S/N < 5)
mostly stay undetected, and sources closer than their widths merge into one detection."""


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = ("Find the sources of an image, the GPU lesson's four steps (κ-σ "
                          "clipping, a 5 σ\nthreshold, labelling, measurements), chunked on a "
                          "local cluster, and validate them\nagainst the lesson's CPU code.")
    parser.epilog = OUTPUTS
    parser.add_argument("image", nargs="?", metavar="IMAGE", type=_image_path,
                        help="FITS, TIFF, Zarr or .npy image, 2-D once axes of length 1 are "
                             "dropped (a radio image's (1, 1, N, N) is fine; default: a "
                             "synthetic sky)")
    parser.add_argument("--size", type=positive_whole_number, metavar="N",
                        help=f"side of the synthetic sky in pixels (default {DEFAULT_SIZE})")
    parser.add_argument("--chunks", type=positive_whole_number, metavar="N",
                        help=f"chunk side in pixels (default: half the image side, at most "
                             f"{MAX_CHUNK})")
    parser.add_argument("--seed", type=whole_number, default=0, metavar="S",
                        help="seed of the synthetic sky (default 0)")
    parser.add_argument("--out", default="chunkernels-demo", metavar="DIR",
                        help="folder for catalogue.csv, injected.csv (a synthetic sky's sources) and "
                             "preview.png (default ./chunkernels-demo)")
    parser.add_argument("--no-validate", dest="validate", action="store_false",
                        help="skip the validation against the lesson's CPU code (on by default; "
                             "on a big image it takes longer than everything else)")
    add_cluster_arguments(parser)
    _describe_gpus_default(parser)


def _describe_gpus_default(parser) -> None:
    """The demo's own default for ``--gpus``: it starts a GPU cluster where there are GPUs
    (``add_cluster_arguments`` describes the other commands', Dask's threads)."""
    action = parser._option_string_actions["--gpus"]
    action.help = ("run on a local Dask cluster of N GPU workers (0: CPU workers); default: a "
                   "LocalCUDACluster of every GPU when there are GPUs, else Dask's threads in "
                   "this process")


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
    if args.image is not None and args.size is not None:
        return _usage_error("--size sets the side of the synthetic sky; an IMAGE has its own")
    missing = [name for name in ("matplotlib", "tqdm") if importlib.util.find_spec(name) is None]
    if missing:
        return _usage_error(f"needs {' and '.join(missing)}, not installed here: "
                            f"pip install 'chunkernels[demo]'")
    if args.gpus is None and args.scheduler is None and cuda.gpu_count() > 0:
        args.gpus = cuda.gpu_count()  # GPUs here: a LocalCUDACluster, one worker per GPU
    from chunkernels._registry import registered

    registered()  # import the kernels now, not inside the first timed step
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


class _Progress:
    """Steps run one after the other, timed, with their progress on stderr: a bar on a terminal,
    and where stderr is not one (``make demo | tee log``, CI; tqdm would hide itself there) a
    line when each step starts and one when it ends."""

    def __init__(self, title: str, total: int):
        self.title, self.total, self.count = title, total, 0
        self.times: dict[str, float] = {}
        self.bar = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="step", file=sys.stderr,
                            bar_format="{desc:<44}{bar:24}{n_fmt}/{total_fmt} [{elapsed}]")

    @contextlib.contextmanager
    def __call__(self, name):
        where = f"{self.title} [{self.count + 1}/{self.total}] {name}"
        if self.bar is not None:
            self.bar.set_description_str(f"{self.title}: {name}")
        else:
            print(f"{where} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        yield
        self.times[name] = time.perf_counter() - start
        self.count += 1
        if self.bar is not None:
            self.bar.update()
        else:
            print(f"{where}: {self.times[name]:.2f} s", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


#: The steps of the pipeline: what the demo's GPU time is.
PIPELINE = ("κσ clipping", "threshold + label", "measure")


@dataclass
class _Found:
    """What the pipeline found."""

    image: object  # the Dask array
    background: object  # ClipResult
    level: float
    count: int
    labels: object  # the Dask label image
    table: dict  # the catalogue, NumPy columns


def _pipeline(args, client) -> int:
    from chunkernels.sources import read_image, synthetic_sky

    gpu_names = _gpu_names(client)
    gpu = bool(gpu_names)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    synthetic = args.image is None
    steps = _Progress("demo", total=len(PIPELINE) + 1 + int(gpu))
    size = args.size or DEFAULT_SIZE
    chunk = args.chunks or (_default_chunk((size, size)) if synthetic else None)
    try:
        if gpu:
            with steps(WARM_UP):
                warm_up(client, chunk=chunk, size=size if synthetic else None)
        if synthetic:
            with steps("synthetic sky"):
                image, truth = synthetic_sky(size, chunks=chunk, seed=args.seed, gpu=gpu)
                image = _place(image, client)
            source = f"synthetic sky {size}x{size} (seed {args.seed}, {len(truth['id'])} sources)"
        else:
            with steps("read image"):
                image = _open(args.image, args.chunks, gpu, read_image)
                image = _place(image, client)
            truth, source = None, str(args.image)
        found = _find(image, client, steps)
    finally:
        steps.close()
    data = labels = checks = None
    validation = {}
    if args.validate:
        data, labels, checks, validation = _validate(found)
    recovery = None
    times = steps.times
    steps = _Progress("outputs", total=2 if synthetic else 1)
    try:
        if synthetic:
            with steps("recovery"):
                recovery = _recovery(truth, found.table)
        with steps("write"):
            if data is None:
                data = cuda.to_host(image.compute())
            written = _write(out, found, data, labels, truth, recovery)
    finally:
        steps.close()
    if gpu:
        where = f"{len(gpu_names)} GPU worker(s): {', '.join(sorted(set(gpu_names)))}"
    else:
        where = "CPU, " + ("Dask workers" if client is not None else "Dask's threads")
    _summary(source, found, where, gpu, {**times, **steps.times}, validation, checks, recovery,
             written)
    return 0 if checks is None or all(ok for _, ok, _ in checks) else 1


#: The step that readies the GPU kernels before the pipeline runs (:func:`warm_up`).
WARM_UP = "kernels ready (compiled or cached)"
#: The side of the sky :func:`warm_up` runs the pipeline on when the run's chunks are not known.
WARM_UP_SIZE = 256
#: The largest chunk side :func:`warm_up` copies from the run (larger chunks: blocks this wide).
WARM_UP_CHUNK_MAX = 4096
#: The largest sky :func:`warm_up` makes to match the run's size (a side, in pixels).
WARM_UP_SIZE_MAX = 8192
#: The most blocks per axis :func:`warm_up` copies from the run's grid of blocks.
WARM_UP_GRID_MAX = 16


def warm_up(client, chunk=None, size=None) -> None:
    """Ready every kernel the pipeline runs on GPUs, on every worker at once, before any timed
    step: the pipeline runs on a small synthetic sky spread over the workers (``client``; None:
    this process's GPU under Dask's threads), so each worker compiles what the real run will
    launch (NVRTC, or CuPy's kernel cache on disk once any process of the machine has compiled
    it), for the same dtypes and the same graph shapes. A fresh install's first run then spends
    its compile time here, in parallel over the workers, and the pipeline's own steps compile
    nothing.

    ``chunk``, the side of the run's chunks, makes the warm-up's blocks that size (up to
    :data:`WARM_UP_CHUNK_MAX`), and ``size``, the side of the run's image, makes the warm-up's
    sky as large, up to :data:`WARM_UP_SIZE_MAX` (at least 2x2 blocks): kernels specialised on
    what a block holds, and what a worker first does at the run's scale (its memory pool grown,
    its merges of as many blocks and faces), are then done here, not in the first run (on two
    GPUs, a warm-up of 2x2 blocks left the first 8192² run 4.9x slower than the next). Where
    that sky has fewer blocks per axis than the run, the pipeline runs once more on a sky of
    the run's grid of blocks (up to :data:`WARM_UP_GRID_MAX` per axis, at most
    :data:`WARM_UP_SIZE_MAX` wide, so in smaller blocks): a worker's steps that join the pieces
    of many blocks take other code past a few of them (CuPy's ``concatenate`` of more than 8
    arrays launches a kernel of its own, compiled on first use: on one H100 the first 32768²
    run in 8x8 blocks compiled four, 400 ms, after a warm-up of 2x2). On several workers the
    clipping runs once more with its passes batched and once without
    (:func:`chunkernels.sources._clip_cluster.fusing`): each call takes one of the two by its
    first trip's time. Without ``chunk``, the sky is :data:`WARM_UP_SIZE` pixels wide."""
    from chunkernels.cluster import worker_count
    from chunkernels.sources import _clip_cluster, kappa_sigma_clip, synthetic_sky

    workers = 1 if client is None else max(1, worker_count(client))
    side = math.isqrt(workers - 1) + 1  # blocks per axis: at least one block per worker,
    blocks = max(2, side)  # and at least 2x2, so that the label merges across chunk faces
    if chunk is None:
        skies = [(WARM_UP_SIZE, -(-WARM_UP_SIZE // blocks))]
    else:
        grid = min(-(-int(size or 0) // max(1, int(chunk))), WARM_UP_GRID_MAX)
        chunk = max(1, min(int(chunk), WARM_UP_CHUNK_MAX))
        size = max(blocks * chunk, min(int(size or 0), WARM_UP_SIZE_MAX))
        skies = [(size, chunk)]
        if grid > -(-size // chunk):
            small = WARM_UP_SIZE_MAX // grid
            skies.append((grid * small, small))
    for size, chunk in skies:
        image, _ = synthetic_sky(size, chunks=chunk, seed=0, gpu=True)
        image = _place(image, client)
        _find(image, client, lambda name: contextlib.nullcontext())
        if workers > 1:  # the clipping's other path too (it batches passes or not per call)
            for fuse in (True, False):
                with _clip_cluster.fusing(fuse):
                    kappa_sigma_clip(image, KAPPA)


def _find(image, client, steps) -> _Found:
    """The pipeline: κσ clipping, threshold + label, measure, each a timed step. On Dask the
    labelling and the measurements go out as one graph: the label step ends when the count is
    back, the measure step when the catalogue is."""
    from chunkernels.ndimage import label, measure
    from chunkernels.sources import kappa_sigma_clip, threshold
    from chunkernels.sources._detect import CATALOGUE

    clipping, labelling, measuring = PIPELINE
    with steps(clipping):
        background = kappa_sigma_clip(image, KAPPA)
    level = float(background.median) + NSIGMA * background.std
    with steps(labelling):
        labels, count = label(threshold(image, np.float64(level)))
        table = measure(image, labels, properties=CATALOGUE, as_frame=False)
        if hasattr(count, "compute"):
            # one graph for the three: computed apart, the labels' persist (whose optimisation
            # fuses the threshold into the labelling) and the count's compute would send the
            # scheduler one key with two definitions, and the measurements would wait for a
            # round trip of their own. The table's task copies it to the host there.
            labels, count, table = _persist((labels, count, table.to_delayed(host=True)),
                                            client)
            count = _held_value(count, client)
        count = int(cuda.to_host(count))
    with steps(measuring):  # on Dask: the rest of the time until the table is back
        if hasattr(table, "compute"):
            table = _held_value(table, client)
        table = {k: cuda.to_host(v) for k, v in table.items()}
    return _Found(image, background, level, count, labels, table)


def _validate(found):
    """The lesson's CPU code on the same image, compared with what the pipeline found:
    ``(data, labels, checks, times)``, the image and the label image on the host."""
    from chunkernels.sources.lesson import find_sources_cpu

    steps = _Progress("validation", total=6)
    try:
        with steps("image and labels to the host"):
            data = cuda.to_host(found.image.compute())
            labels = cuda.to_host(found.labels.compute())
        reference = find_sources_cpu(data, KAPPA, NSIGMA, progress=steps)
        with steps("compare"):
            checks = _compare(found.background, found.level, found.count, labels, found.table,
                              data, reference)
    finally:
        steps.close()
    return data, labels, checks, steps.times


def _default_chunk(shape) -> int:
    return min(MAX_CHUNK, max(1, max(shape) // 2))


def _open(path, chunk, gpu, read_image):
    from chunkernels.kernels.kappa_sigma_clip import check_dtype

    image = read_image(path)
    if image.ndim != 2:
        raise _InputError(
            f"{path} holds an array of shape {image.shape} (axes of length 1 dropped); the demo "
            f"finds sources in 2-D images (a radio image's (1, 1, N, N) cube is fine): save one "
            f"plane of it, e.g. numpy.save('plane.npy', cube[0, 0])")
    if 0 in image.shape:
        raise _InputError(f"{path} holds an empty image, of shape {image.shape}: no pixels to "
                          f"find sources in; give an image of at least one pixel")
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


def _place(image, client):
    """The image in memory: on a cluster, made on its workers in contiguous tiles of chunks
    (each chunk computed where it will stay, :func:`chunkernels.cluster.distribute`), else
    persisted by Dask's local scheduler."""
    if client is None:
        return _persist(image, None)
    from chunkernels.cluster import distribute

    return distribute(image, client)


def _persist(x, client):
    """``x`` (a Dask collection, or a tuple of them persisted together) in memory; with a
    client, once the workers hold it."""
    import dask

    persisted = dask.persist(*x) if isinstance(x, tuple) else (x.persist(),)
    if client is not None:
        from distributed import wait

        wait(list(persisted))
    return persisted if isinstance(x, tuple) else persisted[0]


def _held_value(x, client):
    """The single block of the persisted Dask array ``x`` (or the value of a persisted
    ``dask.delayed``): on a cluster, fetched from the worker that holds it (``x.compute()``
    would send the scheduler a graph and run a task: 10 ms on a GPU worker, against the 3 ms of
    the label itself), else computed."""
    if client is None:
        return x.compute()
    from distributed import futures_of

    (future,) = futures_of(x)
    return future.result()


def _gpu_names(client) -> list[str]:
    """The GPUs of the cluster's workers; none without a cluster (Dask's threads, NumPy chunks:
    with GPUs present and no option given, ``run`` starts a GPU cluster)."""
    from chunkernels.cluster import gpu_names

    return [] if client is None else gpu_names(client)


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


# -- recovery of the injected sources, and the fragments ------------------------------------------

@dataclass
class _Recovery:
    bright: tuple[int, int]  # recovered, injected with peak S/N >= 10
    faint: tuple[int, int]  # recovered, injected with 5 <= S/N < 10
    offset: float  # median distance of recovered bright point sources, pixels
    recovered: np.ndarray  # per injected source
    detections: np.ndarray  # per injected source: how many detections belong to it
    owner: np.ndarray  # per detection: the id of the injected source it belongs to, 0: none
    fragment: np.ndarray  # per detection: a brighter detection belongs to the same source
    fragments_of_extended: int  # fragments whose source is extended

    @property
    def matched(self) -> int:
        """Detections that are the brightest of their injected source."""
        return int(((self.owner > 0) & ~self.fragment).sum())

    @property
    def fragments(self) -> int:
        return int(self.fragment.sum())

    @property
    def unmatched(self) -> int:
        """Detections that belong to no injected source."""
        return int((self.owner == 0).sum())


def _recovery(truth, table) -> _Recovery:
    """Which injected sources were found, and which injected source each detection belongs to.

    An injected source is *recovered* when a detection lies within max(3 px, 2 σ_major) of it.
    A detection *belongs* to the injected source within whose reach, max(3 px, 3 σ_major), it
    lies, the nearest relative to that reach where there are several, and to none when there is
    none (a noise peak, or a piece of a source's wing farther out). Of the detections that
    belong to one source the brightest (largest flux) is its detection; the others are its
    *fragments*: an extended source near the threshold breaks up into several regions above it.
    """
    from scipy.spatial import cKDTree

    injected = np.column_stack([truth["x"], truth["y"]])
    radius = np.maximum(3.0, 2.0 * truth["sigma_major"])
    reach = np.maximum(3.0, 3.0 * truth["sigma_major"])
    found = np.column_stack([table["center_of_mass-1"], table["center_of_mass-0"]])
    owner = np.zeros(len(found), dtype=np.int64)
    if len(found):
        distance, _ = cKDTree(found).query(injected)
        near = cKDTree(injected).query_ball_point(found, r=float(reach.max()))
        for i, (f, candidates) in enumerate(zip(found, near)):
            if candidates:
                candidates = np.asarray(candidates)
                relative = np.hypot(*(injected[candidates] - f).T) / reach[candidates]
                if relative.min() <= 1.0:
                    owner[i] = truth["id"][candidates[np.argmin(relative)]]
    else:
        distance = np.full(len(injected), np.inf)
    # the brightest detection of each source is its own; the others are fragments
    flux = np.asarray(table["sum"], dtype=np.float64)
    by_source = np.lexsort((-flux, owner))
    first = np.ones(len(found), dtype=bool)
    first[1:] = owner[by_source][1:] != owner[by_source][:-1]
    fragment = np.zeros(len(found), dtype=bool)
    fragment[by_source] = ~first & (owner[by_source] > 0)
    index = {int(i): k for k, i in enumerate(truth["id"])}
    detections = np.zeros(len(injected), dtype=np.int64)
    for source in owner[owner > 0]:
        detections[index[int(source)]] += 1
    extended = np.array([truth["extended"][index[int(s)]] for s in owner[fragment]], dtype=bool)
    recovered = distance <= radius
    snr = truth["snr"]
    bright, faint = snr >= 10, (snr >= 5) & (snr < 10)
    point = bright & recovered & ~truth["extended"]
    offset = float(np.median(distance[point])) if point.any() else math.nan
    return _Recovery((int(recovered[bright].sum()), int(bright.sum())),
                     (int(recovered[faint].sum()), int(faint.sum())), offset, recovered,
                     detections, owner, fragment, int(extended.sum()))


# -- outputs ----------------------------------------------------------------------------------------

CSV_COLUMNS = ("id", "x", "y", "flux", "area", "peak", "x_min", "y_min", "x_max", "y_max")
INJECTED_COLUMNS = ("id", "x", "y", "flux", "peak", "snr", "sigma_major", "sigma_minor", "angle",
                    "extended")


def _write(out, found, data, labels, truth, recovery) -> list[Path]:
    table = found.table
    catalogue = out / "catalogue.csv"
    header = CSV_COLUMNS
    columns = [table["label"], table["center_of_mass-1"], table["center_of_mass-0"],
               table["sum"], table["area"], table["max"], table["bbox-1"], table["bbox-0"],
               table["bbox-3"], table["bbox-2"]]
    if recovery is not None:
        header += ("injected", "fragment")
        columns += [recovery.owner, recovery.fragment]
    _write_csv(catalogue, header, columns)
    written = [catalogue]
    if truth is not None:
        injected = out / "injected.csv"
        _write_csv(injected, (*INJECTED_COLUMNS, "recovered", "detections"),
                   [truth[k] for k in INJECTED_COLUMNS] + [recovery.recovered,
                                                           recovery.detections])
        written.append(injected)
    preview = out / "preview.png"
    _preview(preview, data, labels, found, truth, recovery)
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


def _preview(path, data, labels, found, truth, recovery):
    """The preview: the full field (max-pooled to at most PREVIEW pixels a side) with the cutout
    marked, the detection density over the field, the cutout at native resolution with the
    detections' outlines (contours of the label image) and the injected sources, and the pixel
    histogram with the κσ window and the threshold. ``labels`` is the label image on the host,
    or None (then only the cutout's labels are computed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table, background = found.table, found.background
    x = np.asarray(table["center_of_mass-1"], dtype=np.float64)
    y = np.asarray(table["center_of_mass-0"], dtype=np.float64)
    median = float(background.median)
    sigma = background.std if math.isfinite(background.std) and background.std > 0 else None
    fig = Figure(figsize=(13, 11.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    (full, density), (zoom, histogram) = fig.subplots(2, 2)
    side = tuple(min(CUTOUT, n) for n in data.shape)
    corner = _cutout_corner(x, y, data.shape, side)
    cut = tuple(slice(c, c + s) for c, s in zip(corner, side))
    norm = _stretch(data, median, sigma)
    _full_field(fig, full, data, norm, median, sigma, corner, side)
    _density(fig, density, x, y, data.shape, corner, side)
    cut_labels = labels[cut] if labels is not None else cuda.to_host(found.labels[cut].compute())
    _cutout(zoom, data[cut], cut_labels, corner, norm, found.table, truth, recovery)
    _histogram(histogram, data, background, found.level, sigma)
    fig.suptitle(f"{found.count} sources above median + {NSIGMA:g} σ = {found.level:.4g} "
                 f"(background: median {median:.4g}, σ {background.std:.4g}, by κσ clipping, "
                 f"κ = {KAPPA:g})", fontsize=12)
    fig.savefig(path)


def _stretch(data, median, sigma):
    """An asinh stretch: linear within a few σ of the background, logarithmic above (sources
    thousands of σ bright stay visible next to the noise)."""
    from matplotlib.colors import AsinhNorm

    top = float(np.nanmax(data)) if data.size else 1.0
    if sigma is None or not math.isfinite(top) or not math.isfinite(median):
        finite = data[np.isfinite(data)]
        low, top = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        return AsinhNorm(linear_width=max((top - low) / 100, 1e-300), vmin=low,
                         vmax=max(top, low + 1e-300))
    return AsinhNorm(linear_width=2 * sigma, vmin=median - 3 * sigma,
                     vmax=max(top, median + 10 * sigma))


def _full_field(fig, ax, data, norm, median, sigma, corner, side):
    from matplotlib.patches import Rectangle

    factor = max(1, math.ceil(max(data.shape) / PREVIEW))
    rows, cols = (n // factor * factor for n in data.shape)
    small = data[:rows, :cols].reshape(rows // factor, factor, cols // factor, factor).max(
        axis=(1, 3)) if factor > 1 else data
    shown = ax.imshow(small, cmap="gray_r", origin="lower", norm=norm, interpolation="nearest",
                      extent=(-0.5, small.shape[1] * factor - 0.5, -0.5,
                              small.shape[0] * factor - 0.5))
    bar = fig.colorbar(shown, ax=ax, shrink=0.85)
    if sigma is None:
        bar.set_label("pixel value (asinh stretch)")
    else:  # in σ from the median: what the threshold and the clipping speak in
        steps = [k for k in (-2, 0, 5, 20, 100, 1000, 10000) if median + k * sigma <= norm.vmax]
        bar.set_ticks([median + k * sigma for k in steps],
                      labels=["median" if k == 0 else f"{k:+d} σ" for k in steps])
        bar.set_label("pixel value, from the background median (asinh stretch)")
    ax.add_patch(Rectangle((corner[1] - 0.5, corner[0] - 0.5), side[1], side[0], fill=False,
                           edgecolor="tab:cyan", linewidth=1.5, label="cutout below"))
    ax.legend(loc="upper right", fontsize=9)
    ax.set_title(f"full field, {data.shape[1]}×{data.shape[0]} px"
                 + (f", max of each {factor}×{factor} px" if factor > 1 else ""), fontsize=11)
    ax.set_xlabel("x (pixels)")
    ax.set_ylabel("y (pixels)")


def _density(fig, ax, x, y, shape, corner, side):
    import matplotlib
    from matplotlib.patches import Rectangle

    cell = max(8, math.ceil(max(shape) / 64))
    edges = [np.arange(0, n + cell, cell) - 0.5 for n in shape]
    counts, _, _ = np.histogram2d(y, x, bins=edges)
    colours = matplotlib.colormaps["magma_r"].with_extremes(bad="white")
    shown = ax.imshow(np.ma.masked_equal(counts, 0), cmap=colours, origin="lower",
                      interpolation="nearest",
                      extent=(edges[1][0], edges[1][-1], edges[0][0], edges[0][-1]),
                      vmin=1, vmax=max(2, counts.max()))
    fig.colorbar(shown, ax=ax, shrink=0.85, label=f"detections per {cell}×{cell} px (white: none)")
    ax.add_patch(Rectangle((corner[1] - 0.5, corner[0] - 0.5), side[1], side[0], fill=False,
                           edgecolor="tab:cyan", linewidth=1.5))
    ax.set_xlim(-0.5, shape[1] - 0.5)
    ax.set_ylim(-0.5, shape[0] - 0.5)
    ax.set_title(f"detection density: {len(x)} detections", fontsize=11)
    ax.set_xlabel("x (pixels)")
    ax.set_ylabel("y (pixels)")


def _cutout_corner(x, y, shape, side):
    """The corner (row, column) of the ``side`` window holding the most detections."""
    if len(x) == 0:
        return tuple((n - s) // 2 for n, s in zip(shape, side))
    step = tuple(max(1, s // 4) for s in side)
    grid = tuple(-(-n // s) for n, s in zip(shape, step))
    counts = np.zeros(grid)
    np.add.at(counts, (np.clip((y + 0.5) // step[0], 0, grid[0] - 1).astype(int),
                       np.clip((x + 0.5) // step[1], 0, grid[1] - 1).astype(int)), 1)
    span = tuple(min(4, g) for g in grid)
    total = np.pad(counts, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    windows = (total[span[0]:, span[1]:] - total[:-span[0], span[1]:]
               - total[span[0]:, :-span[1]] + total[:-span[0], :-span[1]])
    r, c = np.unravel_index(np.argmax(windows), windows.shape)
    return (min(r * step[0], shape[0] - side[0]), min(c * step[1], shape[1] - side[1]))


#: How the cutout draws each kind of detection: outline colour and legend text.
_KINDS = (("tab:red", "detection (of an injected source)"),
          ("darkorange", "fragment (a brighter detection has its source)"),
          ("magenta", "detection of no injected source"))


def _cutout(ax, image, labels, corner, norm, table, truth, recovery):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Ellipse

    (r0, c0), (rows, cols) = corner, image.shape
    extent = (c0 - 0.5, c0 + cols - 0.5, r0 - 0.5, r0 + rows - 0.5)
    ax.imshow(image, cmap="gray_r", origin="lower", norm=norm, interpolation="nearest",
              extent=extent)
    # outlines along the pixels' edges: the masks upsampled 4 times, contoured half way
    up = 4
    xs = c0 - 0.5 + (np.arange(cols * up) + 0.5) / up
    ys = r0 - 0.5 + (np.arange(rows * up) + 0.5) / up
    handles = []
    if recovery is None:
        kinds = [(labels > 0, "tab:red", "detection: outline, centre of mass")]
    else:  # each label's kind, by its label - 1
        kind = np.where(recovery.owner == 0, 2, np.where(recovery.fragment, 1, 0))
        # no detection (a sky too small for its sources): no pixel has a kind
        of_pixel = (np.where(labels > 0, kind[np.maximum(labels, 1) - 1], -1) if kind.size
                    else np.full(labels.shape, -1))
        kinds = [(of_pixel == k, colour, text) for k, (colour, text) in enumerate(_KINDS)]
    # and a dot at each centre of mass: a detection of a pixel or two has a tiny outline
    cx = np.asarray(table["center_of_mass-1"], dtype=np.float64)
    cy = np.asarray(table["center_of_mass-0"], dtype=np.float64)
    for k, (mask, colour, text) in enumerate(kinds):
        if mask.any():
            fine = np.repeat(np.repeat(mask, up, axis=0), up, axis=1).astype(np.float32)
            ax.contour(xs, ys, fine, levels=[0.5], colors=colour, linewidths=1.1)
            handles.append(Line2D([], [], color=colour, linewidth=1.5, marker=".", label=text))
        ours = slice(None) if recovery is None else kind == k
        ax.scatter(cx[ours], cy[ours], s=10, color=colour, zorder=3)
    if truth is not None:
        inside = ((truth["x"] >= c0 - 0.5) & (truth["x"] < c0 + cols - 0.5)
                  & (truth["y"] >= r0 - 0.5) & (truth["y"] < r0 + rows - 0.5))
        bright = inside & (truth["snr"] >= NSIGMA)
        found, missed = bright & recovery.recovered, bright & ~recovery.recovered
        faint = inside & (truth["snr"] < NSIGMA)
        ax.scatter(truth["x"][found], truth["y"][found], marker="+", s=70, color="tab:blue",
                   linewidths=1.3)
        ax.scatter(truth["x"][missed], truth["y"][missed], marker="x", s=60,
                   color="tab:green", linewidths=1.5)
        ax.scatter(truth["x"][faint], truth["y"][faint], marker=".", s=25, color="tab:gray")
        for s in np.flatnonzero(inside & truth["extended"]):
            ax.add_patch(Ellipse((truth["x"][s], truth["y"][s]), 4 * truth["sigma_major"][s],
                                 4 * truth["sigma_minor"][s],
                                 angle=math.degrees(truth["angle"][s]), fill=False,
                                 edgecolor="tab:blue", linestyle="--", linewidth=0.9))
        handles += [
            Line2D([], [], marker="+", linestyle="", color="tab:blue", markersize=9,
                   label=f"injected, S/N ≥ {NSIGMA:g}, recovered"),
            Line2D([], [], marker="x", linestyle="", color="tab:green", markersize=8,
                   label=f"injected, S/N ≥ {NSIGMA:g}, missed"),
            Line2D([], [], marker=".", linestyle="", color="tab:gray",
                   label=f"injected, S/N < {NSIGMA:g}"),
            Line2D([], [], color="tab:blue", linestyle="--",
                   label="extended source, 2 σ ellipse"),
        ]
    ax.set_xlim(extent[:2])
    ax.set_ylim(extent[2:])  # the dots outside the cutout stay out of sight
    if handles:  # below the cutout: none of it hidden
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2,
                  fontsize=8.5, frameon=False)
    ax.set_title(f"cutout at native resolution: x {c0}–{c0 + cols}, y {r0}–{r0 + rows}",
                 fontsize=11)
    ax.set_xlabel("x (pixels)")
    ax.set_ylabel("y (pixels)")


def _histogram(ax, data, background, level, sigma):
    """Pixel counts against value, in σ of the clipped background from its median."""
    median = float(background.median)
    finite = data[np.isfinite(data)] if data.dtype.kind == "f" else data
    if sigma is None or not math.isfinite(median) or finite.size == 0:
        ax.hist(finite.ravel(), bins=200, log=True, color="0.4")
        ax.set_title("pixel values (the clipping kept nothing)", fontsize=11)
        return
    top = max(20.0, NSIGMA + 10.0)
    z_edges = np.linspace(-8.0, top, 281)
    counts, _ = np.histogram(finite, bins=median + sigma * z_edges)
    above = int(np.count_nonzero(finite > median + sigma * top))
    centres = (z_edges[1:] + z_edges[:-1]) / 2
    ax.step(centres, np.maximum(counts, 0.5), where="mid", color="0.25", linewidth=1,
            label=f"pixels ({above} beyond {top:g} σ, off the axis)")
    width = z_edges[1] - z_edges[0]
    gauss = background.count * width * np.exp(-0.5 * centres**2) / math.sqrt(2 * math.pi)
    ax.plot(centres, gauss, "--", color="tab:blue", linewidth=1,
            label=f"Gaussian of the clipped σ, {background.count} pixels")
    lower, upper = ((background.lower - median) / sigma, (background.upper - median) / sigma)
    ax.axvspan(max(lower, z_edges[0]), min(upper, top), color="tab:green", alpha=0.15,
               label=f"kept by κσ clipping: {background.count / max(finite.size, 1):.1%} "
                     f"of the pixels")
    threshold = (level - median) / sigma
    ax.axvline(threshold, color="tab:red", linewidth=1.5,
               label=f"threshold: median + {NSIGMA:g} σ = {level:.4g}")
    ax.set_yscale("log")
    ax.set_ylim(0.5, 50 * max(counts.max(), gauss.max(), 1))  # room for the legend
    ax.set_xlim(z_edges[0], top)
    ax.legend(loc="upper right", fontsize=8.5)
    ax.set_title(f"pixel histogram (median {median:.4g}, σ {sigma:.4g})", fontsize=11)
    ax.set_xlabel("(pixel value − median) / σ")
    ax.set_ylabel("pixels")


# -- the summary ------------------------------------------------------------------------------------

def _summary(source, found, where, gpu, times, validation, checks, recovery, written):
    image = found.image
    chunks = image.numblocks[0] * image.numblocks[1]
    background = found.background
    print(f"image:   {source}, {image.dtype}, {chunks} chunk(s) of up to "
          f"{image.chunksize[0]}x{image.chunksize[1]}, on {where}")
    print(f"sources: {found.count} above median + {NSIGMA:g} σ = {found.level:.6g} "
          f"(background median {float(background.median):.6g}, σ {background.std:.6g}, "
          f"κ = {KAPPA:g})")
    print()
    names = [*times, *validation, "pipeline: κσ + threshold + label + measure"]
    width = max(len(name) for name in names)
    pipeline = sum(times[name] for name in PIPELINE)
    print(f"{'GPU' if gpu else 'CPU'} pipeline, chunked (seconds):")
    for name in PIPELINE:
        print(f"  {name:<{width}}  {times[name]:8.3f}")
    print(f"  {'pipeline: κσ + threshold + label + measure':<{width}}  {pipeline:8.3f}")
    print("around it:")
    for name, seconds in times.items():
        if name not in PIPELINE:
            print(f"  {name:<{width}}  {seconds:8.3f}")
    if validation:
        print("validation on the CPU, the lesson's code:")
        for name, seconds in validation.items():
            print(f"  {name:<{width}}  {seconds:8.3f}")
    print()
    if checks is None:
        print("validation against the lesson's CPU code: skipped (--no-validate)")
    else:
        print("validation against the lesson's CPU code on the same image:")
        width = max(len(name) for name, _, _ in checks)
        for name, ok, detail in checks:
            print(f"  {'ok  ' if ok else 'FAIL'} {name:<{width}}  {detail}")
    if recovery is not None:
        (rb, nb), (rf, nf) = recovery.bright, recovery.faint
        print()
        offset = ("none recovered" if np.isnan(recovery.offset)
                  else f"{recovery.offset:.2f} px")
        print(f"recovery of the injected sources: {rb} of {nb} with peak S/N >= 10 "
              f"({rb / max(nb, 1):.0%}), {rf} of {nf} with 5 <= S/N < 10; median offset of "
              f"bright point sources: {offset}")
        print(f"detections: {found.count} = {recovery.matched} of an injected source (the "
              f"brightest detection within its reach, max(3 px, 3 σ_major)) + "
              f"{recovery.fragments} fragments ({recovery.fragments_of_extended} of extended "
              f"sources: a brighter detection has their source) + {recovery.unmatched} of no "
              f"injected source")
    print()
    print("wrote:   " + ", ".join(os.fspath(p) for p in written))
    if checks is None:
        print("result:  not validated (--no-validate)")
        return
    passed = all(ok for _, ok, _ in checks)
    print("result:  " + ("validated: chunkernels agrees with the CPU reference" if passed else
                         "FAILED: chunkernels differs from the CPU reference (see above)"))
