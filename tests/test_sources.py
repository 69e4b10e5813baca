"""chunkernels.sources beyond the kernels: the synthetic sky (deterministic, the same whatever the
chunking, CPU and GPU alike), the image readers, find_sources against the GPU lesson's CPU code,
and ``chunkernels demo`` end to end (its CSV checked against SciPy on the same image) with its
argument errors."""

from __future__ import annotations

import contextlib
import csv
import math
import re

import numpy as np
import pytest

from chunkernels import demo
from chunkernels.cli import main
from chunkernels.sources import find_sources, read_image, synthetic_sky
from chunkernels.sources._sky import _M64, _mix, _mix_int, gaussian_noise, sky_sources
from chunkernels.sources.lesson import find_sources_cpu
from chunkernels.testing import to_device_view

da = pytest.importorskip("dask.array")

backends = pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])


def _host(a):
    a = a.compute() if hasattr(a, "dask") else a
    return a.get() if hasattr(a, "get") else np.asarray(a)


# -- synthetic sky --------------------------------------------------------------------------------

def test_sky_is_deterministic_and_the_same_whatever_the_chunking():
    image, truth = synthetic_sky((300, 257), chunks=(128, 100), seed=4)
    first = image.compute()
    assert first.dtype == np.float32 and first.shape == (300, 257)
    assert np.array_equal(synthetic_sky((300, 257), chunks=(128, 100), seed=4)[0].compute(), first)
    for chunks in ((300, 257), (77, 31), (1, 257), (300, 1)):
        again, truth_again = synthetic_sky((300, 257), chunks=chunks, seed=4)
        assert np.array_equal(again.compute(), first), chunks
        assert all(np.array_equal(truth[k], truth_again[k]) for k in truth)
    other = synthetic_sky((300, 257), chunks=100, seed=5)[0].compute()
    assert not np.array_equal(other, first)


def test_sky_contents():
    noise = 0.02
    image, truth = synthetic_sky(512, chunks=256, seed=7, noise=noise)
    data = image.compute().astype(np.float64)
    n = len(truth["id"])
    assert n > 20 and set(truth) == {"id", "x", "y", "flux", "peak", "snr", "sigma_major",
                                     "sigma_minor", "angle", "extended"}
    assert all(len(v) == n for v in truth.values())
    assert np.array_equal(truth["id"], np.arange(1, n + 1))
    assert truth["extended"].any() and (~truth["extended"]).any()
    assert np.allclose(truth["peak"], truth["snr"] * noise)
    assert np.allclose(truth["flux"], 2 * np.pi * truth["peak"] * truth["sigma_major"] * truth["sigma_minor"])
    # background: the noise, far from every source
    far = np.ones(data.shape, bool)
    for y, x, s in zip(truth["y"], truth["x"], truth["sigma_major"]):
        r = int(6 * s) + 2
        far[max(0, int(y) - r):int(y) + r + 1, max(0, int(x) - r):int(x) + r + 1] = False
    assert far.mean() > 0.3
    assert np.std(data[far]) == pytest.approx(noise, rel=0.05)
    assert abs(np.mean(data[far])) < 0.05 * noise
    # an isolated bright point source peaks near its injected peak
    point = np.flatnonzero(~truth["extended"] & (truth["snr"] > 100))
    s = point[0]
    y, x = int(round(truth["y"][s])), int(round(truth["x"][s]))
    assert data[max(0, y - 1):y + 2, max(0, x - 1):x + 2].max() == pytest.approx(
        truth["peak"][s], rel=0.35)


def test_noise_is_splitmix64_through_box_muller():
    """The integers are SplitMix64's outputs: check a few pixels against a plain Python
    implementation of it."""
    seed, width = 9, 17
    key = _mix_int(seed * 0x9E3779B97F4A7C15 + 1)
    got = gaussian_noise(np, (2, 4), (5, 8), width, seed)
    for (r, c), value in np.ndenumerate(got):
        i = (r + 2) * width + (c + 5)
        first = _mix_int(key + (2 * i + 1) * 0x9E3779B97F4A7C15)
        second = _mix_int(key + (2 * i + 2) * 0x9E3779B97F4A7C15)
        u1 = ((first >> 11) + 1) * 2.0 ** -53
        u2 = (second >> 11) * 2.0 ** -53
        assert value == pytest.approx(math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2),
                                      rel=1e-14, abs=1e-14)
    z = np.array([0, 1, _M64, 12345678901234567], dtype=np.uint64)
    assert [int(v) for v in _mix(z)] == [_mix_int(int(v)) for v in z]


