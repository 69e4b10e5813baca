"""``chunkernels bench``: options, outputs and the scaling benchmark end to end on CPU workers.

The benchmarks' numbers come from GPU machines; here the machinery around them runs for real:
the scaling module on a cluster of CPU worker processes and NumPy chunks, its result checks,
and the Markdown, JSON and PNG files it writes.
"""

from __future__ import annotations

import json
import sys

import dask.array as da
import numpy as np
import pytest

import chunkernels
from chunkernels import bench
from chunkernels.bench import scaling
from chunkernels.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_scaling_on_cpu_workers_writes_markdown_json_and_plots(tmp_path, capsys):
    code = main(["bench", "scaling", "--workers", "1", "2", "--size", "96", "--chunks", "48",
                 "--repeat", "1", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["scaling-speedup.png", "scaling-throughput.png", "scaling.json",
                     "scaling.md"]
    assert all((tmp_path / n).read_bytes().startswith(PNG) for n in names if n.endswith(".png"))

    report = json.loads((tmp_path / "scaling.json").read_text())
    assert report["shape"] == [96, 96] and report["dtype"] == "float32"
    assert report["halo"] == [16, 16]
    assert [(c["kind"], c["workers"], c["devices"], c["protocol"])
            for c in report["clusters"]] == [("cpu", 1, [], "tcp"), ("cpu", 2, [], "tcp")]
    assert {"numpy", "dask", "distributed"} <= set(report["environment"]["versions"])
    impls = list(scaling.implementations(scaling.HALO_PIPELINE))
    rows = report["rows"]
    assert [(r["workers"], r["impl"]) for r in rows] == [(w, i) for w in (1, 2) for i in impls]
    for r in rows:
        assert r["chunks"] == [48, 48] and r["blocks"] == 4
        assert r["seconds"] > 0 and r["GB/s"] == pytest.approx(96 * 96 * 4 / r["seconds"] / 1e9)
        assert r["memory"]["peak_above_start"] > 0 and r["memory"]["working"] >= 0
        assert r["speedup_over"] == 1
        assert r["speedup"] == (1.0 if r["workers"] == 1 else pytest.approx(
            next(q["seconds"] for q in rows if q["workers"] == 1 and q["impl"] == r["impl"])
            / r["seconds"]))
    ours = {r["workers"]: r for r in rows if r["impl"] == scaling.CHUNKERNELS}
    no_halo = {r["workers"]: r for r in rows if r["impl"] == scaling.NO_HALO}
    assert ours[2]["of_no_halo"] == pytest.approx(ours[2]["seconds"] / no_halo[2]["seconds"])
    assert report["chunk_halo_bytes"] == {"48x48": 80 * 80 * 4}
    assert report["pipeline_exchanges"] == 3

    md = (tmp_path / "scaling.md").read_text()
    assert md.startswith("### scaling: gaussian_filter σ=4, 96×96 float32 (36.00 kiB) on CPU "
                         "workers (")
    assert "Workers connected over TCP." in md
    # 4 blocks placed 2 and 2 on the workers; transfers and bytes moved per run reported
    assert "| 2 CPU workers | 48×48 | 2 / 2 | " in md
    assert "| 1 CPU worker | 48×48 | 4 | " in md
    for r in rows:
        assert r["blocks_per_worker"] == ([4] if r["workers"] == 1 else [2, 2])
        assert r["transfers_per_run"] >= 0 and r["bytes_moved_per_run"] >= 0
        if r["workers"] == 1:
            assert r["transfers_per_run"] == 0
    # the label of x < 0.4 on each cluster: the same labels, SciPy's at this size
    labels = report["labels"]
    assert [row["workers"] for row in labels] == [1, 2]
    assert labels[0]["count"] == labels[1]["count"] and labels[0]["scipy"] and labels[1]["scipy"]
    assert labels[0]["checksums"] == labels[1]["checksums"]
    assert "| 2 CPU workers | 48×48 | " in md.split("Label of")[1]
    assert "| chunkernels | 48×48 | 1.00× | " in md  # the speed-up table
    # where one more run's time goes: the profiled implementations and the label, every phase
    # inside the wall time, the tasks of the graph counted
    profiled = [r for r in rows if r["impl"] in scaling.PROFILED] + labels
    assert len(profiled) == 2 * (len(scaling.PROFILED) + 1)
    for r in profiled:
        p = r["profile"]
        assert p["tasks"] >= 4 and p["top"]
        assert 0 < p["build"] < p["wall"] and 0 < p["busy"] < p["wall"]
        assert p["to_first_task"] + p["after_last_task"] < p["wall"]
        assert p["transfers"] >= 0
    assert all("profile" not in r or r["profile"] is None for r in rows
               if r["impl"] not in scaling.PROFILED)
    assert "| 2 CPU workers | 48×48 | label (x < 0.4) | " in md.split("Where the time")[1]
    assert md.strip() in out  # printed as well
    assert "scaling" in err  # the progress display
    plots = {p["name"]: p for p in report["plots"]}
    assert plots["speedup"]["series"][0] == {"label": "ideal", "x": [1, 2], "y": [1.0, 2.0],
                                             "style": "k--"}
    assert plots["throughput"]["xticks"] == [48]


def test_demo_on_cpu_workers_beside_photutils_and_sep(tmp_path, capsys):
    """The demo's pipeline checked, then timed on CPU worker processes, and photutils (the same
    clipping, threshold and 4-connectivity: the same catalogue) and sep on the same image."""
    pytest.importorskip("photutils")
    pytest.importorskip("sep")
    code = main(["bench", "demo", "--workers", "1", "--size", "256", "--chunks", "128",
                 "--repeat", "1", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["shape"] == [256, 256] and report["chunk"] == [128, 128]
    (row,) = report["rows"]
    assert row["impl"] == "chunkernels on 1 CPU worker(s)" and row["blocks"] == 4
    assert row["count"] == report["sources"] > 0
    assert set(row["steps"]) == {"κσ clipping", "threshold + label", "measure"}
    assert row["seconds"] == pytest.approx(sum(row["steps"].values()))  # one run: the sum
    # the first run (the checked one) apart: its steps, and its sum
    assert set(row["first_steps"]) == set(row["steps"])
    assert row["first_run"] == pytest.approx(sum(row["first_steps"].values()))
    assert row["first_run"] > 0 and row["warm_up"] is None  # CPU workers compile nothing
    photutils, sep = report["peers"]
    assert (photutils["impl"], sep["impl"]) == ("photutils", "sep")
    assert photutils["count"] == photutils["matched"] == row["count"]
    assert photutils["offset_p95"] < 1e-6  # the same pixels, the same centroids
    assert 0 < sep["matched"] <= sep["count"]
    assert row["faster_than_peers"] == pytest.approx(
        min(photutils["seconds"], sep["seconds"]) / row["seconds"])
    md = (tmp_path / "demo.md").read_text()
    assert md.startswith("### demo\n") and "| chunkernels on 1 CPU worker(s) | 4 | " in md
    assert set(row["breakdown"]) == set(row["steps"])
    assert "| chunkernels on 1 CPU worker(s) | measure | " in md
    assert "| photutils | sigma_clipped_stats " in md and "| sep | Background " in md
    assert md.strip() in out


def test_demo_breakdown_says_where_a_steps_time_goes():
    """One more run under the task stream: per step, its tasks and their time, the busiest
    worker's share, the transfers, and the wall time outside the tasks; κσ clipping on a
    cluster runs in actors, not tasks."""
    from chunkernels import cluster
    from chunkernels.bench import demo

    with cluster.client(gpus=0, processes=True, n_workers=2, threads=1,
                        dashboard_address=None) as client:
        image = demo._sky((256, 256), (64, 64), False, client)
        demo._pipeline(image, client)  # as the benchmark: after runs (κσ's actors made)
        steps = demo._breakdown(image, client)
    assert list(steps) == list(demo.STEPS)
    for name, b in steps.items():
        assert b["wall"] > 0 and b["busiest"] <= b["task_time"] + 1e-9, (name, b)
        assert b["outside"] == pytest.approx(max(0.0, b["wall"] - b["busiest"]))
        assert b["busiest"] <= b["wall"] + 0.05, (name, b)  # clocks of one machine
    clip, labelling, measuring = (steps[n] for n in demo.STEPS)
    assert clip["tasks"] == 0 and clip["outside"] == pytest.approx(clip["wall"])
    # one graph for both: a pick a chunk and the measurements' tasks (a task per worker, a
    # combine), all started before the count is back; the measure step only waits for them
    assert labelling["tasks"] + measuring["tasks"] >= 16 + 3
    assert demo._breakdown(image, None) is None
    report = {"shape": [256, 256], "chunk": [64, 64], "seed": 0, "kappa": 3.0, "nsigma": 5.0,
              "sources": 1, "background": {"median": 0.0, "std": 1.0}, "repeat": 1,
              "match_px": 1.0, "peers": [],
              "rows": [{"impl": "chunkernels on 2 CPU worker(s)", "blocks": 16,
                        "steps": {n: 0.01 for n in demo.STEPS}, "seconds": 0.03,
                        "first_run": 0.03, "warm_up": None, "count": 1,
                        "faster_than_peers": None, "breakdown": steps}]}
    md = demo._markdown(report)
    assert "| chunkernels on 2 CPU worker(s) | threshold + label | " in md
    assert "| busiest worker (ms) | transfers |" in md


def test_demo_without_its_peers(monkeypatch):
    from chunkernels.bench import demo

    monkeypatch.setitem(sys.modules, "sep", None)  # import fails
    with pytest.raises(ImportError):
        demo._sep(np.zeros((8, 8), np.float32))
    report = {"shape": [8, 8], "chunk": [8, 8], "seed": 0, "kappa": 3.0, "nsigma": 5.0,
              "sources": 0, "background": {"median": 0.0, "std": 1.0}, "repeat": 1,
              "match_px": 1.0, "rows": [],
              "peers": [{"impl": "sep", "skipped": "sep is not installed: pip install x"}]}
    assert "| sep | sep is not installed: pip install x | - |" in demo._markdown(report)


def test_checks_catch_a_wrong_result_before_any_timing():
    """The windows straddle chunk corners and the array's edges, so a halo-less result (wrong near
    chunk edges) fails the whole-array check and passes the per-block one."""
    x = da.random.default_rng(0).random((100, 90), dtype=np.float32, chunks=(40, 35))
    gaussian = scaling.implementations(scaling.HALO_PIPELINE)[scaling.CHUNKERNELS][1]
    right = chunkernels.ndimage.gaussian_filter(x, scaling.SIGMA)
    no_halo = x.map_blocks(chunkernels.blockwise("gaussian_filter", sigma=scaling.SIGMA))
    scaling._check("chunkernels", right, x, gaussian, "array")
    scaling._check("no halo", no_halo, x, gaussian, "block")
    with pytest.raises(AssertionError, match=r"no halo is wrong on window \(slice\(16, 64"):
        scaling._check("no halo", no_halo, x, gaussian, "array")
    with pytest.raises(AssertionError, match=r"chunkernels is wrong on window .* of the 100x90 "
                                             r"array in chunks 40x35; not timing it"):
        scaling._check("chunkernels", right, x, gaussian, "block")
    wrong = chunkernels.ndimage.gaussian_filter(x, scaling.SIGMA, mode="nearest")
    with pytest.raises(AssertionError, match="is wrong on window"):
        scaling._check("chunkernels", wrong, x, gaussian, "array")


def test_the_issue_pipeline_needs_its_kernels():
    steps, why = scaling.pipeline_steps()
    # threshold and label are registered, but label is not blockwise: no pipeline takes it
    assert steps == scaling.HALO_PIPELINE
    assert why.startswith("gaussian_filter(sigma=4.0) → uniform_filter(size=5) → sobel(axis=0), "
                          "three halo kernels (the issue's chain cannot be one pipeline "
                          "(pipeline step label is not blockwise: ")


@pytest.mark.parametrize("text, ndim, expected", [
    ("32768", 2, (32768, 32768)),
    ("300x200", 2, (300, 200)),
    ("8", 3, (8, 8, 8)),
    ("4GiB", 2, (32768, 32768)),
    ("1 MiB", 2, (512, 512)),
    ("1000B", 1, (250,)),
])
def test_sizes(text, ndim, expected):
    assert bench.shape_of(text, ndim, np.float32) == expected


@pytest.mark.parametrize("text", ["0", "12x", "-5", "4 parsecs", "1.5", ""])
def test_bad_sizes_are_refused_by_the_parser(capsys, text):
    with pytest.raises(SystemExit) as info:
        main(["bench", "scaling", "--size", text])
    assert info.value.code == 2
    assert (f"argument --size: {text.strip()!r} is not a size: write a shape (32768x32768), the "
            f"side of a square or cube (32768), or a number of bytes with its unit (4GiB, 256MiB)"
            in capsys.readouterr().err)


def test_size_with_the_wrong_number_of_axes():
    with pytest.raises(ValueError, match=r"size '4x4x4' has 3 axes; this benchmark's arrays have "
                                         r"2: write NxN or one side"):
        bench.shape_of("4x4x4", 2, np.float32)


def test_defaults_and_clipping(monkeypatch):
    args = bench_args()
    assert bench.array_shape(args, (64, 64), np.float32) == (64, 64)
    assert bench.chunk_shapes(args, (64, 64), [(16, 16)], np.float32) == [(16, 16)]
    args = bench_args("--size", "100x50", "--chunks", "32", "64", "200", "16x8")
    shape = bench.array_shape(args, (64, 64), np.float32)
    assert shape == (100, 50)
    assert bench.chunk_shapes(args, shape, [(16, 16)], np.float32) == [(32, 32), (64, 50),
                                                                        (100, 50), (16, 8)]


def test_sweeps(monkeypatch):
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 0)
    assert bench.sweep(bench_args()) == [("cpu", 1), ("cpu", 2)]
    assert bench.sweep(bench_args(), workers=(3,)) == [("cpu", 3)]
    assert bench.sweep(bench_args("--workers", "1", "4")) == [("cpu", 1), ("cpu", 4)]
    assert bench.sweep(bench_args("--gpus", "0", "2")) == [("cpu", 0), ("gpu", 2)]
    assert bench.sweep(bench_args("--scheduler", "tcp://h:8786")) == [("scheduler", 0)]
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 6)
    assert bench.sweep(bench_args()) == [("gpu", 1), ("gpu", 2), ("gpu", 4), ("gpu", 6)]


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "argument --workers: '0' is not a whole number of at least 1"),
    (["--gpus", "-1"], "argument --gpus: '-1' is not a whole number of at least 0"),
    (["--gpus", "1", "--workers", "2"], "argument --workers: not allowed with argument --gpus"),
])
def test_cluster_option_errors(capsys, argv, message):
    with pytest.raises(SystemExit):
        main(["bench", *argv])
    assert message in capsys.readouterr().err


