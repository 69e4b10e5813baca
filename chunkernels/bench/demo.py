"""``chunkernels bench demo``: the demo's pipeline — κ-σ clipping, threshold + label, measure —
timed on the clusters asked for, side by side with what astronomers run on the CPU today,
photutils and sep, on the same image.

The image is the demo's synthetic sky (8192² float32 in 2048² chunks unless ``--size`` /
``--chunks`` say otherwise), made on the cluster's workers and persisted there. On each cluster
(``--gpus N ...``, ``--workers N ...``, ``--scheduler``; by default 1, 2, 4, ... GPUs, or 1 and 2
CPU worker processes where there is no GPU) the pipeline runs once and its results are checked
against the CPU reference on the same image — :func:`chunkernels.sources.clip_reference` (the
lesson's loop with a float64 std: the same kept pixels, median and iterations), then
``scipy.ndimage.label`` of the same segmentation and ``center_of_mass`` / ``sum_labels`` of its
labels (kept in ``--out`` under the image's SHA-256, and read back from there by a later run on
the same image: minutes on a 32768² sky) — before ``--repeat`` timed runs (the median is
reported, per step and in all). Each step ends with its result on the client (the clipping's
numbers, the labels persisted on the workers with their count, the catalogue's columns), so the
wall clock includes every round trip. One more run under distributed's task stream then says
where each step's time goes (:func:`_breakdown`): its tasks' compute time, the transfers, and
the rest.

Then, on the host copy of the same image, in this process, once each (they take seconds):

* photutils — ``astropy.stats.sigma_clipped_stats`` (σ = 3, iterated to convergence, as the
  lesson's loop), ``photutils.segmentation.detect_sources`` at median + 5 σ with 4-connectivity
  and single pixels allowed (the lesson's ``np.where`` and ``scipy.ndimage.label``), and
  ``SourceCatalog`` for the centroids;
* sep — ``sep.Background`` (a 64-pixel mesh of local backgrounds) and ``sep.extract`` at 5 times
  the global background rms, with its defaults (a 3×3 matched filter, at least 5 pixels,
  deblending).

Their catalogues are compared with chunkernels': counts, and each peer source matched to the
nearest chunkernels detection (within 1 pixel), with the offsets of the matches. Above 8192²
pixels they are left out (minutes on the CPU; the multi-GPU target's 32768² sky is timed without
them).
``docs/tutorial-sources.md`` explains where and why they differ.
"""

from __future__ import annotations

import collections
import contextlib
import math
import statistics
import time

import numpy as np

from chunkernels import cuda
from chunkernels.bench import (
    BENCH_EXTRA,
    Progress,
    array_shape,
    chunk_shapes,
    clusters,
    on_host,
    protocols,
    sweep,
)
from chunkernels.demo import PIPELINE, WARM_UP_CHUNK_MAX, WARM_UP_SIZE_MAX, warm_up

NEEDS_GPU = False
CLUSTER = True

SHAPE = (8192, 8192)
CHUNK = (2048, 2048)
SEED = 0
#: κ of the clipping and the threshold in σ, as the lesson (and the demo) have them.
KAPPA = 3.0
NSIGMA = 5.0
#: Within this distance (pixels) a peer's source and chunkernels' detection are the same one.
MATCH = 1.0
#: photutils and sep run on images of at most this many pixels (the 8192² sky takes them 20 and
#: 4 s on a 2-core CPU; a 32768² one, for the multi-GPU target, would take minutes).
PEERS_MAX_PIXELS = 8192 * 8192
STEPS = PIPELINE


