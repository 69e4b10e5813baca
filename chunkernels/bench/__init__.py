"""``chunkernels bench``: kernels timed side by side with their peers, checked first.

Every implementation's result is checked against the reference before it is timed. GPU times are
medians of CUDA-event timings after warm-up (``cupyx.profiler.benchmark``); chunked runs, which
include graph construction and Dask's scheduler, are medians of wall-clock times that end with a
device synchronisation. Each benchmark ``NAME`` writes, under ``--out``, ``NAME.md`` (the
Markdown tables it also prints), ``NAME.json`` (the raw numbers, with the machine, date and
versions) and ``NAME-PLOT.png`` for each of its plots (with matplotlib).

One module per benchmark in this package (``chunkernels/bench/NAME.py``) with a function
``run(args) -> dict``; the dict holds the raw numbers, the tables as Markdown under
``"markdown"`` and, optionally, plots under ``"plots"``: a list of
``{"name", "title", "xlabel", "ylabel", "series": [{"label", "x", "y", "style"?}], "xlog"?,
"ylog"?, "xticks"?}`` (``xlog``/``ylog``: the base of a logarithmic axis; ``xticks``: the x values
to label). A module reads the options it
needs from ``args`` (:func:`array_shape`, :func:`chunk_shapes` and :func:`clusters` read the
shared ones) and ignores the rest. Module attributes tell :func:`main` more: ``NEEDS_GPU = False``
when the benchmark also runs on CPU workers, ``CLUSTER = True`` when it runs on the clusters that
``--gpus`` / ``--workers`` / ``--scheduler`` ask for. To add a benchmark, write the module and
add its name to :data:`BENCHMARKS`.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np

from chunkernels import cuda
from chunkernels._cli_args import add_cluster_arguments

MiB = 2**20
GiB = 2**30

#: Benchmarks, one module each in this package, run in this order by default.
BENCHMARKS = (
    "broadcast_add",
    "kappa_sigma_clip",
    "label",
    "scaling",
    "capacity",
    "measure",
    "filters",
    "zoom",
    "launch",
    "sky",
    "demo",
)

#: The install that brings what the benchmarks use beyond chunkernels itself.
BENCH_EXTRA = "pip install 'chunkernels[bench]'"


def add_arguments(parser) -> None:
    parser.add_argument("kernels", nargs="*", metavar="KERNEL",
                        help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})")
    parser.add_argument("--size", type=size_text, metavar="SIZE",
                        help="array size: a shape (32768x32768), the side of a square or cube "
                             "(32768), or bytes (4GiB); default: each benchmark's own")
    parser.add_argument("--chunks", type=size_text, nargs="+", metavar="CHUNK",
                        help="chunk sizes to compare, each written like --size (8192, "
                             "4096x8192, 256MiB); default: each benchmark's own")
    parser.add_argument("--size-gib", type=float, default=1.0,
                        help="broadcast_add: array size for the whole-array comparison (GiB)")
    parser.add_argument("--total-gib", type=float, default=16.0,
                        help="broadcast_add: array size for the chunked runs (GiB)")
    parser.add_argument("--chunks-mib", type=int, nargs="+",
                        default=[16, 32, 64, 128, 256, 512, 1024],
                        help="broadcast_add: chunk sizes for the chunked runs, in MiB")
    parser.add_argument("--repeat", type=int, default=20, help="timed repetitions (median)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="capacity: the most seconds one step may take before it is "
                             "reported as not finished and cancelled (default %(default)s)")
    parser.add_argument("--out", default="bench-results",
                        help="folder for the Markdown, JSON and PNG results (default %(default)s)")
    add_cluster_arguments(parser, sweep=True)


def main(args) -> int:
    names = args.kernels or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"no benchmark for {', '.join(map(repr, unknown))}; available: "
              f"{', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    modules = {n: importlib.import_module(f"chunkernels.bench.{n}") for n in names}
    status = 0
    if cuda.gpu_count() == 0:
        need_gpu = [n for n, m in modules.items() if getattr(m, "NEEDS_GPU", True)]
        if need_gpu and not args.kernels:
            print("chunkernels bench needs a CUDA GPU and CuPy; none found here. On CPU "
                  "workers: chunkernels bench scaling --workers 1 2 --size 2048", file=sys.stderr)
            return 2
        for n in need_gpu:
            print(f"{n}: skipped, it needs a CUDA GPU and CuPy; none found here", file=sys.stderr)
            del modules[n]
            status = 2
    on_cluster = any(getattr(args, o, None) is not None for o in ("gpus", "workers", "scheduler"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, module in modules.items():
        if on_cluster and not getattr(module, "CLUSTER", False):
            print(f"{name}: runs on this process's GPU; --gpus, --workers and --scheduler do not "
                  f"apply to it", file=sys.stderr)
        try:
            report = module.run(args)
        except AssertionError as exc:  # a wrong result: no numbers for it, the others still run
            print(f"{name}: stopped, a result was wrong: {exc}", file=sys.stderr, flush=True)
            status = 1
            continue
        finally:
            free_device_memory()
        written = write_report(name, report, out_dir)
        print(report["markdown"])
        print(f"\nwritten: {', '.join(map(str, written))}", flush=True)
    return status


# -- options shared by the benchmarks -----------------------------------------------------------

_SHAPE = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*)*")


def size_text(text: str) -> str:
    """``--size`` / ``--chunks`` values for argparse: checked, and kept as written."""
    parse_size(text)
    return text


def parse_size(text: str) -> tuple[int, ...] | int:
    """A shape (``"32768x16384"``, ``"8192"``: a tuple) or a byte count (``"4GiB"``: an int)."""
    import argparse

    from dask.utils import parse_bytes

    text = text.strip()
    if _SHAPE.fullmatch(text):
        return tuple(int(n) for n in text.split("x"))
    if re.search(r"[A-Za-z]", text):
        with contextlib.suppress(ValueError):
            nbytes = parse_bytes(text)
            if nbytes > 0:
                return nbytes
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a size: write a shape (32768x32768), the side of a square or cube "
        f"(32768), or a number of bytes with its unit (4GiB, 256MiB)")


def shape_of(text: str, ndim: int, dtype) -> tuple[int, ...]:
    """The ``ndim``-d shape that size ``text`` (see :func:`parse_size`) means for ``dtype``.

    One side means a square (a cube, ...); a byte count means the largest square of that many
    bytes or fewer.
    """
    size = parse_size(text)
    if isinstance(size, int):
        side = int((size / np.dtype(dtype).itemsize) ** (1 / ndim) + 1e-9)
        return (max(1, side),) * ndim
    if len(size) == 1:
        return size * ndim
    if len(size) != ndim:
        raise ValueError(f"size {text!r} has {len(size)} axes; this benchmark's arrays have "
                         f"{ndim}: write {'x'.join(['N'] * ndim)} or one side")
    return size


def array_shape(args, default: tuple[int, ...], dtype) -> tuple[int, ...]:
    """The array shape ``--size`` asks for, else ``default``."""
    text = getattr(args, "size", None)
    return default if text is None else shape_of(text, len(default), dtype)


def chunk_shapes(args, shape: tuple[int, ...], default, dtype) -> list[tuple[int, ...]]:
    """The chunk shapes ``--chunks`` asks for (else ``default``), each clipped to ``shape``."""
    texts = getattr(args, "chunks", None)
    chunks = default if not texts else [shape_of(t, len(shape), dtype) for t in texts]
    unique = dict.fromkeys(tuple(min(c, n) for c, n in zip(chunk, shape)) for chunk in chunks)
    return list(unique)


def sweep(args, *, workers: tuple[int, ...] = (1, 2)) -> list[tuple[str, int]]:
    """The clusters the options ask for, in order: ``(kind, count)`` pairs.

    ``--gpus N ...``: ``("gpu", N)`` for each ``N`` (``N = 0``: ``("cpu", 0)``, one CPU worker of
    threads in this process). ``--workers N ...``: ``("cpu", N)``, ``N`` single-threaded CPU
    worker processes. ``--scheduler``: ``("scheduler", 0)``, the running cluster there. Without
    any of them: 1, 2, 4, ... GPUs up to all visible, or ``workers`` CPU processes where there is
    no GPU.
    """
    if getattr(args, "scheduler", None) is not None:
        return [("scheduler", 0)]
    gpus, cpus = getattr(args, "gpus", None), getattr(args, "workers", None)
    if gpus is None and cpus is None:
        present = cuda.gpu_count()
        if not present:
            return [("cpu", n) for n in workers]
        gpus = sorted({2**k for k in range(present.bit_length()) if 2**k <= present} | {present})
    return [("gpu" if n else "cpu", n) for n in gpus or ()] + [("cpu", n) for n in cpus or ()]


def clusters(args, *, workers: tuple[int, ...] = (1, 2)) -> Iterator[tuple[str, int, object]]:
    """Open each cluster of :func:`sweep` in turn; yield ``(kind, workers, client)``.

    ``kind`` is ``"gpu"`` when the workers compute on GPUs, else ``"cpu"``; ``workers`` is how
    many there are. Each cluster is closed before the next one starts (one connected to with
    ``--scheduler`` is left running); its client is Dask's default scheduler meanwhile.
    """
    from chunkernels import cluster

    quiet = {"dashboard_address": None}
    for kind, n in sweep(args, workers=workers):
        if kind == "scheduler":
            c = cluster.client(scheduler=args.scheduler)
        elif kind == "gpu":
            c = cluster.client(n, protocol=getattr(args, "protocol", None), **quiet)
        elif n == 0:
            c = cluster.client(0, **quiet)
        else:
            c = cluster.client(0, processes=True, n_workers=n, threads=1, **quiet)
        with c:
            if kind == "scheduler":
                kind = "gpu" if cluster.gpu_names(c) else "cpu"
            yield kind, cluster.worker_count(c), c


class Progress:
    """A benchmark's progress on stderr: a tqdm bar, or one line per run where tqdm is missing.

    >>> with Progress(6, "scaling") as progress:          # doctest: +SKIP
    ...     with progress.run("2 GPUs, 8192x8192, chunkernels"):
    ...         ...
    """

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.count = total, desc, 0
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
            print(f"{desc}: {total} runs (tqdm is not installed, so no progress bar: "
                  f"{BENCH_EXTRA})", file=sys.stderr)
        else:
            self._bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr,
                             dynamic_ncols=True)

    @contextlib.contextmanager
    def run(self, label: str):
        """The block of one run, labelled ``label``; the bar advances when it ends."""
        if self._bar is None:
            print(f"{self.desc} [{self.count + 1}/{self.total}] {label}", file=sys.stderr,
                  flush=True)
        else:
            self._bar.set_postfix_str(label)
        yield
        self.count += 1
        if self._bar is not None:
            self._bar.update()

    def note(self, text: str) -> None:
        """A line of text that does not break the bar."""
        if self._bar is None:
            print(text, file=sys.stderr, flush=True)
        else:
            self._bar.write(text, file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()


# -- results --------------------------------------------------------------------------------------


def environment() -> dict:
    """Date, Python and the versions of the libraries the benchmarks use (those installed)."""
    import platform
    from importlib import metadata

    import chunkernels

    found = metadata.packages_distributions()
    versions = {"chunkernels": chunkernels.__version__}
    for module in ("numpy", "scipy", "dask", "distributed", "cupy", "dask_cuda", "dask_image",
                   "rmm"):
        for dist in found.get(module, ()):
            with contextlib.suppress(metadata.PackageNotFoundError):
                versions[module] = metadata.version(dist)
                break
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": platform.node(), "python": platform.python_version(), "versions": versions,
            "launches": cuda.launch_counts()}


#: How the versions line names the libraries of :func:`environment`.
_LIBRARY_NAMES = {"numpy": "NumPy", "scipy": "SciPy", "dask": "Dask", "cupy": "CuPy",
                  "dask_cuda": "dask-cuda", "dask_image": "dask-image", "rmm": "RMM"}


def protocols(records) -> str:
    """The protocols the workers of ``records`` (clusters or rows, each with its ``"protocol"``)
    talked over, as ``"TCP"``, ``"UCX"`` or ``"TCP and UCX"`` (``"TCP"`` for a record written
    before the protocol was recorded)."""
    return " and ".join(sorted({r.get("protocol", "tcp").upper() for r in records}))


def versions_line(env: dict) -> str:
    """``Versions: chunkernels 0.1.0, Python 3.11.7, NumPy 2.4.6, ...`` from :func:`environment`."""
    versions = dict(env["versions"])
    parts = [f"chunkernels {versions.pop('chunkernels')}", f"Python {env['python']}"]
    parts += [f"{_LIBRARY_NAMES.get(k, k)} {v}" for k, v in versions.items()]
    return f"Versions: {', '.join(parts)}."


def write_report(name: str, report: dict, out_dir: Path) -> list[Path]:
    """Write benchmark ``name``'s ``report`` as Markdown, JSON and PNG plots; the paths written.

    The Markdown ends with how this process's kernels were launched so far (through the driver,
    through CuPy, and why), where any were.
    """
    report.setdefault("environment", environment())
    # The versions close the table, so that a table pasted into docs/benchmarks.md carries them.
    report["markdown"] = report["markdown"].rstrip() + "\n\n" + versions_line(report["environment"])
    launches = report["environment"]["launches"]
    if launches["driver"] or launches["cupy"]:
        report["markdown"] += "\n\n" + launch_line(launches)
    md = out_dir / f"{name}.md"
    md.write_text(report["markdown"] + "\n")
    data = out_dir / f"{name}.json"
    data.write_text(json.dumps({k: v for k, v in report.items() if k != "markdown"}, indent=2,
                               default=_plain))
    return [md, data, *write_plots(name, report.get("plots", ()), out_dir)]


def launch_line(launches: dict) -> str:
    """One Markdown line of :func:`chunkernels.cuda.launch_counts`."""
    reasons = "; ".join(f"{n} because {reason}" for reason, n in
                        launches["fallback_reasons"].items())
    return (f"Kernel launches in this process so far: {launches['driver']} through the driver "
            f"(chunkernels' launch), {launches['cupy']} through CuPy"
            + (f" (fallbacks: {reasons})." if reasons else "."))


def _plain(value):
    """NumPy scalars and arrays in a report, as JSON takes them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_plots(name: str, plots, out_dir: Path) -> list[Path]:
    """``out_dir/NAME-PLOT.png`` for each plot of a report (see the module docstring)."""
    if not plots:
        return []
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"{name}: PNG plots not written, matplotlib is not installed ({BENCH_EXTRA}); "
              f"the JSON holds their data", file=sys.stderr)
        return []
    written = []
    for plot in plots:
        fig = Figure(figsize=(7.5, 4.8), layout="constrained")
        ax = fig.add_subplot()
        for series in plot["series"]:
            ax.plot(series["x"], series["y"], series.get("style", "o-"), label=series["label"])
        if plot.get("xlog"):
            ax.set_xscale("log", base=plot["xlog"])
        if plot.get("ylog"):
            ax.set_yscale("log", base=plot["ylog"])
        if plot.get("xticks"):
            ax.set_xticks(plot["xticks"], labels=[f"{t:g}" for t in plot["xticks"]])
            ax.minorticks_off()
        ax.set(title=plot["title"], xlabel=plot["xlabel"], ylabel=plot["ylabel"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        path = out_dir / f"{name}-{plot['name']}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written


# -- timing ---------------------------------------------------------------------------------------


def on_host(*arrays) -> list[np.ndarray]:
    """Dask arrays computed in one go and brought to this process as NumPy arrays, each block
    copied to the host where it is computed: nothing lands on this process's GPU, which on a
    ``LocalCUDACluster`` is one of the workers' (a 4 GiB image once ran it out of memory)."""
    import dask

    on_workers = [a.map_blocks(cuda.to_host, meta=np.empty((0,) * a.ndim, a.dtype))
                  for a in arrays]
    return [np.asarray(a) for a in dask.compute(*on_workers)]


def free_device_memory() -> None:
    """Hand the device memory a finished benchmark cached in CuPy's pool back to the device, so
    that the next benchmark starts with all of it (nothing to do on a machine without a GPU)."""
    if cuda.gpu_count():
        import gc

        gc.collect()
        cuda.cupy().get_default_memory_pool().free_all_blocks()


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


def wall_median(fn: Callable, repeat: int, warmup: int = 2,
                after: Callable | None = None) -> float:
    """Median wall-clock time of ``fn()`` (which must synchronise) in seconds.

    ``after(result)``, when given, runs after each call, outside the clock (releasing a result
    on a cluster, say).
    """
    times = []
    for i in range(warmup + repeat):
        t0 = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - t0
        if after is not None:
            after(result)
        del result
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


@contextlib.contextmanager
def launches_holding_gil(hold: bool) -> Iterator[None]:
    """Inside the block, kernels launch holding the GIL (``hold``, the library's way on local
    schedulers: see :class:`chunkernels.cuda.Kernel`) or through CuPy, releasing it around each
    launch: the benchmarks' rows that measure what holding it changes."""
    with mock.patch.object(cuda, "LAUNCH_HOLDS_GIL", True if hold else cuda.LAUNCH_HOLDS_GIL), \
            mock.patch.object(cuda, "LAUNCH_THROUGH_CUPY", not hold):
        yield


def dask_alone(*collections, **options) -> Callable[[], object]:
    """A run of the graph of Dask ``collections`` as it is, with every task's function replaced
    by one that returns at once: what Dask's own work on that graph costs on this host
    (optimising, ordering, scheduling, handing tasks to threads), to read a chunked run's time
    against. The no-op graph is made once (building the real graph, which the chunked rows
    time too, is left out); each call persists it with ``options`` (those of ``dask.persist``).
    """
    import dask

    from chunkernels._graph import with_noop_tasks

    stand_ins = [with_noop_tasks(c) for c in collections]
    return lambda: dask.persist(*stand_ins, **options)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m chunkernels.bench", description=__doc__)
    add_arguments(p)
    sys.exit(main(p.parse_args()))