def test_without_a_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(chunkernels.cuda, "gpu_count", lambda: 0)
    assert main(["bench", "--out", str(tmp_path)]) == 2
    assert ("chunkernels bench needs a CUDA GPU and CuPy; none found here. On CPU workers: "
            "chunkernels bench scaling --workers 1 2 --size 2048") in capsys.readouterr().err
    assert main(["bench", "broadcast_add", "--out", str(tmp_path)]) == 2
    assert ("broadcast_add: skipped, it needs a CUDA GPU and CuPy; none found here"
            in capsys.readouterr().err)
    assert main(["bench", "nope"]) == 2
    assert (f"no benchmark for 'nope'; available: {', '.join(bench.BENCHMARKS)}"
            in capsys.readouterr().err)


def test_outputs_without_matplotlib_or_tqdm(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    monkeypatch.setitem(sys.modules, "tqdm", None)
    no_launches = {"driver": 0, "cupy": 0, "fallback_reasons": {}}
    monkeypatch.setattr(chunkernels.cuda, "launch_counts", lambda: no_launches)
    plot = {"name": "p", "title": "t", "xlabel": "x", "ylabel": "y",
            "series": [{"label": "a", "x": [1, 2], "y": [3, 4]}]}
    report = {"markdown": "### table", "value": np.float32(1.5), "plots": [plot]}
    written = bench.write_report("demo", report, tmp_path)
    assert [p.name for p in written] == ["demo.md", "demo.json"]
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["value"] == 1.5 and data["plots"] == [plot] and "date" in data["environment"]
    versions = bench.versions_line(data["environment"])
    assert versions.startswith(f"Versions: chunkernels {chunkernels.__version__}, Python ")
    assert ", NumPy " in versions and ", Dask " in versions and versions.endswith(".")
    assert (tmp_path / "demo.md").read_text() == f"### table\n\n{versions}\n"
    with bench.Progress(2, "demo") as progress:
        with progress.run("first"):
            progress.note("a note")
        with progress.run("second"):
            pass
    err = capsys.readouterr().err
    assert ("demo: PNG plots not written, matplotlib is not installed (pip install "
            "'chunkernels[bench]'); the JSON holds their data") in err
    assert ("demo: 2 runs (tqdm is not installed, so no progress bar: pip install "
            "'chunkernels[bench]')\ndemo [1/2] first\na note\ndemo [2/2] second\n") in err


def test_plots_are_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    plot = {"name": "p", "title": "t", "xlabel": "x", "ylabel": "y", "xlog": 2, "xticks": [1, 4],
            "series": [{"label": "a", "x": [1, 4], "y": [3, 4]},
                       {"label": "b", "x": [1, 4], "y": [1, 4], "style": "k--"}]}
    (path,) = bench.write_plots("demo", [plot], tmp_path)
    assert path == tmp_path / "demo-p.png" and path.read_bytes().startswith(PNG)


def test_wall_median_runs_after_outside_the_clock():
    calls = []
    t = bench.wall_median(lambda: len(calls), 3, warmup=1, after=calls.append)
    assert calls == [0, 1, 2, 3] and t >= 0


def bench_args(*argv):
    """The parsed options of ``chunkernels bench ARGV``."""
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.gpu
def test_scaling_on_gpus(tmp_path, capsys):
    """The module end to end on GPU workers (1, and 2 where there are two): CuPy chunks, every
    implementation checked, device names recorded, peak memory measured in CuPy's pool."""
    pytest.importorskip("dask_cuda")
    counts = ["1", "2"] if chunkernels.cuda.gpu_count() > 1 else ["1"]
    code = main(["bench", "scaling", "--gpus", *counts, "--size", "2048", "--chunks", "512",
                 "1024", "--repeat", "1", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "scaling.json").read_text())
    assert [c["workers"] for c in report["clusters"]] == [int(n) for n in counts]
    assert all(c["kind"] == "gpu" and len(c["devices"]) == c["workers"]
               for c in report["clusters"])
    assert "cupy" in report["environment"]["versions"]
    unit = report["chunk_halo_bytes"]
    for r in report["rows"]:
        assert r["seconds"] > 0
        if r["impl"] == scaling.CHUNKERNELS:
            # A task needs its block with the halo and two passes' outputs, about 3 chunks; the
            # measure (the most bytes in use in CuPy's pool at any allocation) adds whatever
            # results wait for the scheduler's word to free them. Measured by the pool's total
            # instead (cached blocks included) it moved between 2.2 and 13.2 chunks from run to
            # run on one H100, and reached 18.3 of the 16 blocks once with seven other test
            # processes loading the host. What must hold: finished tasks' intermediates are not
            # all kept, so well under two arrays of blocks.
            chunk = unit["x".join(map(str, r["chunks"]))]
            assert 0 < r["memory"]["working"] < 2 * r["blocks"] * chunk, r
    assert (tmp_path / "scaling-throughput.png").read_bytes().startswith(PNG)


def test_peak_allocator_keeps_the_most_bytes_in_use_not_the_pools_cache():
    """The GPU memory measure: the pool's bytes in use after each allocation, at their most,
    whatever the pool caches after frees."""

    class Pool:  # CuPy's MemoryPool as the measure sees it
        def __init__(self):
            self.used, self.total = 100, 100

        def used_bytes(self):
            return self.used

        def malloc(self, size):
            self.used += size
            self.total = max(self.total, self.used)
            return size

        def free(self, size):  # back to the pool's cache: its total stays
            self.used -= size

    pool = Pool()
    peak = scaling._PeakAllocator(pool)
    assert peak.peak == 100
    for size in (50, 30):
        assert peak.malloc(size) == size
    pool.free(80)
    assert peak.malloc(20) == 20 and pool.used == 120
    assert peak.peak == 180
    pool.free(20)
    pool.malloc(500)  # outside the allocator (Numba through the pool): seen from the next one
    assert peak.peak == 180
    peak.malloc(10)
    assert peak.peak == 610
    pool.free(610)
    peak.malloc(5)
    assert peak.peak == 610 and pool.used == 5


def test_gpu_memory_measure_installs_the_allocator_and_puts_the_pools_back(monkeypatch):
    """A GPU worker's memory run: the measuring allocator is CuPy's from its start to its end,
    then the pool's again; a measure a failed run left installed starts afresh; an allocator
    that is neither (RMM's absent) is not measured."""
    import types

    class Pool:
        def __init__(self):
            self.used = 1000

        def used_bytes(self):
            return self.used

        def malloc(self, size):
            self.used += size
            return size

    pool = Pool()
    current = {"allocator": pool.malloc}
    device = types.SimpleNamespace(synchronize=lambda: None)
    fake = types.SimpleNamespace(
        get_default_memory_pool=lambda: pool,
        cuda=types.SimpleNamespace(Device=lambda: device,
                                   get_allocator=lambda: current["allocator"],
                                   set_allocator=lambda a: current.update(allocator=a)))
    monkeypatch.setattr(scaling.cuda, "cupy", lambda: fake)
    monkeypatch.setattr(scaling, "_PEAK", None)
    assert scaling._memory_start(True) == 1000
    current["allocator"](300)  # a task's allocation, through CuPy's current allocator
    pool.used -= 300
    assert scaling._memory_end(True) == (1000, 1300)
    assert current["allocator"] == pool.malloc
    scaling._memory_start(True)  # a run that fails: its end never comes
    left = current["allocator"]
    assert left != pool.malloc
    assert scaling._memory_start(True) == 1000 and current["allocator"] != left
    current["allocator"](50)
    assert scaling._memory_end(True) == (1050, 1050)
    current["allocator"] = lambda size: size  # another allocator, not RMM's
    assert scaling._memory_start(True) is None


def test_dask_alone_runs_the_same_graph_with_no_task_doing_work():
    """bench.dask_alone: every key of the collections' graph is scheduled (persist gives the same
    keys and chunks back), and none of the real task functions runs."""
    import dask.array as da

    from chunkernels import ndimage

    calls = []

    def counted(block):
        calls.append(block.shape)
        return block + 1

    x = da.from_array(np.arange(64.0).reshape(8, 8), chunks=3)
    y = x.map_blocks(counted, dtype=x.dtype)
    calls.clear()  # map_blocks' meta inference called it on an empty block
    labels, n = ndimage.label(x > 20)
    run = bench.dask_alone(y, labels, n, scheduler="sync")
    y2, labels2, n2 = run()
    assert calls == []
    assert y2.chunks == y.chunks and y2.name == y.name and labels2.chunks == labels.chunks
    assert set(y2.__dask_graph__()) == set(y.__dask_keys__()[i][j] for i in range(3)
                                           for j in range(3))
    assert all(v is None for v in y2.__dask_graph__().values())
    assert n2.name == n.name


def test_launches_holding_gil_switches_and_restores():
    """The benchmarks' comparison rows launch through CuPy inside the block; the library's
    setting comes back after it, an exception included."""
    from chunkernels import cuda
    from chunkernels.bench import launches_holding_gil

    assert cuda.LAUNCH_HOLDS_GIL == "auto" and not cuda.LAUNCH_THROUGH_CUPY
    with launches_holding_gil(False):
        assert cuda.LAUNCH_THROUGH_CUPY
        with launches_holding_gil(True):
            assert cuda.LAUNCH_HOLDS_GIL is True and not cuda.LAUNCH_THROUGH_CUPY
        assert cuda.LAUNCH_THROUGH_CUPY and cuda.LAUNCH_HOLDS_GIL == "auto"
    assert cuda.LAUNCH_HOLDS_GIL == "auto" and not cuda.LAUNCH_THROUGH_CUPY
    with pytest.raises(RuntimeError), launches_holding_gil(False):
        raise RuntimeError("a failed run")
    assert not cuda.LAUNCH_THROUGH_CUPY


def test_reports_say_how_kernels_were_launched(tmp_path, monkeypatch):
    """The JSON holds chunkernels.cuda.launch_counts(); the Markdown says it in a line, with
    the reason of any fallback, once the process has launched kernels."""
    from chunkernels import cuda

    counts = {"driver": 120, "cupy": 7, "fallback_reasons": {"an old driver": 5}}
    monkeypatch.setattr(cuda, "launch_counts", lambda: counts)
    report = {"markdown": "### table"}
    bench.write_report("demo", report, tmp_path)
    assert json.loads((tmp_path / "demo.json").read_text())["environment"]["launches"] == counts
    line = ("Kernel launches in this process so far: 120 through the driver (chunkernels' "
            "launch), 7 through CuPy (fallbacks: 5 because an old driver).")
    versions = bench.versions_line(report["environment"])
    assert (tmp_path / "demo.md").read_text() == f"### table\n\n{versions}\n\n{line}\n"
    assert report["markdown"].endswith(line)  # printed too
    counts.update(driver=3, cupy=0, fallback_reasons={})
    bench.write_report("demo", {"markdown": "### t"}, tmp_path)
    assert (tmp_path / "demo.md").read_text().endswith(
        "3 through the driver (chunkernels' launch), 0 through CuPy.\n")


def test_the_launch_benchmark_times_rounds_of_threads_and_writes_its_tables():
    """Its machinery without a GPU: rounds of threads launching at once (each into its own
    output, the clock around them all), round-trip statistics and the Markdown tables."""
    from chunkernels.bench import launch

    calls, syncs = [], []
    lock = __import__("threading").Lock()

    def fake_launch(x, y, a, b):
        with lock:
            calls.append(id(y))

    outputs = [object() for _ in range(3)]
    times = launch._rounds(fake_launch, None, outputs, 1, 2, 4, lambda: syncs.append(1))
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert sorted(set(calls)) == sorted(map(id, outputs))
    assert len(calls) == 5 * 3 * launch.LAUNCHES  # a warm-up round, then 4 timed
    assert len(syncs) == 6

    def failing(x, y, a, b):
        raise KeyError("no such kernel")

    with pytest.raises(KeyError, match="no such kernel"):
        launch._rounds(failing, None, outputs, 1, 2, 2, lambda: None)

    assert launch._spread([0.003, 0.001, 0.002, 0.010]) == {
        "median_ms": pytest.approx(2.5), "p90_ms": pytest.approx(10.0), "max_ms": 10.0}
    host = [{"way": w, "threads": t, "us_per_launch": u, "round_ms": 1.0, "of_cupy": o}
            for w, t, u, o in (("chunkernels, GIL held (ctypes.PyDLL)", 1, 2.5, 0.5),
                               ("CuPy RawKernel", 8, 5.0, 1.0))]
    loop = {"idle": {"median_ms": 0.5, "p90_ms": 0.6, "max_ms": 0.9},
            "rows": [{"setting": "held (1)", "holds_gil": True, "samples": 12,
                      "median_ms": 40.0, "p90_ms": 55.0, "max_ms": 70.0, "launch_s": 0.39,
                      "total_s": 0.41}]}
    md = launch._markdown({"device": "GPU", "date": "today", "cupy": "14", "threads": 8,
                           "launches_per_round": 100, "host": host, "loop": loop,
                           "flood": {"launches": 4000, "spin_us": 100, "floods": 3}})
    assert "| chunkernels, GIL held (ctypes.PyDLL) | 1 | 2.50 | 0.50× |" in md
    assert "| CuPy RawKernel | 8 | 5.00 | 1.00× |" in md
    assert "| held (1) | yes | 12 | 40.00 | 55.00 | 70.00 | 0.390 | 0.410 |" in md
    assert "idle worker: median 0.50 ms, largest 0.90 ms" in md


@pytest.mark.gpu
def test_the_launch_benchmark_on_a_gpu(tmp_path, capsys, monkeypatch):
    """End to end: every way's result checked and timed from 1 and 8 threads, then a worker
    flooded with each GIL setting; "auto" releases the GIL there, and every launch went
    through the driver (none fell back to CuPy's)."""
    pytest.importorskip("dask_cuda")
    from chunkernels.bench import launch

    monkeypatch.setattr(launch, "FLOODS", 1)
    code = main(["bench", "launch", "--repeat", "3", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "launch.json").read_text())
    assert [(h["way"], h["threads"]) for h in report["host"]] == [
        (way, n) for way in launch.WAYS for n in (1, launch.THREADS)]
    assert all(h["us_per_launch"] > 0 for h in report["host"])
    rows = {r["setting"]: r for r in report["loop"]["rows"]}
    assert [rows[s]["holds_gil"] for s in launch.SETTINGS] == [True, False, False]
    for r in rows.values():
        assert r["samples"] > 0 and r["worker_launch_counts"]["fallback_reasons"] == {}
    launches = report["environment"]["launches"]
    assert launches["driver"] > 0 and launches["fallback_reasons"] == {}
    assert "through the driver" in (tmp_path / "launch.md").read_text()


def test_capacity_on_cpu_workers(tmp_path, capsys):
    """The capacity run end to end on CPU workers: every cluster completes, with the same
    labels, blocks placed evenly, peaks and the bound reported."""
    code = main(["bench", "capacity", "--workers", "1", "2", "--size", "160", "--chunks", "48",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "capacity.json").read_text())
    rows = report["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    assert all(r["outcome"] == "completed" for r in rows)
    assert rows[0]["count"] == rows[1]["count"] > 0
    assert rows[0]["checksums"] == rows[1]["checksums"]
    assert rows[1]["blocks_per_worker"] == [8, 8]
    assert set(rows[0]["steps"]) == {"make", "filter", "label"}
    # 160² elements: SciPy's int32 labels. Each step's peak is the worker's own share of the
    # output (the bytes of the blocks it holds) plus its working memory, bounded by four of the
    # step's chunks (the filter's with their halo). In 48² chunks the tiles of two workers are
    # rows 0-1 (96 rows) and rows 2-3 (48 + 16 rows), whose shares differ; where the
    # scheduler runs a block's task (stealing moves some on CPU workers) decides the output's.
    assert report["label_dtype"] == "int32"
    for r in rows:
        for step, chunk in (("filter", report["chunk_halo_bytes"]), ("label", 48 * 48 * 4)):
            m = r["memory"][step]
            if r["workers"] == 1:
                assert m["share"] == 160 * 160 * 4
            else:
                assert 0 < m["share"] < 160 * 160 * 4 and m["share"] % (16 * 4) == 0
            assert m["peak_above_start"] == m["share"] + m["working"] > 0
            assert m["chunk"] == chunk and m["limit"] == 4 * chunk
    md = (tmp_path / "capacity.md").read_text()
    assert "| 2 CPU workers | completed | 8 / 8 |" in md
    assert "| filter: peak = share + working | label: peak = share + working |" in md
    assert " chunks)" in md


def test_capacity_reports_a_step_that_does_not_finish(monkeypatch):
    """A step past its time is reported and cancelled: the benchmark never hangs."""
    import argparse

    from chunkernels.bench import capacity

    def never(*args, **kwargs):
        raise TimeoutError
    monkeypatch.setattr("distributed.wait", never)
    args = argparse.Namespace(size="96", chunks=["48"], timeout=1.0, workers=[1], gpus=None,
                              scheduler=None)
    report = capacity.run(args)
    assert report["rows"][0]["outcome"] == "make: did not finish in 1 s (cancelled)"


def _fails_on_the_last_block(block, block_info=None):
    if block_info[0]["chunk-location"] == tuple(n - 1 for n in block_info[0]["num-chunks"]):
        raise MemoryError("out of memory on the last block")
    return block


def test_capacity_reports_a_step_with_a_failed_block_as_failed(monkeypatch):
    """``distributed.wait`` returns once every block is done, failed or not: a step with a
    failed block is reported by its error, not timed as if it completed."""
    import argparse

    from chunkernels.bench import capacity

    monkeypatch.setattr(capacity.ndimage, "gaussian_filter",
                        lambda x, sigma: x.map_blocks(_fails_on_the_last_block, dtype=x.dtype))
    args = argparse.Namespace(size="96", chunks=["48"], timeout=60.0, workers=[2], gpus=None,
                              scheduler=None)
    (row,) = capacity.run(args)["rows"]
    assert row["outcome"] == "filter: MemoryError: out of memory on the last block"
    assert "filter" not in row["steps"] and "make" in row["steps"]


def test_labels_too_large_to_compare_whole_are_compared_with_scipy_by_block_checksums():
    import scipy.ndimage as ndi

    rng = np.random.default_rng(7)
    host = rng.random((96, 80)) < scaling.FOREGROUND
    image = da.from_array(host, chunks=(48, 32))  # uneven: 2 × 3 blocks, the last 16 wide
    want, n = ndi.label(host)
    sums = da.from_array(want, chunks=image.chunks).map_blocks(
        scaling._block_checksum, dtype=np.int64, chunks=(1, 2))
    check = {"count": n, "checksums": np.asarray(sums.compute()).tolist()}
    scaling._scipy_checksums(image, check)
    assert check["scipy"] == "checksums"

    # one pixel labelled otherwise in one block: caught, and the block named
    wrong = want.copy()
    wrong[60, 45] = n + 1
    sums = da.from_array(wrong, chunks=image.chunks).map_blocks(
        scaling._block_checksum, dtype=np.int64, chunks=(1, 2))
    bad = {"count": n, "checksums": np.asarray(sums.compute()).tolist()}
    with pytest.raises(AssertionError, match=r"differs from SciPy's in 1 of 6 blocks, e\.g\. "
                                             r"block row 1, checksum pair 1"):
        scaling._scipy_checksums(image, bad)
    with pytest.raises(AssertionError, match=f"{n + 3} labels, SciPy finds {n}"):
        scaling._scipy_checksums(image, {**check, "count": n + 3})


def test_demo_reference_is_kept_beside_the_results_and_read_back_for_the_same_image(
        tmp_path, monkeypatch):
    from chunkernels.bench import demo
    from chunkernels.sources import synthetic_sky

    image, _ = synthetic_sky(192, chunks=96, seed=3)
    data = image.compute()
    first = demo._cached_reference(data, tmp_path)
    (saved,) = tmp_path.glob("demo-reference-192x192-*.npz")

    def not_again(data):
        raise AssertionError("the reference was computed again")

    monkeypatch.setattr(demo, "_reference", not_again)
    again = demo._cached_reference(data, tmp_path)
    assert again["background"] == first["background"]
    assert type(again["background"].median) is type(first["background"].median)
    assert (again["count"], again["level"]) == (first["count"], first["level"]) and again["count"]
    for key in ("x", "y", "flux"):
        np.testing.assert_array_equal(again[key], first[key])
    # another image (one pixel): not read from that file
    other = data.copy()
    other[5, 7] += 1
    with pytest.raises(AssertionError, match="computed again"):
        demo._cached_reference(other, tmp_path)
    assert [p.name for p in tmp_path.glob("demo-reference-*")] == [saved.name]


def test_scaling_checks_the_chunk_corner_where_the_workers_tiles_meet():
    x = da.zeros((65536, 65536), chunks=8192, dtype=np.float32)
    windows = [w for w, _ in scaling._windows(x, (16, 16), per_block=False)]
    assert (slice(32744, 32792), slice(32744, 32792)) in windows  # 4 tiles of 4 × 4 blocks meet
    assert (slice(8168, 8216), slice(8168, 8216)) in windows and len(windows) == 4
    # no second window where the middle corner is the first one, or an axis is one chunk
    assert len(list(scaling._windows(da.zeros((96, 96), chunks=48), (16, 16),
                                     per_block=False))) == 3
    assert len(list(scaling._windows(da.zeros((96, 90), chunks=(48, 90)), (16, 16),
                                     per_block=False))) == 3


def _end_and_count(gpu, dask_worker=None):  # client.run passes the worker
    from distributed import default_client

    # the result's blocks the client still holds (its futures' references), and the worker
    wanted = default_client().refcount
    dask_worker.held_at_end = (
        sum(1 for k, n in wanted.items() if isinstance(k, tuple) and k[0] == "held-result" and n),
        sum(1 for k in dask_worker.data if isinstance(k, tuple) and k[0] == "held-result"))
    return _REAL_MEMORY_END(gpu)


_REAL_MEMORY_END = scaling._memory_end


def test_scaling_measures_memory_while_the_result_is_held(monkeypatch):
    """The memory run ends while its result is held: what a worker holds then (its input and
    its share of the result) is what the working memory is taken beside. Dropped first, the
    result's blocks were on their way out, and a worker seemed to hold less than its share."""
    from distributed import Client, LocalCluster

    monkeypatch.setattr(scaling, "_memory_end", _end_and_count)
    monkeypatch.setattr(scaling, "_check", lambda *args: None)
    build = lambda x: x.map_blocks(np.add, 1.0, name="held-result")  # noqa: E731
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as lc, Client(lc) as client:
        x = client.persist(da.ones((64, 64), chunks=16))
        row = scaling._measure(client, False, x, "map_blocks", build, None, "twin", 1)
        (worker,) = lc.workers.values()
        assert worker.held_at_end == (16, 16)
    assert row["memory"]["working"] >= 0