def run(args) -> dict:
    """Check, then time, the demo's pipeline on each cluster; photutils and sep once."""
    shape = array_shape(args, SHAPE, np.float32)
    chunk = chunk_shapes(args, shape, [CHUNK], np.float32)[0]
    repeat = max(1, args.repeat)
    rows, data, reference = [], None, None
    with Progress(len(sweep(args)) + 3, "demo") as progress:
        for kind, workers, client in clusters(args):
            where = f"{workers} {'GPU' if kind == 'gpu' else 'CPU'} worker(s)"
            with progress.run(f"chunkernels on {where}, {shape[0]}x{shape[1]}"):
                ready = None
                if kind == "gpu":  # the demo readies its kernels first, when its cluster starts
                    start = time.perf_counter()
                    warm_up(client, chunk=max(chunk), size=max(shape))
                    ready = time.perf_counter() - start
                image = _sky(shape, chunk, kind == "gpu", client)
                (host,) = on_host(image)
                if reference is None or not np.array_equal(host, data):
                    data, reference = host, _cached_reference(host, args.out)
                found = _pipeline(image, client)  # the first run, checked
                _check(found, reference, where)
                timed = [_pipeline(image, client)["times"] for _ in range(repeat)]
                rows.append(_row(where, kind, workers, image, found, timed, ready, client))
                rows[-1]["breakdown"] = _breakdown(image, client)
                del image, found
        peers = []
        for name, peer in (("photutils", _photutils), ("sep", _sep)):
            with progress.run(f"{name} (CPU, one run)"):
                if data.size > PEERS_MAX_PIXELS:
                    side = math.isqrt(PEERS_MAX_PIXELS)
                    peers.append({"impl": name, "skipped": f"not run above {side}² pixels "
                                                           f"(minutes on the CPU)"})
                    continue
                try:
                    peers.append(peer(data))
                except ImportError as exc:
                    peers.append({"impl": name, "skipped": f"{exc.name or name} is not "
                                                           f"installed: {BENCH_EXTRA}"})
                    progress.note(f"demo: {name} skipped, {peers[-1]['skipped']}")
        with progress.run("catalogues compared"):
            ours = np.column_stack([reference["x"], reference["y"]])
            for peer in peers:
                if "skipped" not in peer:
                    peer.update(_matched(ours, np.column_stack([peer.pop("x"),
                                                                peer.pop("y")])))
    fastest = min((p["seconds"] for p in peers if "skipped" not in p), default=None)
    for row in rows:
        row["faster_than_peers"] = None if fastest is None else fastest / row["seconds"]
    report = {"benchmark": "demo", "shape": list(shape), "chunk": list(chunk),
              "dtype": "float32", "seed": SEED, "kappa": KAPPA, "nsigma": NSIGMA,
              "repeat": repeat, "sources": int(reference["count"]),
              "background": {"median": float(reference["background"].median),
                             "std": reference["background"].std,
                             "kept": reference["background"].count},
              "rows": rows, "peers": peers, "match_px": MATCH}
    if cuda.gpu_count():
        from chunkernels.bench import device_info

        report.update(device_info())
    report["markdown"] = _markdown(report)
    return report


def _sky(shape, chunk, gpu, client):
    """The demo's synthetic sky, made on the cluster's workers in contiguous tiles of chunks
    (:func:`chunkernels.cluster.distribute`) and kept there."""
    from chunkernels.cluster import distribute
    from chunkernels.sources import synthetic_sky

    image, _ = synthetic_sky(shape, chunks=chunk, seed=SEED, gpu=gpu)
    return distribute(image, client)


def _pipeline(image, client) -> dict:
    """The demo's steps (:func:`chunkernels.demo`'s own pipeline, its full catalogue measured)
    on a persisted image, each timed until its result is back (the labels and the catalogue
    from one graph: the measure step is the wait for the catalogue after the count):
    ``{"background", "level", "count", "table", "times"}``."""
    found, spans = _steps(image, client, time.perf_counter)
    return {"background": found.background, "level": found.level, "count": found.count,
            "table": found.table, "times": {name: b - a for name, (a, b) in spans.items()}}


def _steps(image, client, clock):
    """The demo's pipeline (:func:`chunkernels.demo._find`) on ``image``: ``(found, {step:
    (start, stop)})``, each step's span by ``clock``."""
    from chunkernels.demo import _find

    spans = {}

    @contextlib.contextmanager
    def timed(name):
        start = clock()
        yield
        spans[name] = (start, clock())

    return _find(image, client, timed), spans


