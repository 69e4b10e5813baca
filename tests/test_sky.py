"""The synthetic sky's GPU kernel (``kernels_cuda/synthetic_sky.cu``) against the CPU reference.

The reference (``render_reference`` on NumPy chunks) defines every pixel. Here:

* the sources each chunk's task carries, and each tile of the kernel lists, are exactly those a
  brute-force test of every source's box against the chunk (the tile) finds, in list order;
* the kernel's argument layouts (``SkyChunk``, the source row, the tile) are those of the CUDA
  source;
* without a GPU, the kernel's pixel code compiled for the CPU by nvcc and run tile by tile, thread
  by thread, gives the reference's noise integers exactly and its float32 pixels but for a few
  one-ulp differences (glibc's exp, log and cos against NumPy's);
* on a GPU (``gpu`` marker), the kernel's chunks against the reference's the same way: noise
  integers identical, float32 pixels equal or one ulp apart, the differing pixels counted and
  bounded, for several shapes and chunkings (edge chunks, one-row and one-column chunks, sources
  straddling chunk borders, chunks no source reaches, an image without sources).
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from chunkernels import cuda
from chunkernels.bench.sky import differing_pixels, graph_bytes
from chunkernels.sources import _sky, synthetic_sky
from chunkernels.sources._sky import (TRUNCATE, chunk_sources, kernel_arguments, render_table,
                                      sky_sources)

da = pytest.importorskip("dask.array")

#: Of the float32 pixels, at most this fraction (and 2 more) may differ from the reference's, each
#: by one ulp: CUDA's exp, log and cos differ from NumPy's in the last bits of some float64 values,
#: and a float32 rounding moves where a value lies that close to a rounding boundary. (On the CPU,
#: with every exp, log and cos result moved by one or two ulps, none of the 8192² sky's pixels
#: moved; one in 10**8 is what the roundings' odds give.)
DIFFERING_FRACTION = 1e-6

SHAPES_AND_CHUNKS = [
    ((300, 257), (128, 100)),  # edge chunks of every size
    ((300, 257), (1, 257)),  # one-row chunks
    ((300, 257), (300, 1)),  # one-column chunks
    ((300, 257), (77, 31)),
    ((384, 384), (384, 384)),  # one chunk
    ((700, 650), (256, 200)),  # extended sources straddling borders and tiles
    ((31, 33), (16, 16)),  # smaller than a tile
]


def _brute_force(truth, noise, location):
    """The sources reaching a chunk, as ``_render`` found them before the source table: every
    source's box from its radius, clipped to the chunk."""
    (r0, r1), (c0, c1) = location
    radius = truth["sigma_major"] * np.sqrt(2 * np.log(truth["peak"] / (TRUNCATE * noise)))
    first_row = np.maximum(r0, np.ceil(truth["y"] - radius)).astype(np.int64)
    end_row = np.minimum(r1, np.floor(truth["y"] + radius).astype(np.int64) + 1)
    first_col = np.maximum(c0, np.ceil(truth["x"] - radius)).astype(np.int64)
    end_col = np.minimum(c1, np.floor(truth["x"] + radius).astype(np.int64) + 1)
    return np.flatnonzero((first_row < end_row) & (first_col < end_col))


def _locations(chunks):
    starts = [np.cumsum((0, *c)) for c in chunks]
    return {index: tuple((int(s[i]), int(s[i + 1])) for s, i in zip(starts, index))
            for index in np.ndindex(*(len(c) for c in chunks))}


# -- which sources each task and each tile gets ---------------------------------------------------