@pytest.mark.gpu
def test_sky_on_the_gpu_matches_the_cpu():
    cp = pytest.importorskip("cupy")
    rows, cols = (3, 70), (11, 40)
    z = cp.asarray(np.array([0, 1, _M64, 12345678901234567], dtype=np.uint64))
    assert [int(v) for v in _mix(z).get()] == [_mix_int(int(v)) for v in z.get()]
    np.testing.assert_allclose(gaussian_noise(cp, rows, cols, 99, 3).get(),
                               gaussian_noise(np, rows, cols, 99, 3), rtol=1e-13, atol=1e-13)
    cpu, _ = synthetic_sky(384, chunks=192, seed=2)
    gpu, _ = synthetic_sky(384, chunks=(100, 384), seed=2, gpu=True)
    assert cuda_meta(gpu)
    np.testing.assert_allclose(_host(gpu), cpu.compute(), rtol=1e-6, atol=1e-7)


def cuda_meta(x):
    return type(x._meta).__module__.startswith("cupy")


@pytest.mark.parametrize("kwargs, message", [
    ({"shape": 0}, r"shape=0; expected a positive number of pixels"),
    ({"shape": (10, 10, 10)}, r"shape=\(10, 10, 10\); expected a positive number of pixels or a pair"),
    ({"seed": -1}, r"seed=-1; expected an integer from 0 to 2\*\*64 - 1"),
    ({"noise": 0.0}, r"noise=0.0; expected a positive finite standard deviation"),
    ({"shape": 2.5}, r"shape=2.5; expected a positive number of pixels"),
    ({"chunks": -3}, r"chunks=-3 for an image of shape \(16, 16\) give chunks \(\(-2,\), "
                     r"\(-2,\)\); expected a positive chunk side"),
    ({"chunks": 0}, r"chunks=0 for an image of shape \(16, 16\): .*expected a positive chunk side"),
    ({"chunks": ((8, 7), (16,))}, r"chunks=\(\(8, 7\), \(16,\)\) for an image of shape "
                                  r"\(16, 16\): Chunks do not add up to shape"),
])
def test_sky_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_sky(**{"shape": 16, **kwargs})


def test_source_list_is_independent_of_the_chunks():
    a = sky_sources((1000, 800), seed=3)
    b = synthetic_sky((1000, 800), chunks=64, seed=3)[1]
    assert all(np.array_equal(a[k], b[k]) for k in a)


# -- readers --------------------------------------------------------------------------------------

def _image():
    return np.random.default_rng(0).standard_normal((40, 52)).astype(np.float32)


def test_read_npy_memory_mapped_and_native(tmp_path):
    data = _image()
    np.save(tmp_path / "a.npy", data)
    np.save(tmp_path / "b.npy", data.astype(">f4"))
    for name in ("a.npy", "b.npy"):
        image = read_image(tmp_path / name, chunks=16)
        assert isinstance(image, da.Array) and image.chunks[0] == (16, 16, 8)
        assert image.dtype == np.dtype("float32") and image.dtype.isnative
        assert np.array_equal(image.compute(), data)


def test_read_tiff(tmp_path):
    tifffile = pytest.importorskip("tifffile")
    pytest.importorskip("zarr")
    data = _image()
    tifffile.imwrite(tmp_path / "tiled.tif", data, tile=(16, 16))
    tifffile.imwrite(tmp_path / "plain.tiff", data)
    for name in ("tiled.tif", "plain.tiff"):
        image = read_image(tmp_path / name, chunks=(20, 26))
        assert isinstance(image, da.Array) and image.chunks == ((20, 20), (26, 26))
        assert np.array_equal(image.compute(), data)


def test_read_fits_big_endian_cube(tmp_path):
    fits = pytest.importorskip("astropy.io.fits")
    data = _image()
    fits.writeto(tmp_path / "radio.fits", data.astype(">f4").reshape(1, 1, 40, 52))
    image = read_image(tmp_path / "radio.fits", chunks=20)
    assert image.shape == (40, 52) and image.dtype == np.dtype("float32") and image.dtype.isnative
    assert np.array_equal(image.compute(), data)