def _breakdown(image, client) -> dict | None:
    """Where a step's time goes: one more run of the pipeline under distributed's task stream
    (after the timed ones, which run without it). Per step: its wall time, the tasks that
    started in it and their compute time over every worker and on the busiest one, the
    transfers of task results between workers and their time, and the wall time outside the
    busiest worker's tasks (the scheduler, the messages between processes, the client's own
    work). κσ clipping on a cluster runs in its workers' actors, not in tasks: all of it counts
    as outside. Timestamps are the workers' clocks against the client's: on one machine the
    same clock. None without a cluster."""
    if client is None:
        return None
    from distributed import get_task_stream

    with get_task_stream(client) as stream:  # its records carry the workers' time.time()
        _, marks = _steps(image, client, time.time)
    steps = {}
    for name, (start, stop) in marks.items():
        tasks, transfers, moving, busy = 0, 0, 0.0, collections.Counter()
        for record in stream.data:
            for span in record.get("startstops", ()):
                if not start <= span["start"] <= stop:
                    continue
                if span["action"] == "compute":
                    tasks += 1
                    busy[record.get("worker")] += span["stop"] - span["start"]
                elif span["action"] == "transfer":
                    transfers += 1
                    moving += span["stop"] - span["start"]
        busiest = max(busy.values(), default=0.0)
        steps[name] = {"wall": stop - start, "tasks": tasks, "task_time": sum(busy.values()),
                       "busiest": busiest, "transfers": transfers, "transfer_time": moving,
                       "outside": max(0.0, stop - start - busiest)}
    return steps


def _cached_reference(data, folder) -> dict:
    """:func:`_reference` of ``data``, kept in ``folder`` under the image's SHA-256 and read
    back from there when the same image comes again: the reference takes minutes on a large sky
    (about 6 on 32768²), and a benchmark run again on the same image need not repeat it. A file
    is used only for an image of the same shape and bytes."""
    import hashlib
    from pathlib import Path

    from chunkernels.sources import ClipResult

    digest = hashlib.sha256(np.ascontiguousarray(data).data).hexdigest()
    path = Path(folder) / f"demo-reference-{data.shape[0]}x{data.shape[1]}-{digest[:32]}.npz"
    if path.is_file():
        with np.load(path) as saved:
            # the median keeps the data's float type (a NumPy scalar); the rest are Python's
            background = ClipResult(**{
                f: saved[f"clip_{f}"][()] if f == "median" else saved[f"clip_{f}"].item()
                for f in ClipResult._fields})
            return {"background": background, "level": float(saved["level"]),
                    "count": int(saved["count"]), "y": saved["y"], "x": saved["x"],
                    "flux": saved["flux"]}
    reference = _reference(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path.with_suffix(".tmp.npz"),
             **{f"clip_{f}": v for f, v in reference["background"]._asdict().items()},
             **{k: reference[k] for k in ("level", "count", "y", "x", "flux")})
    path.with_suffix(".tmp.npz").replace(path)
    return reference


def _reference(data) -> dict:
    """What chunkernels must give on ``data``: the lesson's loop with a float64 std, then SciPy's
    label, center_of_mass and sum_labels at the same level."""
    from scipy import ndimage

    from chunkernels.sources import clip_reference

    background = clip_reference(data, KAPPA)
    level = float(background.median) + NSIGMA * background.std
    labels, count = ndimage.label(data > np.float64(level))
    index = np.arange(1, count + 1)
    centres = np.array(ndimage.center_of_mass(data, labels, index)).reshape(count, 2)
    return {"background": background, "level": level, "count": count, "y": centres[:, 0],
            "x": centres[:, 1], "flux": ndimage.sum_labels(data, labels, index)}


def _check(found, reference, where) -> None:
    """Raise (no timing then) unless the pipeline's results are the reference's."""
    ours, theirs = found["background"], reference["background"]
    if (ours.count, ours.median, ours.iterations) != (theirs.count, theirs.median,
                                                      theirs.iterations) or \
            not math.isclose(ours.std, theirs.std, rel_tol=1e-12):
        raise AssertionError(f"κσ clipping on {where} gave {ours}; the CPU reference (the "
                             f"lesson's loop, float64 std) gives {theirs}; not timing it")
    table = found["table"]
    if found["count"] != reference["count"] or not np.array_equal(
            table["label"], np.arange(1, reference["count"] + 1)):
        raise AssertionError(f"labelling on {where} found {found['count']} sources; "
                             f"scipy.ndimage.label of the same segmentation "
                             f"{reference['count']}; not timing it")
    centres = np.column_stack([table["center_of_mass-1"], table["center_of_mass-0"]])
    if not (np.allclose(centres, np.column_stack([reference["x"], reference["y"]]), rtol=0,
                        atol=1e-6)
            and np.allclose(table["sum"], reference["flux"], rtol=1e-9, atol=0)):
        raise AssertionError(f"the measurements on {where} differ from scipy.ndimage's "
                             f"center_of_mass / sum_labels on the same labels; not timing it")