@pytest.mark.parametrize("shape, chunks", [
    *SHAPES_AND_CHUNKS,
    ((1000, 800), (64, 64)),
    ((1000, 800), ((0, 500, 0, 500), (800, 0))),  # zero-size chunks
    ((8192, 8192), (2048, 2048)),
])
def test_each_chunk_gets_the_sources_a_brute_force_search_finds(shape, chunks):
    noise = 0.01
    truth = sky_sources(shape, seed=3, noise=noise)
    chunks = da.core.normalize_chunks(chunks, shape)
    selected = chunk_sources(render_table(truth, shape, noise)["box"], chunks)
    locations = _locations(chunks)
    assert selected.keys() == locations.keys()
    straddling = np.zeros(len(truth["id"]), dtype=int)
    for index, location in locations.items():
        assert np.array_equal(selected[index], _brute_force(truth, noise, location)), index
        straddling[selected[index]] += 1
    if np.prod([len(c) for c in chunks]) >= 16:
        assert (straddling > 1).any()  # the finer chunkings do cut sources


def test_the_per_task_source_table_is_small():
    image, truth = synthetic_sky(8192, chunks=2048)
    tables = [task.args[1] for task in dict(image.__dask_graph__()).values()]
    assert len(tables) == 16
    # each task carries a sixteenth of the sources, plus those straddling its borders
    assert sum(len(t) for t in tables) < 1.1 * len(truth["id"])
    assert all(t.dtype == _sky.TABLE for t in tables)
    # 7508 sources: the whole list in every task was 549 kB a task, 8.8 MB for the 16
    size = graph_bytes(image)
    assert size["largest_task"] < 60_000 and size["tasks"] < 800_000, size


def test_the_benchmarks_table():
    from chunkernels.bench import sky

    report = {"device": "GPU", "date": "today", "cupy": "14", "shape": [64, 64], "chunk": [32, 32],
              "sources": 3, "first_run_s": 1.5, "issue_22_seconds": [2.42, 3.34],
              "differing_pixels": {"count": 1, "near_zero": 0, "max_ulps": 1.0},
              "runs": [{"impl": "chunkernels, computed", "seconds": 0.0123}],
              "launch": {"location": [[32, 64], [32, 64]], "sources": 2, "gpu_s": 1e-4,
                         "cpu_s": 2e-4},
              "graph_bytes": {"whole": 1000, "tasks": 1100, "largest_task": 300}}
    md = sky._markdown(report)
    assert md.startswith("### sky on GPU (today, CuPy 14)\n\n`synthetic_sky(64x64, chunks=32x32, "
                         "gpu=True)`, 3 sources")
    assert "1 of 4096 float32 pixels differ, by at most 1 ulp (0 of them near zero" in md
    assert "| chunkernels, computed | 12.3 |" in md
    assert "per-source loop at 2.42–3.34 s" in md and "largest task 300 bytes" in md


def test_differing_pixels_allows_one_ulp_and_near_zero_roundings():
    want = np.array([1.0, 0.5, 1e-20, 2.0, -3.0], np.float32)
    got = want.copy()
    got[0] = np.nextafter(want[0], np.float32(2))
    got[2] = np.float32(3e-20)  # near zero: terms the size of the noise cancelled
    assert differing_pixels(got, want) == {"count": 2, "near_zero": 1, "max_ulps": 1.0}
    assert differing_pixels(want, want) == {"count": 0, "near_zero": 0, "max_ulps": 0.0}
    got[3] = np.nextafter(np.nextafter(want[3], np.float32(3)), np.float32(3))
    with pytest.raises(AssertionError, match=r"differs from the CPU reference by more than one "
                                             r"float32 ulp at pixels \[\[3\]\]"):
        differing_pixels(got, want)


def _tile_lists(offsets, members, tiles):
    return [members[offsets[t]:offsets[t + 1]] for t in range(tiles)]


