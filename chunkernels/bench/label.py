"""``chunkernels bench label``: connected components of an 8192² image with ~145k features.

The image is thresholded smoothed noise (Gaussian noise, ``gaussian_filter`` sigma 3, above 0.9
of its standard deviation), made on the device. Every implementation's labels are checked
against ``scipy.ndimage.label`` first (numbering identical; dask-image's, which numbers
differently, are checked for the same partition and count), then timed: SciPy on the whole
array (once), ``cupyx.scipy.ndimage.label`` and chunkernels on the whole CuPy array (CUDA-event
median, and wall clock since both read the count back), chunkernels on a persisted Dask array of
2048² CuPy chunks (threaded scheduler, one thread, and the synchronous scheduler; wall clock
ending in a device synchronisation, median), and the same with the kernels launched through CuPy
(releasing the GIL, where chunkernels holds it), and with the graph NumPy chunks get (a task
labelling each chunk, where one task labels CuPy chunks in batches, merges and relabels them); where
that run's time goes: Dask's own share (the
same graph with every task a no-op, :func:`chunkernels.bench.dask_alone`) and the tasks' own
(called one after another without a scheduler); the merge of that run alone (on the device, and
on the host from copies); and dask-image on NumPy chunks where it is installed.
"""

from __future__ import annotations

import time
from unittest import mock

import numpy as np

from chunkernels import cuda
from chunkernels.bench import (dask_alone, device_info, gpu_median, launches_holding_gil,
                               wall_median)

SIDE = 8192
CHUNK = 2048
SIGMA = 3.0
THRESHOLD = 0.9


