"""compute-sanitizer over chunkernels' CUDA kernels, on small cases (issue #20).

Run on a machine with a GPU, from the repository's root::

    python tests/gpu_sanitizer.py --tool memcheck            # every case
    python tests/gpu_sanitizer.py --tool racecheck           # shared-memory hazards
    python tests/gpu_sanitizer.py --tool memcheck --case label-2d --case label-chunked
    python tests/gpu_sanitizer.py --list                     # the cases
    python tests/gpu_sanitizer.py --tool racecheck --label-halving   # d79960e's label_tiles

Each case runs in a process of its own under ``compute-sanitizer --tool TOOL --error-exitcode
86 --report-api-errors no``: the label kernels (2-D and 3-D, sizes that end tiles part-way,
strided outputs, the chunked batch path and the merge on the device), zoom (orders 0 to 5,
several modes, chunked), κ-σ clipping (CuPy and chunked) and the halo gather (persisted CuPy
blocks smaller than the halo).
Every case also checks its results against SciPy or the NumPy path, so a kernel that misbehaves
without a sanitizer report fails too. A case first runs once without the sanitizer (it compiles
the kernels into CuPy's cache and checks the results quickly), then under it.

API errors are not reported: what counts is the memory (and race, initialisation, barrier)
errors of the kernels. Drivers without ``cuFuncGetParamCount`` tell a function's parameters by
asking ``cuFuncGetParamInfo`` for one past the last (``CUDA_ERROR_INVALID_VALUE``,
:func:`chunkernels.cuda._parameter_layout`), which compute-sanitizer would otherwise report as an
error in every case; a launch that fails still fails its case.

CuPy's memory pool is switched off in the cases (``cupy.cuda.set_allocator(None)``): inside a
pool's chunk an access past an array's end lands in memory the pool owns, which memcheck cannot
tell from a valid one. Kernels are compiled with ``-lineinfo`` so that reports name source lines.

``--label-halving`` compiles ``label_tiles`` with the path halving of commit d79960e (reverted by
5c48b0e after a misaligned-address failure), to check that change under each tool without
editing the sources.

Exit status: 0 when every case passed under the tool, 1 when one did not (its report is printed),
2 when compute-sanitizer or a GPU is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANITIZER_ERROR = 86  # compute-sanitizer's exit status when it reported an error
CASE_TIMEOUT = 300    # seconds a case may take under the sanitizer before it counts as hung

CASES: dict = {}


def case(name):
    """Register a case: a function of no arguments that raises when a result is wrong."""
    def register(fn):
        CASES[name] = fn
        return fn
    return register


# -- the cases (run in the child process) ----------------------------------------------------------


def _rng(seed):
    import numpy as np

    return np.random.default_rng(seed)


@case("label-2d")
def _label_2d():
    """Whole-array labels: 4- and 8-connected, sizes that end tiles part-way, a strided float
    input, an int64 output array and a strided int32 output view."""
    import cupy as cp
    import numpy as np
    import scipy.ndimage as ndi

    import chunkernels.ndimage as cnd

    rng = _rng(0)
    for shape, density in (((77, 61), 0.45), ((33, 97), 0.6), ((1, 200), 0.5), ((64, 64), 0.59)):
        x = rng.random(shape) < density
        for connectivity in (1, 2):
            s = ndi.generate_binary_structure(2, connectivity)
            labels, n = cnd.label(cp.asarray(x), s)
            ref, ref_n = ndi.label(x, s)
            assert int(n) == ref_n and np.array_equal(labels.get(), ref), (shape, connectivity)
    f = rng.standard_normal((90, 70)).astype(np.float32)
    view = cp.asarray(f)[::-2, 3:-4]  # negative and doubled strides
    out = cp.zeros(view.shape, np.int64)
    n = cnd.label(view, output=out)
    ref, ref_n = ndi.label(f[::-2, 3:-4])
    assert int(n) == ref_n and np.array_equal(out.get(), ref)
    wide = cp.zeros((view.shape[0], 2 * view.shape[1]), np.int32)
    n = cnd.label(view, output=wide[:, ::2])  # an output view with strides
    assert np.array_equal(wide[:, ::2].get(), ref) and not wide[:, 1::2].any()


@case("label-3d")
def _label_3d():
    """Labels across planes (label_merge): 6- and 26-connected 3-D, and a 1-D line."""
    import cupy as cp
    import numpy as np
    import scipy.ndimage as ndi

    import chunkernels.ndimage as cnd

    rng = _rng(1)
    x = (rng.random((19, 23, 37)) < 0.3).astype(np.uint8)
    for connectivity in (1, 3):
        s = ndi.generate_binary_structure(3, connectivity)
        labels, n = cnd.label(cp.asarray(x), s)
        ref, ref_n = ndi.label(x, s)
        assert int(n) == ref_n and np.array_equal(labels.get(), ref), connectivity
    line = rng.random(1000) < 0.5
    labels, n = cnd.label(cp.asarray(line))
    ref, ref_n = ndi.label(line)
    assert int(n) == ref_n and np.array_equal(labels.get(), ref)


@case("label-chunked")
def _label_chunked():
    """Chunked labels on one device: the batch path (many chunks of one layout, whose pieces of
    the batch's arrays are not 16-byte aligned: 33 x 35 int32 is 4620 bytes) and the merge on the
    device; 2-D and 3-D; int32 and int64 labels."""
    import cupy as cp
    import dask
    import dask.array as da
    import numpy as np
    import scipy.ndimage as ndi

    import chunkernels.ndimage as cnd

    rng = _rng(2)
    cases = [((70, 90), (33, 35), 2, 0.5, None), ((130, 66), (64, 64), 1, 0.6, np.int64),
             ((20, 30, 26), (7, 16, 13), 3, 0.3, None)]
    for shape, chunks, connectivity, density, dtype in cases:
        x = rng.random(shape) < density
        s = ndi.generate_binary_structure(len(shape), connectivity)
        d = da.from_array(cp.asarray(x), chunks=chunks, asarray=False)
        with dask.config.set(scheduler="sync"):
            labels, n = cnd.label(d, s, output=dtype)
            got, got_n = dask.compute(labels, n)
        ref, ref_n = ndi.label(x, s)
        assert int(got_n) == ref_n and np.array_equal(cp.asnumpy(got), ref), (shape, chunks)


@case("zoom")
def _zoom():
    """zoom (its one-pass and per-axis kernels): orders 0 to 5, several modes, 2-D and 3-D,
    float32, float64 and uint8, and a chunked zoom."""
    import cupy as cp
    import dask
    import dask.array as da
    import numpy as np
    import scipy.ndimage as ndi

    import chunkernels.ndimage as cnd

    rng = _rng(3)
    x = rng.random((23, 31)).astype(np.float32)
    for order, mode in ((0, "nearest"), (1, "constant"), (2, "mirror"), (3, "reflect"),
                        (4, "grid-wrap"), (5, "grid-constant")):
        got = cnd.zoom(cp.asarray(x), 1.7, order=order, mode=mode)
        ref = ndi.zoom(x, 1.7, order=order, mode=mode)
        np.testing.assert_allclose(got.get(), ref, rtol=1e-4, atol=1e-4, err_msg=f"{order} {mode}")
    cube = rng.random((9, 14, 5))
    got = cnd.zoom(cp.asarray(cube), (1.5, 0.6, 2.0), order=3)
    np.testing.assert_allclose(got.get(), ndi.zoom(cube, (1.5, 0.6, 2.0), order=3), rtol=1e-7,
                               atol=1e-9)
    small = rng.integers(0, 255, (17, 12)).astype(np.uint8)
    got = cnd.zoom(cp.asarray(small), 2.3, order=1).get().astype(int)
    assert np.abs(got - ndi.zoom(small, 2.3, order=1)).max() <= 1  # rounding of .5 may differ
    d = da.from_array(cp.asarray(x.astype(np.float64)), chunks=(9, 10), asarray=False)
    with dask.config.set(scheduler="sync"):
        got = cnd.zoom(d, 2.2, order=3).compute()
    np.testing.assert_allclose(cp.asnumpy(got), ndi.zoom(x.astype(np.float64), 2.2, order=3),
                               rtol=1e-7, atol=1e-9)


@case("kappa-sigma")
def _kappa_sigma():
    """κ-σ clipping on a CuPy array and on Dask arrays of CuPy chunks, against the NumPy path."""
    import cupy as cp
    import dask
    import dask.array as da
    import numpy as np

    from chunkernels.sources import kappa_sigma_clip

    rng = _rng(4)
    for dtype in ("float32", "float64", "int16"):
        x = rng.standard_normal((301, 203)) * 10
        x[rng.random(x.shape) < 0.01] += 500  # outliers to clip
        x = x.astype(dtype)
        ref = kappa_sigma_clip(x, 3.0)
        with dask.config.set(scheduler="sync"):
            for data in (cp.asarray(x), da.from_array(cp.asarray(x), chunks=(64, 50),
                                                      asarray=False)):
                got = kappa_sigma_clip(data, 3.0)
                assert int(got.count) == int(ref.count), (dtype, type(data))
                np.testing.assert_allclose(float(got.median), float(ref.median), rtol=1e-6)
                np.testing.assert_allclose(float(got.std), float(ref.std), rtol=1e-6)


@case("halo-gather")
def _halo_gather():
    """The halo gather: CuPy blocks held in memory (persisted), extended by halos that span
    several neighbours (chunks smaller than the halo), for 1-, 2- and 8-byte elements."""
    import cupy as cp
    import dask
    import dask.array as da
    import numpy as np
    import scipy.ndimage as ndi

    import chunkernels.ndimage as cnd

    rng = _rng(5)
    x = rng.random((45, 38))
    with dask.config.set(scheduler="sync"):
        d = da.from_array(cp.asarray(x), chunks=(7, 5), asarray=False).persist()
        got = cnd.gaussian_filter(d, 3.0, mode="wrap").compute()
        np.testing.assert_allclose(cp.asnumpy(got), ndi.gaussian_filter(x, 3.0, mode="wrap"),
                                   rtol=1e-9, atol=1e-12)
        for dtype, high in (("uint8", 4), ("int16", 100)):  # sums the dtype holds
            ints = rng.integers(0, high, (40, 33)).astype(dtype)
            d = da.from_array(cp.asarray(ints), chunks=(6, 4), asarray=False).persist()
            got = cnd.correlate(d, np.ones((9, 7)), mode="reflect").compute()
            ref = ndi.correlate(ints, np.ones((9, 7)), mode="reflect")
            assert np.array_equal(cp.asnumpy(got), ref), dtype


# -- the child: one case, in this process ----------------------------------------------------------

HALVING = """
// d79960e: label_find that halves the path on the way (each node passed is pointed at its
// grandparent), through a plain (non-volatile) pointer into the tile's shared memory
__device__ __forceinline__ int label_find_halving(int* parent, int a)
{
    int p = parent[a];
    while (p != a) {
        const int g = parent[p];
        parent[a] = g;
        a = p;
        p = g;
    }
    return a;
}
"""
PLAIN_LOOKUP = "const int root = label_find<int>(tile, t);"
HALVING_LOOKUP = "const int root = label_find_halving(tile, t);"


def _with_halving(text: str) -> str:
    """label.cu with d79960e's path halving in label_tiles' lookup of tile roots."""
    anchor = "// Join the trees of a and b"
    if text.count(PLAIN_LOOKUP) != 1 or anchor not in text:
        raise SystemExit("gpu_sanitizer: label.cu no longer has the lookup d79960e changed; "
                         "--label-halving cannot apply it")
    return text.replace(anchor, HALVING + "\n" + anchor, 1).replace(PLAIN_LOOKUP, HALVING_LOOKUP)


def run_case(name: str, halving: bool) -> None:
    sys.path.insert(0, str(ROOT))
    import cupy as cp

    from chunkernels import cuda

    if cp.cuda.runtime.getDeviceCount() < 1:
        raise SystemExit("gpu_sanitizer: no CUDA device")
    cp.cuda.set_allocator(None)  # no pool: memcheck sees each array's own bounds
    cp.cuda.set_pinned_memory_allocator(None)
    cuda.COMPILE_OPTIONS = (*cuda.COMPILE_OPTIONS, "-lineinfo")
    if halving:
        plain = cuda.source

        def source(kernel):
            text = plain(kernel)
            return _with_halving(text) if kernel == "label" else text

        cuda.source = source
    CASES[name]()
    cp.cuda.Device().synchronize()  # an asynchronous fault surfaces here at the latest
    print(f"case {name}: results correct")


# -- the parent: every case under the sanitizer ----------------------------------------------------


def _sanitizer(given: str | None) -> str | None:
    if given:
        return given
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "compute-sanitizer").exists():
            return str(Path(home) / "bin" / "compute-sanitizer")
    return None


def _run(command, timeout) -> tuple[int | None, float, str]:
    """``(exit status or None when it timed out, seconds, output)``."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else exc.stdout or ""
        return None, time.perf_counter() - start, out
    return done.returncode, time.perf_counter() - start, done.stdout + done.stderr


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", choices=("memcheck", "racecheck", "initcheck", "synccheck"),
                        default="memcheck")
    parser.add_argument("--case", action="append", choices=sorted(CASES), dest="cases",
                        help="a case to run (repeatable; default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--label-halving", action="store_true",
                        help="compile label_tiles with d79960e's path halving")
    parser.add_argument("--sanitizer", help="path of compute-sanitizer (default: on PATH, "
                                            "$CUDA_HOME/bin, /usr/local/cuda/bin)")
    parser.add_argument("--no-warm", action="store_true",
                        help="skip the run without the sanitizer before each case")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT,
                        help=f"seconds per case under the sanitizer (default {CASE_TIMEOUT})")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # the child: one case, here
    args = parser.parse_args(argv)
    if args.list:
        for name, fn in CASES.items():
            print(f"{name:15} {fn.__doc__.splitlines()[0]}")
        return 0
    if args.run:
        run_case(args.run, args.label_halving)
        return 0
    sanitizer = _sanitizer(args.sanitizer)
    if sanitizer is None:
        print("gpu_sanitizer: compute-sanitizer not found (give --sanitizer PATH, or put the CUDA "
              "toolkit's bin/ on PATH)", file=sys.stderr)
        return 2
    child = [sys.executable, str(Path(__file__).resolve())]
    extra = ["--label-halving"] if args.label_halving else []
    failed = []
    for name in args.cases or list(CASES):
        if not args.no_warm:
            rc, seconds, out = _run([*child, "--run", name, *extra], timeout=args.timeout)
            if rc != 0:
                failed.append(name)
                print(f"FAIL  {name:15} without the sanitizer ({'timed out' if rc is None else rc},"
                      f" {seconds:.1f} s)\n{out[-4000:]}")
                continue
        command = [sanitizer, "--tool", args.tool, "--error-exitcode", str(SANITIZER_ERROR),
                   "--report-api-errors", "no", "--print-limit", "20", *child, "--run", name,
                   *extra]
        rc, seconds, out = _run(command, timeout=args.timeout)
        if rc == 0:
            print(f"ok    {name:15} {args.tool} ({seconds:.1f} s)")
            continue
        failed.append(name)
        why = ("timed out" if rc is None else "sanitizer errors" if rc == SANITIZER_ERROR
               else f"exit status {rc}")
        print(f"FAIL  {name:15} {args.tool}: {why} ({seconds:.1f} s)\n{out[-8000:]}")
    print(f"{len(failed)} of {len(args.cases or CASES)} case(s) failed under {args.tool}"
          + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