def _row(where, kind, workers, image, found, timed, ready, client) -> dict:
    """One cluster's row: the medians of the ``timed`` runs, the first run (``found``, the
    checked one) and the warm-up before it (``ready`` seconds; None where there was none)."""
    from chunkernels.cluster import gpu_names, protocol

    steps = {name: statistics.median(t[name] for t in timed) for name in STEPS}
    total = statistics.median(sum(t.values()) for t in timed)
    return {"impl": f"chunkernels on {where}", "kind": kind, "workers": workers,
            "devices": gpu_names(client), "protocol": protocol(client),
            "blocks": image.npartitions, "seconds": total,
            "steps": steps, "first_run": sum(found["times"].values()),
            "first_steps": found["times"], "warm_up": ready, "count": found["count"],
            "kept": found["background"].count, "iterations": found["background"].iterations}


def _photutils(data) -> dict:
    from astropy.stats import sigma_clipped_stats
    from photutils.segmentation import SourceCatalog, detect_sources

    steps = {}
    start = time.perf_counter()
    _, median, std = sigma_clipped_stats(data, sigma=KAPPA, maxiters=None)
    steps["sigma_clipped_stats"] = time.perf_counter() - start
    mark = time.perf_counter()
    segments = detect_sources(data, median + NSIGMA * std, n_pixels=1, connectivity=4)
    steps["detect_sources"] = time.perf_counter() - mark
    mark = time.perf_counter()
    if segments is None:  # nothing above the threshold
        x = y = np.zeros(0)
    else:
        catalogue = SourceCatalog(data, segments)
        # photutils 3 renamed xcentroid to x_centroid
        renamed = hasattr(type(catalogue), "x_centroid")
        x = np.asarray(catalogue.x_centroid if renamed else catalogue.xcentroid)
        y = np.asarray(catalogue.y_centroid if renamed else catalogue.ycentroid)
    steps["SourceCatalog centroids"] = time.perf_counter() - mark
    return {"impl": "photutils", "seconds": time.perf_counter() - start, "steps": steps,
            "count": len(x), "median": float(median), "std": float(std), "x": x, "y": y}