@pytest.mark.parametrize("shape, chunks", SHAPES_AND_CHUNKS[:4] + SHAPES_AND_CHUNKS[5:])
def test_each_tile_lists_the_sources_that_meet_it_in_list_order(shape, chunks):
    noise, seed = 0.01, 5
    truth = sky_sources(shape, seed=seed, noise=noise)
    table = render_table(truth, shape, noise)
    for location in _locations(da.core.normalize_chunks(chunks, shape)).values():
        (r0, r1), (c0, c1) = location
        data, chunk = kernel_arguments(location, table, shape=shape, seed=seed, noise=noise)
        parts = _unpack(data, chunk)
        reach = _brute_force(truth, noise, location)
        assert chunk["sources"][0] == len(reach)
        assert np.array_equal(parts["fields"][:, 0], truth["y"][reach])
        assert np.array_equal(parts["fields"][:, 1], truth["x"][reach])
        tiles_y, tiles_x = -(-(r1 - r0) // _sky.TILE), -(-(c1 - c0) // _sky.TILE)
        assert (chunk["tiles_y"][0], chunk["tiles_x"][0]) == (tiles_y, tiles_x)
        box = parts["box"]
        assert (box[:, 0] >= 0).all() and (box[:, 1] <= r1 - r0).all()
        assert (box[:, 2] >= 0).all() and (box[:, 3] <= c1 - c0).all()
        lists = _tile_lists(parts["offsets"], parts["members"], tiles_y * tiles_x)
        for t, listed in enumerate(lists):
            ty, tx = divmod(t, tiles_x)
            y0, x0 = ty * _sky.TILE, tx * _sky.TILE
            meets = np.flatnonzero((box[:, 0] < y0 + _sky.TILE) & (box[:, 1] > y0)
                                   & (box[:, 2] < x0 + _sky.TILE) & (box[:, 3] > x0))
            assert np.array_equal(listed, meets), (location, t)


def _unpack(data, chunk):
    """The sections of ``data`` as the kernel reads them."""
    n, entries = int(chunk["sources"][0]), int(chunk["entries"][0])
    tiles = int(chunk["tiles_x"][0] * chunk["tiles_y"][0])
    doubles = n * len(_sky.KERNEL_FIELDS) * 8
    ints = data[doubles:].view(np.int32)
    assert ints.size == 4 * n + tiles + 1 + entries
    offsets = ints[4 * n:4 * n + tiles + 1]
    assert offsets[0] == 0 and offsets[-1] == entries and (np.diff(offsets) >= 0).all()
    return {"fields": data[:doubles].view(np.float64).reshape(n, len(_sky.KERNEL_FIELDS)),
            "box": ints[:4 * n].reshape(n, 4), "offsets": offsets,
            "members": ints[ints.size - entries:]}


def test_kernel_layouts_are_the_cuda_sources():
    source = (cuda.source_dir() / _sky.CUDA_SOURCE).read_text()
    struct = re.search(r"struct SkyChunk \{(.*?)\};", source, re.DOTALL).group(1)
    names = re.findall(r"(\w+)(?=\s*[,;])", re.sub(r"//.*", "", struct))
    assert tuple(names) == _sky.CHUNK.names
    assert _sky.CHUNK.itemsize == 8 * len(names)
    define = dict(re.findall(r"#define (SKY_\w+) (\S+)", source))
    assert int(define["SKY_TILE"]) == _sky.TILE
    assert (_sky.TILE, int(define["SKY_BLOCK_ROWS"])) == _sky.BLOCK
    assert int(define["SKY_FIELDS"]) == len(_sky.KERNEL_FIELDS)
    for i, field in enumerate(_sky.KERNEL_FIELDS):
        assert int(define[f"SKY_{field.upper()}"]) == i, field


def test_an_image_without_sources():
    image, truth = synthetic_sky((5, 7), chunks=3, seed=0)
    assert len(truth["id"]) == 0
    data = image.compute()
    assert data.shape == (5, 7) and np.isfinite(data).all()
    data, chunk = kernel_arguments(((0, 5), (0, 7)), render_table(truth, (5, 7), 0.01),
                                   shape=(5, 7), seed=0, noise=0.01)
    assert chunk["sources"][0] == 0 and chunk["entries"][0] == 0
    assert np.array_equal(data.view(np.int32), [0, 0])  # one tile, empty


# -- the kernel's pixel code against the reference --------------------------------------------------

def _reference(shape, chunks, seed, noise=0.01):
    truth = sky_sources(shape, seed=seed, noise=noise)
    table = render_table(truth, shape, noise)
    chunks = da.core.normalize_chunks(chunks, shape)
    rows = chunk_sources(table["box"], chunks)
    for index, location in _locations(chunks).items():
        yield location, table[rows[index]], _sky.render_reference(
            location, table[rows[index]], shape=shape, seed=seed, noise=noise)


def _draws(location, width, seed):
    """The reference's two SplitMix64 outputs of each pixel (as ``gaussian_noise`` draws them)."""
    (r0, r1), (c0, c1) = location
    u64 = np.uint64
    key = u64(_sky._mix_int(seed * _sky._GOLDEN + 1))
    index = (np.arange(r0, r1, dtype=u64)[:, None] * u64(width)
             + np.arange(c0, c1, dtype=u64)[None, :])
    return np.stack([_sky._mix(key + (index * u64(2) + u64(k)) * u64(_sky._GOLDEN))
                     for k in (1, 2)], axis=-1)


def _compare(got, want, what):
    """The number of float32 pixels of ``got`` that differ from ``want`` (the benchmark's check:
    each one float32 ulp off at most, or ``1e-12`` of the noise near zero)."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32, what
    return differing_pixels(got, want)["count"]


def _harness_source(source_dir) -> str:
    return f"""// tests/test_sky.py: kernels_cuda/synthetic_sky.cu's pixel code run on the CPU
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "{source_dir}/synthetic_sky.cu"

static std::vector<unsigned char> slurp(const std::string& path) {{
    std::vector<unsigned char> bytes;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return bytes;
    unsigned char buffer[65536];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes.insert(bytes.end(), buffer, buffer + n);
    std::fclose(f);
    return bytes;
}}

static void spill(const std::string& path, const void* data, size_t nbytes) {{
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(data, 1, nbytes, f);
    std::fclose(f);
}}

// each argument P: P.chunk (a SkyChunk) and P.data in, P.out (float32) and P.draws out
int main(int argc, char** argv) {{
    for (int a = 1; a < argc; ++a) {{
        const std::string prefix = argv[a];
        SkyChunk chunk;
        std::memcpy(&chunk, slurp(prefix + ".chunk").data(), sizeof chunk);
        const std::vector<unsigned char> bytes = slurp(prefix + ".data");
        std::vector<double> data((bytes.size() + 7) / 8);  // aligned for the doubles
        std::memcpy(data.data(), bytes.data(), bytes.size());
        const long long n = chunk.rows * chunk.cols;
        std::vector<float> out(n);
        for (long long tile = 0; tile < chunk.tiles_x * chunk.tiles_y; ++tile)
            for (int ty = 0; ty < SKY_BLOCK_ROWS; ++ty)
                for (int tx = 0; tx < SKY_TILE; ++tx)
                    sky_pixels(out.data(), reinterpret_cast<const unsigned char*>(data.data()),
                               chunk, tile, tx, ty);
        std::vector<unsigned long long> draws(2 * n);
        for (long long p = 0; p < n; ++p)
            sky_draws(chunk, chunk.row0 + p / chunk.cols, chunk.col0 + p % chunk.cols,
                      draws[2 * p], draws[2 * p + 1]);
        spill(prefix + ".out", out.data(), n * sizeof(float));
        spill(prefix + ".draws", draws.data(), 2 * n * sizeof(unsigned long long));
    }}
    return 0;
}}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    """The kernel's pixel code compiled for the CPU (nvcc, its host compiler, no FMA contraction)."""
    from test_nvcc import _nvcc

    nvcc = _nvcc()
    where = tmp_path_factory.mktemp("sky")
    (where / "harness.cu").write_text(_harness_source(cuda.source_dir()))
    result = subprocess.run([nvcc, "-std=c++17", "-O2", "-arch=sm_90", "-Xcompiler",
                             "-ffp-contract=off", str(where / "harness.cu"), "-o",
                             str(where / "harness")], capture_output=True, text=True, timeout=600,
                            check=False)
    assert result.returncode == 0, f"nvcc failed on the harness:\n{result.stderr}"
    return where / "harness"


def _on_host(harness, jobs):
    """Run the harness on ``jobs`` (``(data, chunk)`` pairs); each chunk's (pixels, draws)."""
    folder = harness.parent
    prefixes = []
    for k, (data, chunk) in enumerate(jobs):
        prefix = folder / f"chunk{k}"
        prefix.with_suffix(".chunk").write_bytes(chunk.tobytes())
        prefix.with_suffix(".data").write_bytes(data.tobytes())
        prefixes.append(prefix)
    subprocess.run([str(harness), *map(str, prefixes)], check=True, timeout=600)
    results = []
    for prefix, (_, chunk) in zip(prefixes, jobs):
        shape = (int(chunk["rows"][0]), int(chunk["cols"][0]))
        results.append((np.fromfile(prefix.with_suffix(".out"), np.float32).reshape(shape),
                        np.fromfile(prefix.with_suffix(".draws"), np.uint64).reshape(*shape, 2)))
    return results


@pytest.mark.parametrize("shape, chunks", SHAPES_AND_CHUNKS)
def test_the_kernels_pixel_code_on_the_cpu_is_the_reference(host_kernel, shape, chunks):
    seed, noise = 11, 0.01
    chunked = list(_reference(shape, chunks, seed, noise))
    jobs = [kernel_arguments(location, table, shape=shape, seed=seed, noise=noise)
            for location, table, _ in chunked]
    differing = 0
    for (location, _, want), (got, draws) in zip(chunked, _on_host(host_kernel, jobs)):
        assert np.array_equal(draws, _draws(location, shape[1], seed)), location
        differing += _compare(got, want, location)
    assert differing <= DIFFERING_FRACTION * np.prod(shape) + 2


def test_the_kernels_pixel_code_on_a_large_sky(host_kernel):
    """A 2048² sky in 1024² chunks: bright, faint, point and extended sources over chunk borders,
    and the gradient's full range."""
    shape, seed, noise = (2048, 2048), 0, 0.01
    chunked = list(_reference(shape, 1024, seed, noise))
    jobs = [kernel_arguments(location, table, shape=shape, seed=seed, noise=noise)
            for location, table, _ in chunked]
    differing = sum(_compare(got, want, location) for (location, _, want), (got, _) in
                    zip(chunked, _on_host(host_kernel, jobs)))
    assert differing <= DIFFERING_FRACTION * np.prod(shape) + 2


# -- the kernel on a GPU --------------------------------------------------------------------------

def _host(a):
    a = a.compute() if hasattr(a, "dask") else a
    return a.get() if hasattr(a, "get") else np.asarray(a)


@pytest.mark.gpu
@pytest.mark.parametrize("hold_gil", [True, False], ids=["chunkernels launch", "CuPy launch"])
@pytest.mark.parametrize("shape, chunks", SHAPES_AND_CHUNKS)
def test_gpu_chunks_are_the_reference(shape, chunks, hold_gil, monkeypatch):
    monkeypatch.setattr(cuda, "LAUNCH_HOLDS_GIL", hold_gil)
    seed = 11
    gpu, _ = synthetic_sky(shape, chunks=chunks, seed=seed, gpu=True)
    cpu, _ = synthetic_sky(shape, chunks=chunks, seed=seed)
    assert type(gpu._meta).__module__.startswith("cupy")
    assert type(gpu.blocks[0, 0].compute()).__module__.startswith("cupy")
    differing = _compare(_host(gpu), cpu.compute(), (shape, chunks))
    print(f"{shape} in chunks {chunks}: {differing} of {np.prod(shape)} float32 pixels differ "
          f"by one ulp")
    assert differing <= DIFFERING_FRACTION * np.prod(shape) + 2
    # the same whatever the chunking, on the GPU too (up to the same one-ulp pixels)
    whole = _host(synthetic_sky(shape, chunks=shape, seed=seed, gpu=True)[0])
    assert _compare(whole, _host(gpu), shape) <= 2 * (DIFFERING_FRACTION * np.prod(shape) + 2)


@pytest.mark.gpu
def test_gpu_noise_integers_are_numpys():
    cp = pytest.importorskip("cupy")
    shape, seed = (3000, 5000), 2**64 - 1  # keys and counters wrap modulo 2**64
    table = render_table(sky_sources((8, 8), seed=0), (8, 8), 0.01)[:0]
    kernel = cuda.function(_sky.CUDA_SOURCE, "synthetic_sky_draws")
    for location in (((0, 7), (0, 5000)), ((2990, 3000), (4001, 4096)), ((100, 101), (3, 4))):
        _, chunk = kernel_arguments(location, table, shape=shape, seed=seed, noise=0.01)
        (r0, r1), (c0, c1) = location
        draws = cp.empty((r1 - r0, c1 - c0, 2), dtype=cp.uint64)
        kernel((64,), (256,), (draws, chunk.view(_sky._CHUNK_PARAM)))
        assert np.array_equal(draws.get(), _draws(location, shape[1], seed)), location


@pytest.mark.gpu
def test_gpu_sky_without_sources_and_chunks_no_source_reaches():
    image, truth = synthetic_sky((5, 7), chunks=3, seed=0, gpu=True)
    assert len(truth["id"]) == 0
    assert _compare(_host(image), synthetic_sky((5, 7), chunks=3, seed=0)[0].compute(), "none") <= 2
    # 600 x 600 in 40 x 40 chunks: many chunks hold no source
    shape, chunks = (600, 600), 40
    gpu, truth = synthetic_sky(shape, chunks=chunks, seed=1, gpu=True)
    selected = chunk_sources(render_table(truth, shape, 0.01)["box"],
                             da.core.normalize_chunks(chunks, shape))
    assert any(len(rows) == 0 for rows in selected.values())
    cpu = synthetic_sky(shape, chunks=chunks, seed=1)[0].compute()
    assert _compare(_host(gpu), cpu, "sparse") <= DIFFERING_FRACTION * cpu.size + 2


@pytest.mark.gpu
def test_gpu_sky_of_the_demo_is_the_reference():
    """The 8192² sky of ``chunkernels demo`` in its 2048² chunks: the differing pixels counted over
    all 67 million (printed: run pytest with -s to see the count)."""
    gpu, _ = synthetic_sky(8192, chunks=2048, seed=0, gpu=True)
    cpu, _ = synthetic_sky(8192, chunks=2048, seed=0)
    differing = _compare(_host(gpu), cpu.compute(scheduler="threads"), "8192²")
    print(f"8192² sky: {differing} of {8192 ** 2} float32 pixels differ by one ulp")
    assert differing <= DIFFERING_FRACTION * 8192 ** 2


@pytest.mark.gpu
def test_the_benchmark_end_to_end(tmp_path, capsys):
    """``chunkernels bench sky`` on a small sky: checked, timed, written."""
    import json

    from chunkernels.cli import main

    code = main(["bench", "sky", "--size", "1024", "--chunks", "256", "--repeat", "1", "--out",
                 str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "sky.json").read_text())
    assert report["shape"] == [1024, 1024] and report["chunk"] == [256, 256]
    assert [row["impl"] for row in report["runs"]] == [
        "chunkernels, computed", "chunkernels, persisted",
        "per-source CuPy loop (before the kernel), computed",
        "per-source CuPy loop (before the kernel), persisted"]
    assert all(row["seconds"] > 0 for row in report["runs"])
    assert report["differing_pixels"]["count"] <= DIFFERING_FRACTION * 1024 ** 2 + 2
    assert (tmp_path / "sky.md").read_text().startswith("### sky on ")