def test_read_zarr(tmp_path):
    zarr = pytest.importorskip("zarr")
    data = _image()
    z = zarr.open(str(tmp_path / "sky.zarr"), mode="w", shape=data.shape, chunks=(8, 13),
                  dtype=data.dtype)
    z[:] = data
    image = read_image(tmp_path / "sky.zarr")
    assert image.chunksize == (8, 13) and np.array_equal(image.compute(), data)


def test_read_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no image file at"):
        read_image(tmp_path / "missing.fits")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*notes.txt.* from its name; "
                                         r"chunkernels reads FITS \(.fits"):
        read_image(tmp_path / "notes.txt")


# -- find_sources and the demo --------------------------------------------------------------------

def _compare_with_lesson(catalogue, labels, data, reference):
    labels = _host(labels)
    assert np.array_equal(labels, reference["labels"])
    n = reference["num_features"]
    assert np.array_equal(_host(catalogue["label"]), np.arange(1, n + 1))
    centres = np.column_stack([_host(catalogue["center_of_mass-0"]),
                               _host(catalogue["center_of_mass-1"])])
    np.testing.assert_allclose(centres, reference["positions"], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(_host(catalogue["sum"]), reference["fluxes"], rtol=1e-9)


@backends
def test_find_sources_is_the_lessons_four_steps(backend):
    image, _ = synthetic_sky(384, chunks=192, seed=11, gpu=backend == "cupy")
    data = _host(image)
    reference = find_sources_cpu(data)
    for x in (_device(backend, data), image):
        found = find_sources(x)
        catalogue, labels = found
        assert found.threshold == pytest.approx(float(reference["threshold"]), rel=1e-5)
        assert found.background.median == reference["median"]
        _compare_with_lesson(catalogue, labels, data, reference)
        # shown in a notebook: a lazy catalogue does not know its count yet
        count = "?" if x is image else reference["num_features"]
        assert repr(found).startswith(f"Sources({count} sources above ") and str(found)


def _device(backend, a):
    return to_device_view(a) if backend == "cupy" else a


def test_find_sources_argument_errors():
    with pytest.raises(ValueError, match=r"nsigma=nan; expected a finite number"):
        find_sources(np.zeros((4, 4)), nsigma=float("nan"))
    with pytest.raises(ValueError, match=r"kappa=-1; expected a positive finite number"):
        find_sources(np.zeros((4, 4)), kappa=-1)


def _read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [[float(v) for v in row] for row in rows[1:]]


def test_demo_end_to_end(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    out = tmp_path / "out"
    code = main(["demo", "--size", "320", "--chunks", "128", "--seed", "5", "--out", str(out)])
    printed, progress = capsys.readouterr()
    assert code == 0, printed
    assert "validated: chunkernels agrees with the CPU reference" in printed
    assert "label images identical" in printed and "FAIL" not in printed
    assert "recovery of the injected sources" in printed
    # the pipeline's own time, apart from everything around it
    assert re.search(r"CPU pipeline, chunked \(seconds\):\n  κσ clipping +[0-9.]+\n  threshold \+ "
                     r"label +[0-9.]+\n  measure +[0-9.]+\n  pipeline: κσ \+ threshold \+ label "
                     r"\+ measure +[0-9.]+\n", printed), printed
    # stderr is no terminal here: a line per step, the validation's steps their own
    for line in ("demo [1/4] synthetic sky ...", "demo [2/4] κσ clipping: ",
                 "validation [2/6] κσ clipping (ks_clipper_cpu) ...",
                 "validation [6/6] compare: ", "outputs [2/2] write: "):
        assert line in progress, progress
    # the catalogue is SciPy's on the same image: the lesson's steps on the CPU
    data = synthetic_sky(320, chunks=320, seed=5)[0].compute()
    reference = find_sources_cpu(data)
    header, rows = _read_csv(out / "catalogue.csv")
    assert header == ["id", "x", "y", "flux", "area", "peak", "x_min", "y_min", "x_max", "y_max",
                      "injected", "fragment"]
    table = np.array(rows).reshape(-1, len(header))
    n = reference["num_features"]
    assert n > 0 and len(table) == n
    assert np.array_equal(table[:, 0], np.arange(1, n + 1))
    np.testing.assert_allclose(table[:, [2, 1]], reference["positions"], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(table[:, 3], reference["fluxes"], rtol=1e-9)
    from scipy import ndimage as ndi

    labels, index = reference["labels"], np.arange(1, n + 1)
    assert np.array_equal(table[:, 4], np.bincount(labels.ravel())[1:])
    assert np.array_equal(table[:, 5], ndi.maximum(data, labels, index).astype(np.float32))
    boxes = [(s[1].start, s[0].start, s[1].stop, s[0].stop) for s in ndi.find_objects(labels)]
    assert np.array_equal(table[:, 6:10], np.array(boxes))
    # the preview is a PNG
    png = (out / "preview.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    from matplotlib.image import imread

    assert imread(out / "preview.png").shape[:2] == (1160, 1300)
    header, injected = _read_csv(out / "injected.csv")
    assert header[-2:] == ["recovered", "detections"]
    assert len(injected) == len(synthetic_sky(320, seed=5)[1]["id"])
    # detections = the brightest of each injected source + fragments + those of none
    injected = np.array(injected)
    owner, fragment = table[:, 10], table[:, 11]
    assert injected[:, -1].sum() == (owner > 0).sum()
    match = re.search(r"detections: (\d+) = (\d+) of an injected source .* \+ (\d+) fragments "
                      r"\((\d+) of extended sources.*\) \+ (\d+) of no injected source", printed)
    total, matched, fragments, _, unmatched = map(int, match.groups())
    assert total == n == matched + fragments + unmatched
    assert fragments == fragment.sum() and unmatched == (owner == 0).sum()
    assert matched == len(np.unique(owner[owner > 0]))


def test_demo_on_an_image_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    data = synthetic_sky(200, chunks=200, seed=8)[0].compute()
    np.save(tmp_path / "sky.npy", data)
    code = main(["demo", str(tmp_path / "sky.npy"), "--chunks", "64", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "sky.npy, float32, 16 chunk(s) of up to 64x64" in printed
    header, rows = _read_csv(tmp_path / "catalogue.csv")
    assert len(rows) == find_sources_cpu(data)["num_features"]
    assert not (tmp_path / "injected.csv").exists()


def test_demo_without_validation(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    code = main(["demo", "--size", "200", "--chunks", "100", "--no-validate", "--out",
                 str(tmp_path)])
    printed, progress = capsys.readouterr()
    assert code == 0, printed
    assert "validation against the lesson's CPU code: skipped (--no-validate)" in printed
    assert "result:  not validated (--no-validate)" in printed
    assert "validation [" not in progress and "ks_clipper_cpu" not in printed
    assert {p.name for p in tmp_path.iterdir()} == {"catalogue.csv", "injected.csv",
                                                    "preview.png"}


def test_demo_on_a_sky_with_nothing_to_find(tmp_path, capsys):
    """A sky too small for its sources: an empty catalogue, the picture and a validated run,
    not a traceback from drawing the cutout of no detection."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    code = main(["demo", "--size", "64", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "0 sources" in printed and "median offset of bright point sources: none" in printed
    assert "result:  validated" in printed
    header, rows = _read_csv(tmp_path / "catalogue.csv")
    assert rows == []
    assert (tmp_path / "preview.png").read_bytes().startswith(b"\x89PNG")


def test_demo_on_a_running_scheduler(tmp_path, capsys):
    """``--scheduler ADDRESS``: a cluster of two CPU worker processes started elsewhere; the
    κσ clipping runs on the workers' blocks (one actor each), the rest as graphs there."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as running:
        code = main(["demo", "--scheduler", running.scheduler_address, "--size", "160",
                     "--chunks", "80", "--no-validate", "--out", str(tmp_path)])
        printed = capsys.readouterr().out
        assert running.status.name == "running"
    assert code == 0, printed
    assert printed.startswith("cluster: 2 worker(s) on CPU, scheduler tcp://")
    assert "on CPU, Dask workers" in printed
    header, rows = _read_csv(tmp_path / "catalogue.csv")
    data = synthetic_sky(160, chunks=160, seed=0)[0].compute()
    reference = find_sources_cpu(data)
    assert len(rows) == reference["num_features"] > 0
    positions = np.array(rows)[:, [2, 1]]
    np.testing.assert_allclose(positions, reference["positions"], rtol=1e-12, atol=1e-9)


def test_demo_on_a_radio_cube_written_by_astropy(tmp_path, capsys):
    """A FITS image shaped (1, 1, N, N) (Stokes, frequency, y, x), big-endian as FITS stores
    it: the degenerate axes are dropped before chunking. Other shapes get a clear error."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    fits = pytest.importorskip("astropy.io.fits")
    data = synthetic_sky(160, chunks=160, seed=9)[0].compute()
    fits.PrimaryHDU(data.reshape(1, 1, 160, 160)).writeto(tmp_path / "radio.fits")
    assert fits.getdata(tmp_path / "radio.fits").dtype.byteorder == ">"
    image = read_image(tmp_path / "radio.fits", chunks=(64, 64))
    assert image.shape == (160, 160) and image.chunks == ((64, 64, 32), (64, 64, 32))
    code = main(["demo", str(tmp_path / "radio.fits"), "--chunks", "64", "--out",
                 str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "radio.fits, float32, 9 chunk(s) of up to 64x64" in printed
    assert "validated: chunkernels agrees with the CPU reference" in printed
    _, rows = _read_csv(tmp_path / "out" / "catalogue.csv")
    assert len(rows) == find_sources_cpu(data)["num_features"]

    fits.PrimaryHDU(np.zeros((2, 1, 16, 16), np.float32)).writeto(tmp_path / "planes.fits")
    assert main(["demo", str(tmp_path / "planes.fits"), "--out", str(tmp_path / "out")]) == 2
    assert ("planes.fits holds an array of shape (2, 16, 16) (axes of length 1 dropped); the "
            "demo finds sources in 2-D images (a radio image's (1, 1, N, N) cube is fine)"
            in capsys.readouterr().err)


@pytest.mark.parametrize("shape, chunks, expected", [
    ((1, 1, 12, 10), (5, 4), ((5, 5, 2), (4, 4, 2))),
    ((12, 10, 1), 5, ((5, 5, 2), (5, 5))),
    ((1, 12), (1, 5), ((1,), (5, 5, 2))),
    ((1, 1, 1, 12), (1, 5), ((1,), (5, 5, 2))),
])
def test_read_drops_degenerate_axes_before_chunking(tmp_path, shape, chunks, expected):
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.save(tmp_path / "a.npy", data)
    image = read_image(tmp_path / "a.npy", chunks=chunks)
    assert image.chunks == expected
    assert np.array_equal(image.compute(), data.reshape(image.shape))


def test_demo_help_says_what_the_outputs_mean(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = capsys.readouterr().out
    words = " ".join(text.split())
    assert "default: a LocalCUDACluster of every GPU when there are GPUs, else Dask's threads" in words
    assert "no cluster" not in words
    for column in ("x_min y_min", "fragment", "sigma_major", "recovered", "detections"):
        assert column in text
    assert "More detections than injected sources" in text and "--no-validate" in text
    assert all(len(line) <= 100 for line in demo.OUTPUTS.splitlines())


def test_recovery_counts_fragments_of_an_extended_source():
    """Three detections within an extended source's reach: the brightest is its detection, the
    others its fragments; one far from everything belongs to no injected source."""
    truth = {"id": np.array([1, 2]), "x": np.array([50.0, 10.0]), "y": np.array([40.0, 10.0]),
             "sigma_major": np.array([6.0, 1.5]), "snr": np.array([40.0, 20.0]),
             "extended": np.array([True, False])}
    table = {"center_of_mass-1": np.array([50.5, 62.0, 41.0, 10.2, 90.0]),
             "center_of_mass-0": np.array([40.2, 45.0, 33.0, 9.9, 90.0]),
             "sum": np.array([9.0, 0.5, 0.7, 3.0, 0.2])}
    found = demo._recovery(truth, table)
    assert found.owner.tolist() == [1, 1, 1, 2, 0]
    assert found.fragment.tolist() == [False, True, True, False, False]
    assert (found.matched, found.fragments, found.unmatched) == (2, 2, 1)
    assert found.fragments_of_extended == 2 and found.detections.tolist() == [3, 1]
    assert found.recovered.tolist() == [True, True]


@pytest.mark.parametrize("argv, message", [
    (["--size", "0"], "argument --size: '0' is not a whole number of at least 1"),
    (["--chunks", "-4"], "argument --chunks: '-4' is not a whole number of at least 1"),
    (["--seed", "x"], "argument --seed: 'x' is not a whole number of at least 0"),
    (["missing.fits"], "argument IMAGE: no image file at 'missing.fits'"),
])
def test_demo_argument_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["demo", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_input_errors(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    np.save(tmp_path / "cube.npy", np.zeros((2, 3, 4), np.float32))
    np.save(tmp_path / "complex.npy", np.zeros((4, 4), np.complex64))
    np.save(tmp_path / "flat.npy", np.zeros((4, 4), np.float32))
    np.save(tmp_path / "empty.npy", np.zeros((0, 5), np.float32))
    with pytest.raises(SystemExit):
        main(["demo", str(tmp_path / "notes.txt")])
    assert "cannot tell the format of" in capsys.readouterr().err
    cases = [
        ([str(tmp_path / "flat.npy"), "--size", "64"], "--size sets the side of the synthetic sky"),
        ([str(tmp_path / "cube.npy")], "holds an array of shape (2, 3, 4) (axes of length 1 "
                                       "dropped); the demo finds sources in 2-D images"),
        ([str(tmp_path / "complex.npy")], "takes real integer, float32 or float64 data; got dtype "
                                          "complex64"),
        ([str(tmp_path / "empty.npy")], "holds an empty image, of shape (0, 5): no pixels"),
    ]
    for argv, message in cases:
        code = main(["demo", *argv, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and f"chunkernels demo: " in err and message in err, err


def test_demo_refuses_more_gpus_than_there_are(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("chunkernels.cuda.gpu_count", lambda: 0)
    code = main(["demo", "--gpus", "2", "--out", str(tmp_path)])
    assert code == 2
    assert "gpus=2 asks for more GPUs than there are" in capsys.readouterr().err


@pytest.mark.gpu
def test_demo_warm_up_leaves_the_first_run_nothing_to_compile(monkeypatch):
    """After :func:`demo.warm_up` for a run of many more blocks than its first sky has, the
    run's pipeline compiles no kernel (CuPy's concatenate of more than 8 arrays, a kernel of its
    own, was compiled in the first 32768² run after a warm-up of 2x2 blocks). Compiles are
    counted where CuPy compiles a module, for ours and CuPy's own kernels alike."""
    cp = pytest.importorskip("cupy")
    import cupy.cuda.compiler as compiler

    original = getattr(compiler, "_compile_module_with_cache", None)
    if original is None:  # CuPy's private entry point, as of CuPy 14
        pytest.skip("this CuPy has no cupy.cuda.compiler._compile_module_with_cache to count")
    compiled = []

    def counted(*args, **kwargs):
        compiled.append(args[0] if args else kwargs.get("source"))
        return original(*args, **kwargs)

    monkeypatch.setattr(compiler, "_compile_module_with_cache", counted)
    unique = np.random.default_rng().integers(1 << 30)  # a kernel no process has compiled
    probe = cp.ElementwiseKernel("T x", "T y", f"y = x + {unique}", "chunkernels_test_probe")
    probe(cp.zeros(3, np.float32))
    assert len(compiled) == 1  # the counter sees a compile
    # the run: 3x3 blocks of 2048², whose 9 partial tables are joined by one concatenate; the
    # warm-up's first sky (at most 4096² here) has 2x2 of them, its second one 3x3 smaller ones
    monkeypatch.setattr(demo, "WARM_UP_SIZE_MAX", 4096)
    demo.warm_up(None, chunk=2048, size=6144)
    compiled.clear()
    image, _ = synthetic_sky(6144, chunks=2048, seed=3, gpu=True)
    found = demo._find(demo._place(image, None), None, lambda name: contextlib.nullcontext())
    assert found.count > 0 and compiled == []


@pytest.mark.multigpu
def test_demo_warm_up_on_two_gpu_workers_readies_both_clipping_paths():
    """On a cluster the clipping batches a round's passes or not, call by call, from its first
    trip's time; after the warm-up neither path compiles on any worker (after a warm-up of one
    call, a first call took 466 ms against 49 later, on two H100s), and both give the same
    result."""
    pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    from chunkernels import cluster
    from chunkernels.sources import _clip_cluster, kappa_sigma_clip

    def count_compiles(reset):
        import cupy.cuda.compiler as compiler

        original = getattr(compiler, "_compile_module_with_cache", None)
        if original is None:
            return None
        if not hasattr(compiler, "_test_compiled"):
            compiler._test_compiled = []

            def counted(*args, **kwargs):
                compiler._test_compiled.append(1)
                return original(*args, **kwargs)

            compiler._compile_module_with_cache = counted
        if reset:
            compiler._test_compiled.clear()
        return len(compiler._test_compiled)

    with cluster.client(2, dashboard_address=None) as c:
        if None in c.run(count_compiles, True).values():
            pytest.skip("this CuPy has no cupy.cuda.compiler._compile_module_with_cache to count")
        demo.warm_up(c, chunk=1024, size=2048)
        c.run(count_compiles, True)
        image, _ = synthetic_sky(2048, chunks=1024, seed=3, gpu=True)
        image = demo._place(image, c)
        results = {}
        for fuse in (True, False, None):
            with _clip_cluster.fusing(fuse):
                results[fuse] = kappa_sigma_clip(image, demo.KAPPA)
        compiled = c.run(count_compiles, False)
    assert set(compiled.values()) == {0}, compiled
    want = results[None]
    for got in results.values():  # the same values kept; float64 sums in another order
        assert (got.median, got.count, got.iterations) == (want.median, want.count,
                                                           want.iterations)
        assert got.std == pytest.approx(want.std, rel=1e-13)


def test_demo_comparison_allows_pixels_within_float32_rounding_of_the_threshold():
    """A pixel between chunkernels' threshold and the lesson's (which differ by float32
    rounding) segments differently; the labels are then checked against SciPy's labels of
    chunkernels' own segmentation, and the measurements against SciPy on those labels."""
    from scipy import ndimage as ndi

    from chunkernels import demo
    from chunkernels.sources import ClipResult

    data = np.zeros((8, 8), np.float32)
    data[1, 1], data[1, 2] = 10.0, 7.0
    data[5, 5] = np.float32(4.500001)  # above the lesson's 4.5, not above our 4.50002
    ref_labels, n = ndi.label(data > np.float32(4.5))
    index = np.arange(1, n + 1)
    reference = {"median": np.float32(0.0), "std": np.float32(0.9), "count": 61,
                 "threshold": np.float32(4.5), "labels": ref_labels, "num_features": n,
                 "positions": np.array(ndi.center_of_mass(data, ref_labels, index)),
                 "fluxes": ndi.sum_labels(data, ref_labels, index)}
    background = ClipResult(np.float32(0.0), 0.9000001, 61, 2, -2.7, 2.7, 0.0, True)
    level = 4.50002
    labels, count = ndi.label(data > level)
    centres = np.array(ndi.center_of_mass(data, labels, np.arange(1, count + 1))).reshape(count, 2)
    ours = np.arange(1, count + 1)
    table = {"label": ours, "center_of_mass-0": centres[:, 0], "center_of_mass-1": centres[:, 1],
             "sum": ndi.sum_labels(data, labels, ours), "area": np.bincount(labels.ravel())[1:],
             "max": ndi.maximum(data, labels, ours),
             **{f"bbox-{i}": np.array([(s[0].start, s[1].start, s[0].stop, s[1].stop)[i]
                                       for s in ndi.find_objects(labels)]) for i in range(4)}}
    checks = {name: (ok, detail) for name, ok, detail in
              demo._compare(background, level, count, labels, table, data, reference)}
    assert all(ok for ok, _ in checks.values()), checks
    assert "1 pixel(s) lie between the two" in checks["segmentation"][1]
    assert "identical to scipy.ndimage.label of the same segmentation" in checks["labels"][1]
    table["sum"] = table["sum"] * (1 + 1e-6)
    assert not dict((n, ok) for n, ok, _ in demo._compare(background, level, count, labels, table,
                                                         data, reference))["measurements"]