def _sep(data) -> dict:
    import sep

    data = np.ascontiguousarray(data)
    # room for every pixel above the threshold of a crowded image (the default, 300000,
    # overflows on the 8192² sky)
    sep.set_extract_pixstack(max(300_000, data.size // 8))
    steps = {}
    start = time.perf_counter()
    background = sep.Background(data)
    subtracted = data - background
    steps["Background"] = time.perf_counter() - start
    mark = time.perf_counter()
    objects = sep.extract(subtracted, NSIGMA, err=background.globalrms)
    steps["extract"] = time.perf_counter() - mark
    return {"impl": "sep", "seconds": time.perf_counter() - start, "steps": steps,
            "count": len(objects), "rms": float(background.globalrms),
            "x": np.asarray(objects["x"]), "y": np.asarray(objects["y"])}


def _matched(ours, theirs) -> dict:
    """How a peer's catalogue ``theirs`` matches chunkernels' ``ours`` (both ``(n, 2)`` x, y):
    each of its sources to the nearest of ours, a match within :data:`MATCH` pixels."""
    from scipy.spatial import cKDTree

    if len(theirs) == 0 or len(ours) == 0:
        return {"matched": 0, "theirs_unmatched": len(theirs), "ours_unmatched": len(ours),
                "offset_median": None, "offset_p95": None}
    distance, nearest = cKDTree(ours).query(theirs)
    close = distance <= MATCH
    offsets = distance[close]
    return {"matched": int(close.sum()), "theirs_unmatched": int((~close).sum()),
            "ours_unmatched": int(len(ours) - np.unique(nearest[close]).size),
            "offset_median": float(np.median(offsets)) if offsets.size else None,
            "offset_p95": float(np.percentile(offsets, 95)) if offsets.size else None}


def _markdown(r) -> str:
    device = f" on {r['device']} ({r['date']}, CuPy {r['cupy']})" if "device" in r else ""
    lines = [f"### demo{device}", "",
             f"The demo's pipeline on its {r['shape'][0]}x{r['shape'][1]} float32 synthetic sky "
             f"(seed {r['seed']}) in {r['chunk'][0]}x{r['chunk'][1]} chunks, persisted on the "
             f"workers: κ-σ clipping (κ = {r['kappa']:g}), threshold at median + "
             f"{r['nsigma']:g} σ, label, measure (the demo's catalogue: area, flux, mean, min, "
             f"max, centroid, centre of mass, bounding box); {r['sources']} "
             f"sources, background median {r['background']['median']:.6g}, σ "
             f"{r['background']['std']:.6g}. Every result equals the CPU reference before it "
             f"is timed; medians of {r['repeat']} runs, wall clock, each step until its result "
             f"is back. Kernels ready: on GPUs, the demo's warm-up when its cluster starts, before "
             f"the image is made (the pipeline on a sky of the run's chunk shape, at most "
             f"{WARM_UP_CHUNK_MAX}² a chunk, and of its size, at most {WARM_UP_SIZE_MAX}², and, "
             f"where that has fewer blocks per axis than the run, on a sky of the run's grid of "
             f"blocks, over every worker: kernels compiled, or loaded "
             f"from CuPy's kernel cache once any process has compiled them; the first cluster of "
             f"a run with an empty cache is a fresh install's). First run: the steps the first "
             f"time on that cluster, after it. photutils and sep run once on the host copy of the "
             f"same image. Workers connected over {protocols(r['rows'])}.", "",
             "| implementation | blocks | κσ clipping (ms) | threshold + label (ms) | "
             "measure (ms) | all (ms) | kernels ready (ms) | first run (ms) | first ÷ later | "
             "sources | faster than the faster peer |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        steps = " | ".join(f"{row['steps'][s] * 1e3:.1f}" for s in STEPS)
        faster = row["faster_than_peers"]
        first, ready = row.get("first_run"), row.get("warm_up")
        first_cells = " | ".join(
            ["-" if ready is None else f"{ready * 1e3:.0f}",
             *(["-", "-"] if first is None else
               [f"{first * 1e3:.1f}", f"{first / row['seconds']:.1f}×"])])
        lines.append(f"| {row['impl']} | {row['blocks']} | {steps} | {row['seconds'] * 1e3:.1f} | "
                     f"{first_cells} | {row['count']} | "
                     f"{'-' if faster is None else f'{faster:.3g}×'} |")
    breakdowns = [row for row in r["rows"] if row.get("breakdown")]
    if breakdowns:
        lines += ["", ("Where the time goes: one more run under distributed's task stream, per "
                       "step: the tasks that started in it, their compute time on every worker "
                       "and on the busiest one, the transfers of results between workers, and "
                       "the wall time outside the busiest worker's tasks (the scheduler, "
                       "messages, the client). κσ clipping on a cluster runs in its workers' "
                       "actors, called directly, not in tasks."), "",
                  ("| implementation | step | wall (ms) | tasks | task time, all workers (ms) | "
                   "busiest worker (ms) | transfers | transfer time (ms) | outside tasks (ms) |"),
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for row in breakdowns:
            for step, b in row["breakdown"].items():
                lines.append(f"| {row['impl']} | {step} | {b['wall'] * 1e3:.1f} | {b['tasks']} "
                             f"| {b['task_time'] * 1e3:.1f} | {b['busiest'] * 1e3:.1f} | "
                             f"{b['transfers']} | {b['transfer_time'] * 1e3:.1f} | "
                             f"{b['outside'] * 1e3:.1f} |")
    lines += ["", f"| peer (CPU, one run) | steps (s) | all (s) | sources | matched within "
                  f"{r['match_px']:g} px | theirs unmatched | ours unmatched | offset median / "
                  f"95 % (px) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for peer in r["peers"]:
        if "skipped" in peer:
            lines.append(f"| {peer['impl']} | {peer['skipped']} | - | - | - | - | - | - |")
            continue
        steps = ", ".join(f"{name} {seconds:.2f}" for name, seconds in peer["steps"].items())
        offsets = ("-" if peer["offset_median"] is None else
                   f"{peer['offset_median']:.2g} / {peer['offset_p95']:.2g}")
        lines.append(f"| {peer['impl']} | {steps} | {peer['seconds']:.2f} | {peer['count']} | "
                     f"{peer['matched']} | {peer['theirs_unmatched']} | {peer['ours_unmatched']} "
                     f"| {offsets} |")
    return "\n".join(lines)
