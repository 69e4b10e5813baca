"""A Gaussian filter and a label on a running Dask cluster: one machine or N, same code.

Start a scheduler somewhere, and one worker per GPU on every machine that should compute (one
worker process per GPU is what ``dask cuda worker`` starts), then point this script at the
scheduler::

    dask scheduler --port 8786                       # on one machine
    dask cuda worker tcp://SCHEDULER:8786            # on each GPU machine (one worker per GPU)
    python examples/cluster_filter_label.py tcp://SCHEDULER:8786

(``dask worker tcp://SCHEDULER:8786 --nthreads 1`` starts CPU workers instead: the chunks are
then NumPy arrays and every block runs the CPU reference.) Without an address the script starts
a local cluster the same way ``chunkernels.cluster.client()`` does.

The image is made on the workers, placed in contiguous tiles of blocks, one tile per worker
(``chunkernels.cluster.distribute``), filtered (a halo exchange: each worker reads its own
blocks' neighbours in place, and sends the others the strips they need, one batch per pair of
workers) and labelled (per-block labels where the blocks live, one merge of their faces). The
results are checked against SciPy on windows around the tiles' corners, where the halo crosses
workers, and the label count against SciPy's on the whole image.
"""

from __future__ import annotations

import argparse
import time

import dask.array as da
import numpy as np
import scipy.ndimage as ndi

import chunkernels
from chunkernels import cuda, ndimage

SIGMA = 2.0


def image(shape, chunks, gpu: bool):
    """A random image made on the workers (CuPy's generator on GPU workers)."""
    if gpu:
        rs = da.random.RandomState(7, RandomState=cuda.cupy().random.RandomState)
        return rs.random_sample(shape, chunks=chunks, dtype=np.float32)
    return da.random.default_rng(7).random(shape, dtype=np.float32, chunks=chunks)


def host(a):
    """A small computed array on this machine, as NumPy."""
    a = a.compute()
    return a.get() if cuda.is_cupy_array(a) else np.asarray(a)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scheduler", nargs="?", help="address of a running scheduler "
                        "(default: start a local cluster)")
    parser.add_argument("--size", type=int, default=4096, help="image side (default 4096)")
    parser.add_argument("--chunks", type=int, default=1024, help="chunk side (default 1024)")
    args = parser.parse_args(argv)

    client = (chunkernels.cluster.client(scheduler=args.scheduler) if args.scheduler
              else chunkernels.cluster.client(dashboard_address=None))
    with client:  # closes a cluster it started; leaves a running one running
        gpu = bool(chunkernels.cluster.gpu_names(client))
        if gpu and args.scheduler:  # a cluster started elsewhere: tune its GPU workers once
            chunkernels.cluster.tune_gpu_workers(client)
        print("cluster:", chunkernels.cluster.describe(client))
        shape, chunks = (args.size,) * 2, (args.chunks,) * 2
        x = chunkernels.cluster.distribute(image(shape, chunks, gpu), client)
        print("blocks per worker:", sorted(chunkernels.cluster.blocks_per_worker(x).values()))

        start = time.perf_counter()
        smooth = ndimage.gaussian_filter(x, SIGMA).persist()
        labels, count = ndimage.label(smooth > 0.5)
        labels, count = client.persist([labels, count])
        n = int(count.compute())
        seconds = time.perf_counter() - start

        # the filter on windows across every chunk corner (strips travel between workers at
        # the tiles' borders), widened by the halo; at the image's edge, its own edge mode
        depth = int(4 * SIGMA + 0.5)
        for r in range(0, args.size, args.chunks):
            for c in range(0, args.size, args.chunks):
                window = (slice(max(0, r - 8), r + 8), slice(max(0, c - 8), c + 8))
                wide = tuple(slice(max(0, w.start - depth), w.stop + depth) for w in window)
                inner = tuple(slice(w.start - s.start, w.stop - s.start)
                              for w, s in zip(window, wide))
                want = ndi.gaussian_filter(host(x[wide]).astype(np.float64), SIGMA,
                                           mode="reflect")[inner]
                np.testing.assert_allclose(host(smooth[window]), want, rtol=1e-5, atol=1e-5)
        # the label count on the whole image, against SciPy's on the filtered image
        want_n = ndi.label(host(smooth) > 0.5)[1]
        assert n == want_n, f"{n} labels; SciPy finds {want_n}"

    print(f"filter + label of a {args.size}² image in {args.chunks}² chunks: "
          f"{seconds * 1e3:.0f} ms, {n} labels ({'CuPy' if gpu else 'NumPy'} chunks)")
    print("result:  verified against SciPy")


if __name__ == "__main__":  # required: worker processes may re-import this file
    main()