def run(args) -> dict:
    """label: SciPy, cupyx, chunkernels whole and chunked, dask-image; results checked first."""
    import dask
    import dask.array as da
    import scipy.ndimage as ndi

    from chunkernels import ndimage
    from chunkernels.kernels import label as label_kernel
    from chunkernels.kernels.label import _forest, _host_merge
    from chunkernels.kernels.label import _graph as label_graph

    cp = cuda.cupy()
    info = device_info()
    sync = cp.cuda.Device().synchronize
    noise = cp.random.default_rng(0).standard_normal((SIDE, SIDE), dtype=cp.float32)
    smooth = ndimage.gaussian_filter(noise, SIGMA)
    image = smooth > THRESHOLD * smooth.std()
    del noise, smooth
    host = image.get()
    t0 = time.perf_counter()
    want, count = ndi.label(host)
    t_scipy = time.perf_counter() - t0
    want_dev = cp.asarray(want)

    def same(labels, n, what):
        if int(n) != count or not bool(cp.array_equal(labels, want_dev)):
            raise AssertionError(f"{what} differs from scipy.ndimage.label; not timing it")

    rows = [{"impl": "scipy.ndimage.label (host, once)", "wall_s": t_scipy}]
    whole = {"chunkernels.ndimage.label, CuPy array": lambda: ndimage.label(image)}
    try:
        import cupyx.scipy.ndimage as cndi

        whole = {"cupyx.scipy.ndimage.label": lambda: cndi.label(image), **whole}
    except ImportError:
        pass
    for name, fn in whole.items():
        same(*fn(), name)
        rows.append({"impl": name, "gpu_s": gpu_median(fn, args.repeat),
                     "wall_s": wall_median(lambda: (fn(), sync()), args.repeat)})

    dx = da.from_array(image, chunks=CHUNK, asarray=False).persist()

    def chunked(hold_gil=True, **kw):
        with launches_holding_gil(hold_gil):
            labels, n = ndimage.label(dx)
            labels, n = dask.persist(labels, n, **{"scheduler": "threads", **kw})
            sync()
        return labels, n

    labels, n = chunked()
    same(labels.compute(), n.compute(), "chunkernels on Dask CuPy chunks")
    del labels
    for name, kw in (("chunkernels.ndimage.label, Dask of CuPy chunks", {}),
                     ("the same, one scheduler thread", {"num_workers": 1}),
                     ("the same, synchronous scheduler", {"scheduler": "sync"}),
                     ("the same, threads, CuPy's launches", {"hold_gil": False}),
                     ("the same, synchronous, CuPy's launches",
                      {"scheduler": "sync", "hold_gil": False})):
        rows.append({"impl": f"{name} ({CHUNK}² chunks)",
                     "wall_s": wall_median(lambda: chunked(**kw), args.repeat)})

    # the graph of NumPy chunks and clusters, a task per chunk's labelling, on these chunks
    with _a_task_per_chunk():
        labels, n = chunked()
        same(labels.compute(), n.compute(), "chunkernels on Dask CuPy chunks, a task per chunk")
        del labels
        for name, kw in (("synchronous scheduler", {"scheduler": "sync"}),
                         ("threads", {})):
            rows.append({"impl": f"the same, a task per chunk's labelling, {name} ({CHUNK}² "
                                 "chunks)", "wall_s": wall_median(lambda: chunked(**kw),
                                                                  args.repeat)})

    # where a chunked run's time goes: Dask's own share (the same graph, every task a no-op),
    # and the tasks' own (called one after another, no scheduler)
    labels, n = ndimage.label(dx)
    for name, kw in (("synchronous scheduler", {"scheduler": "sync"}),
                     ("threaded scheduler", {"scheduler": "threads"})):
        rows.append({"impl": f"(Dask alone, {name}: the same graph, every task a no-op)",
                     "wall_s": wall_median(dask_alone(labels, n, **kw), args.repeat)})
    del labels, n
    structure = label_kernel.check_structure(None, 2)
    blocks = [dx.blocks[index].compute() for index in np.ndindex(*dx.numblocks)]
    plan = _host_merge._MergePlan(dx.shape, dx.chunks, structure, np.dtype(np.int32))
    local = label_graph._LocalLabels(structure, False)

    def tasks_alone():
        labelled = label_graph._label_blocks(plan, local, plan.dtype, blocks)
        picked = [label_graph._pick(labelled, b) for b in range(len(blocks))]
        return picked, label_graph._count_labelled(labelled, picked)

    tasks_labels, tasks_n = tasks_alone()
    same(cp.concatenate([cp.concatenate(tasks_labels[i:i + dx.numblocks[1]], axis=1)
                         for i in range(0, len(blocks), dx.numblocks[1])]), tasks_n,
         "the label's tasks called without Dask")
    del tasks_labels
    rows.append({"impl": f"(the {len(blocks) + 2} tasks alone, one after another, no "
                         "scheduler)", "gpu_s": gpu_median(tasks_alone, args.repeat),
                 "wall_s": wall_median(lambda: (tasks_alone(), sync()), args.repeat)})

    # the merge of that run on its own, from the summaries as the merge task receives them: on
    # the device (where the graph merges them), and copied to the host (the path of NumPy
    # chunks and of blocks spread over several devices)
    summaries = [_forest._local_device(b, structure)[1] for b in blocks]
    rows.append({"impl": f"(of which: the merge of the {len(blocks)} summaries, on the device)",
                 "wall_s": wall_median(lambda: (label_kernel.merge_device(plan, summaries), sync()),
                                       args.repeat)})
    rows.append({"impl": "(the same merge on the host, summaries copied there)",
                 "wall_s": wall_median(lambda: label_kernel.merge(plan, summaries), args.repeat)})
    del blocks, dx

    try:
        import dask_image.ndmeasure as dim
    except ImportError:
        dim = None
    if dim is not None:
        dn = da.from_array(host, chunks=CHUNK).persist()

        def dask_image_label():
            return dask.compute(*dim.label(dn), scheduler="threads")

        labels, n = dask_image_label()
        if int(n) != count or not _same_partition(labels, want, count):
            raise AssertionError("dask-image's labels are not scipy's partition; not timing it")
        rows.append({"impl": f"dask_image.ndmeasure.label, Dask of NumPy chunks ({CHUNK}²)",
                     "wall_s": wall_median(dask_image_label, max(3, args.repeat // 5), warmup=0)})
    report = {**info, "kernel": "label", "shape": [SIDE, SIDE], "chunks": [CHUNK, CHUNK],
              "features": count, "foreground": float(host.mean()), "rows": rows}
    report["markdown"] = _markdown(report)
    return report


def _a_task_per_chunk():
    """A context in which CuPy chunks get the graph NumPy chunks get: a task labels each chunk,
    the merge task only merges (see chunkernels.kernels.label.local_shape)."""
    from chunkernels.kernels.label import _graph as label_graph

    return mock.patch.object(label_graph, "local_shape", lambda xp: "per block")


def _same_partition(labels, want, count) -> bool:
    """Whether two labellings group the pixels alike: each of ``labels``' numbers maps to one of
    ``want``'s, and no two to the same."""
    a, b = labels.ravel(), want.ravel()
    image = np.zeros(count + 1, dtype=np.int64)
    image[a] = b
    return bool((image[a] == b).all()) and len(np.unique(image)) == count + 1


def _markdown(r) -> str:
    lines = [f"### label on {r['device']} ({r['date']}, CuPy {r['cupy']})", "",
             f"{r['shape'][0]}×{r['shape'][1]} bool image, {r['foreground']:.0%} foreground, "
             f"{r['features']} features (4-connectivity). Labels checked against SciPy's before "
             "timing. GPU: median of CUDA-event timings; wall: median wall clock ending in a "
             "device synchronisation. \"Dask alone\": the chunked graph with every task replaced "
             "by a no-op, persisted (building the graph left out); \"the tasks alone\": the "
             "chunked run's task functions called one after another in one thread; \"CuPy's "
             "launches\": the kernels launched through CuPy, which releases the GIL around each "
             "launch (chunkernels holds it).", "",
             "| implementation | GPU (ms) | wall (ms) |", "|---|---:|---:|"]
    for row in r["rows"]:
        gpu = f"{row['gpu_s'] * 1e3:.2f}" if "gpu_s" in row else "-"
        lines.append(f"| {row['impl']} | {gpu} | {row['wall_s'] * 1e3:.2f} |")
    return "\n".join(lines)
