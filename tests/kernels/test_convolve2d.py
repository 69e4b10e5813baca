"""chunkernels.signal.convolve2d against scipy.signal.convolve2d: scipy's own TestConvolve2d cases,
every mode x boundary x fill value, odd and even kernels larger and smaller than the image, 'valid'
with swapped operand sizes, integer inputs (sums wrap as scipy's), mixed dtypes, complex inputs
(CPU reference), view layouts of both operands, chunkings (one chunk, uneven, chunks smaller than
the halo, wrap across many chunks), chunking invariance, the GPU lesson's exact example, and
scipy's errors."""

import itertools
from contextlib import nullcontext

import dask.array as da
import numpy as np
import pytest
import scipy.signal as sg
from filtercheck import backends, check, check_invariance, chunked_arrays, device, layouts
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import CPUFallbackWarning
from chunkernels.signal import convolve2d
from chunkernels.testing import assert_close

MODES = ("full", "same", "valid")
BOUNDARIES = ("fill", "wrap", "symm", "pad", "circular", "symmetric")
A = [[1, 2, 3], [3, 4, 5]]
B = [[2, 3, 4], [4, 5, 6]]
E = [[2, 3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9, 10]]
F = [[1, 2, 3], [3, 4, 5]]


def ref(x, w, *args, **kwargs):
    return sg.convolve2d(x, w, *args, **kwargs)


def lesson_inputs(n=2048):
    """The lesson's image of Dirac deltas and its 15 x 15 Gaussian, as the lesson builds them."""
    diracs = np.zeros((n, n))
    diracs[8::16, 8::16] = 1
    x, y = np.meshgrid(np.linspace(-2, 2, 15), np.linspace(-2, 2, 15))
    dist = np.sqrt(x * x + y * y)
    sigma, origin = 1, 0.000
    gauss = np.exp(-(dist - origin) ** 2 / (2.0 * sigma**2))
    return diracs, gauss


@backends
def test_scipy_cases(backend):
    def conv(a, b, *args):
        return convolve2d(device(backend, np.asarray(a)), np.asarray(b), *args)

    assert_close(conv(A, B), np.array([[2, 7, 16, 17, 12], [10, 30, 62, 58, 38],
                                       [12, 31, 58, 49, 30]]))
    h = np.array([[62, 80, 98, 116, 134]])
    assert_close(conv(E, F, "valid"), h)
    assert_close(conv(F, E, "valid"), h)  # gh-5897: scipy swaps the inputs
    assert_close(conv(A, B, "full", "fill", 1), np.array([[24, 26, 31, 34, 32],
                                                          [28, 40, 62, 64, 52],
                                                          [32, 46, 67, 62, 48]]))
    assert_close(conv(A, B, "full", "wrap"), np.array([[80, 80, 74, 80, 80],
                                                       [68, 68, 62, 68, 68],
                                                       [80, 80, 74, 80, 80]]))
    assert_close(conv(A, B, "full", "symm"), np.array([[34, 30, 44, 62, 66],
                                                       [52, 48, 62, 80, 84],
                                                       [82, 78, 92, 110, 114]]))
    assert_close(conv(F, E, "same"), np.array([[22, 28, 34], [80, 98, 116]]))
    for boundary, expected in (("symm", [[37.0, 42.0, 44.0, 45.0]]),
                               ("wrap", [[43.0, 44.0, 42.0, 39.0]])):   # gh-8684, gh-8814
        got = convolve2d(device(backend, np.array([[2.0, -1.0, 3.0, 4.0]])), np.ones((1, 21)),
                         mode="same", boundary=boundary)
        assert_close(got, np.array(expected))
    a = np.arange(5)
    b = np.array([3.2, 1.4, 3])
    for mode in MODES:   # test_consistency_convolve_funcs
        assert_close(conv([a], [b], mode)[0], np.convolve(a, b, mode=mode))


@backends
def test_scipy_complex_cases(backend):
    def conv(a, b, *args):
        if backend == "cupy":
            with pytest.warns(CPUFallbackWarning):
                return convolve2d(device(backend, np.asarray(a)), np.asarray(b), *args)
        return convolve2d(np.asarray(a), np.asarray(b), *args)

    f = np.asarray(F, dtype=complex) + 1j
    h = np.array([[62 + 24j, 80 + 30j, 98 + 36j, 116 + 42j, 134 + 48j]])
    assert_close(conv(E, f, "valid"), h)
    e2 = np.array([[1 + 1j, 2 - 3j], [3 + 1j, 4 + 0j]])
    f2 = np.array([[2 - 1j, 3 + 2j, 4 + 0j], [4 - 0j, 5 + 1j, 6 - 3j]])
    assert_close(conv(e2, f2, "valid"), np.array([[27 - 1j, 46. + 2j]]))
    assert_close(conv(f2, e2, "valid"), np.array([[27 - 1j, 46. + 2j]]))
    x = np.ones((3, 3), complex)
    assert_close(conv(x, np.ones((2, 2)), "full", "fill", 1j),
                 sg.convolve2d(x, np.ones((2, 2)), fillvalue=1j))


@backends
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_modes_boundaries_fillvalues(backend, mode, boundary):
    rng = np.random.default_rng(90)
    x = rng.standard_normal((23, 26))
    for shape, fill in (((3, 3), 0), ((4, 5), 2.5), ((1, 6), -1.0), ((5, 2), 0.75)):
        check(backend, convolve2d, ref, x, rng.standard_normal(shape), mode, boundary, fill,
              chunks=[(23, 26), (12, 13), (8, 9), (2, 3)])


@backends
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("boundary", ("fill", "wrap", "symm"))
def test_kernel_larger_than_the_image(backend, mode, boundary):
    """Extensions longer than the image repeat it (gh-8684); 'valid' swaps the inputs."""
    rng = np.random.default_rng(91)
    x = rng.standard_normal((4, 5))
    w = rng.standard_normal((9, 8))
    check(backend, convolve2d, ref, x, w, mode, boundary, 1.5, chunks=[(4, 5), (2, 3), (1, 1)])


@backends
@pytest.mark.parametrize("big, small", [((9, 7), (3, 2)), ((5, 6), (5, 6)), ((8, 1), (3, 1))])
def test_valid_swapped_operands(backend, big, small):
    rng = np.random.default_rng(92)
    image, kernel = rng.standard_normal(big), rng.standard_normal(small)
    expected = sg.convolve2d(kernel, image, "valid")
    assert_close(convolve2d(device(backend, kernel), device(backend, image), "valid"), expected)
    got = convolve2d(da.from_array(device(backend, kernel), chunks=2), image, "valid")
    assert_close(got.compute(), expected)
    assert_close(sg.convolve2d(image, kernel, "valid"), expected)


@backends
@pytest.mark.parametrize("dtype1, dtype2", [("int32", "int32"), ("uint8", "uint8"),
                                            ("int16", "int8"), ("int64", "int64"),
                                            ("uint16", "int32"), ("uint64", "uint64"),
                                            ("int8", "uint8")])
def test_integers_wrap_as_scipy(backend, dtype1, dtype2):
    rng = np.random.default_rng(93)
    x = rng.integers(0, 120, (15, 17)).astype(dtype1)
    w = rng.integers(0, 40, (4, 3)).astype(dtype2)
    for mode, boundary in itertools.product(MODES, ("fill", "wrap", "symm")):
        check(backend, convolve2d, ref, x, w, mode, boundary, 7, chunks=[(15, 17), (5, 4)])


@backends
@pytest.mark.parametrize("dtype1, dtype2", [("float32", "float32"), ("float32", "float64"),
                                            ("int32", "float32"), ("uint8", "float64")])
def test_float_and_mixed_dtypes(backend, dtype1, dtype2):
    rng = np.random.default_rng(94)
    x = (rng.standard_normal((20, 19)) * 10).astype(dtype1)
    w = rng.standard_normal((5, 4)).astype(dtype2)
    for mode in MODES:
        check(backend, convolve2d, ref, x, w, mode, "symm", halo=3)


@backends
@pytest.mark.parametrize("fill, dtype", [(2.7, "int32"), (-0.5, "uint8"), (255.9, "uint8"),
                                         (2**63, "uint64"), (-128, "int8")])
def test_fill_values_cast_as_scipy(backend, fill, dtype):
    x = np.arange(12, dtype=dtype).reshape(3, 4)
    w = np.ones((2, 3), dtype)
    check(backend, convolve2d, ref, x, w, "full", "fill", fill, chunks=[(3, 4), (2, 2)])


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(95))[index]
    w_base = np.random.default_rng(96).standard_normal((12, 9))
    for w in (w_base[:5, :4], w_base[::-2, ::3], np.asfortranarray(w_base[:3, :6])):
        for mode in MODES:
            check(backend, convolve2d, ref, x, w, mode, "wrap", halo=5)


@backends
def test_cupy_weights_and_lists(backend):
    x = np.random.default_rng(97).standard_normal((9, 8))
    w = np.random.default_rng(98).standard_normal((3, 3))
    assert_close(convolve2d(device(backend, x), device(backend, w)), sg.convolve2d(x, w))
    assert_close(convolve2d(x.tolist(), w.tolist(), "same"), sg.convolve2d(x, w, "same"))


@backends
@pytest.mark.parametrize("shapes", [((0, 3), (2, 2)), ((3, 3), (0, 2)), ((1, 1), (1, 1)),
                                    ((1, 7), (1, 3)), ((6, 1), (2, 1))])
def test_empty_and_size_one(backend, shapes):
    xs, ws = shapes
    x, w = np.ones(xs), np.arange(float(np.prod(ws))).reshape(ws)
    for mode in ("full", "same"):
        check(backend, convolve2d, ref, x, w, mode, chunks=[tuple(max(n, 1) for n in xs)])


@backends
def test_wrap_across_many_chunks(backend):
    rng = np.random.default_rng(99)
    x = rng.standard_normal((40, 44))
    w = rng.standard_normal((7, 6))
    for mode in MODES:
        check(backend, convolve2d, ref, x, w, mode, "wrap",
              chunks=[(4, 5), (40, 2), (3, 44)])


@backends
def test_lesson_example_chunked_small(backend):
    """The lesson's computation on a 512 x 512 image of deltas, in uneven chunks."""
    diracs, gauss = lesson_inputs(512)
    expected = sg.convolve2d(diracs, gauss)
    for chunks in ((512, 512), (128, 128), (100, 77)):
        got = convolve2d(da.from_array(device(backend, diracs), chunks=chunks), gauss)
        assert got.shape == (526, 526)
        assert_close(got.compute(), expected, err_msg=f"chunks {chunks}")


@pytest.mark.gpu
def test_lesson_exact_example_on_the_gpu():
    """The lesson, as written: 2048 x 2048 deltas every 16 pixels, a 15 x 15 Gaussian, 'full'
    mode; the GPU result (whole array and 512 x 512 chunks) matches scipy's."""
    import cupy as cp

    diracs, gauss = lesson_inputs()
    expected = sg.convolve2d(diracs, gauss)
    diracs_gpu, gauss_gpu = cp.asarray(diracs), cp.asarray(gauss)
    got = convolve2d(diracs_gpu, gauss_gpu)
    assert isinstance(got, cp.ndarray) and got.shape == (2062, 2062)
    assert_close(got, expected)
    chunked = convolve2d(da.from_array(diracs_gpu, chunks=512, asarray=False), gauss_gpu)
    assert_close(chunked.compute(), expected)


@pytest.mark.gpu
@pytest.mark.filterwarnings("error::chunkernels.CPUFallbackWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("boundary", ("fill", "wrap", "symm"))
def test_cupy_weights_stay_on_the_device(mode, boundary):
    """CuPy weights (kept on the device by the GPU path) give scipy's result with CuPy, NumPy
    and Dask inputs of either chunk type, integer and complex weights included; the caller's
    weights may change after a lazy call without changing its result."""
    import cupy as cp

    rng = np.random.default_rng(101)
    x = rng.standard_normal((33, 28))
    for w in (rng.standard_normal((5, 4)), rng.integers(-3, 4, (3, 3)),
              rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2)),
              rng.standard_normal((40, 30))):
        expected = sg.convolve2d(x, w, mode, boundary, 0.5)
        w_gpu = cp.asarray(w)
        with pytest.warns(CPUFallbackWarning) if w.dtype.kind == "c" else nullcontext():
            got = convolve2d(cp.asarray(x), w_gpu, mode, boundary, 0.5)
        assert isinstance(got, cp.ndarray)
        assert_close(got, expected, err_msg=f"weights {w.dtype} {w.shape}")
        assert_close(convolve2d(x, w_gpu, mode, boundary, 0.5), expected)
        if w.dtype.kind == "c":
            continue
        for chunk_type in (np.asarray, cp.asarray):
            lazy = convolve2d(da.from_array(chunk_type(x), chunks=(10, 9), asarray=False),
                              w_gpu, mode, boundary, 0.5)
            w_gpu[...] = 0
            assert_close(lazy.compute(), expected, err_msg=f"{chunk_type.__module__} chunks")
            w_gpu = cp.asarray(w)


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(min_dims=2, max_dims=2), data=st.data())
def test_chunking_invariance(case, data):
    x, chunks = case
    w = np.arange(1.0, 1 + data.draw(st.integers(1, 4)) * data.draw(st.integers(1, 5)))
    w = w.reshape(-1, data.draw(st.sampled_from([d for d in range(1, w.size + 1)
                                                  if w.size % d == 0])))
    mode = data.draw(st.sampled_from(MODES))
    boundary = data.draw(st.sampled_from(("fill", "wrap", "symm")))
    if mode == "valid" and not (all(n >= m for n, m in zip(x.shape, w.shape))
                                or all(m >= n for n, m in zip(x.shape, w.shape))):
        return
    check_invariance(convolve2d, ref, x, chunks, w, mode, boundary, 3.0)


@pytest.mark.parametrize("args, kwargs, match", [
    ((3, 4), {}, "convolve2d inputs must both be 2-D arrays"),
    (([3], [4]), {}, "convolve2d inputs must both be 2-D arrays"),
    (([[[3]]], [[[4]]]), {}, "convolve2d inputs must both be 2-D arrays"),
    (([[1]], [[1, 2]]), {"fillvalue": 1j}, "could not cast `fillvalue` directly to the output"),
    (([[1]], [[1, 2]]), {"fillvalue": [1, 2]}, "`fillvalue` must be scalar or an array with"),
    (([[1]], [[1, 2]]), {"fillvalue": []}, "`fillvalue` must be scalar"),
    (([[1]], [[1, 2]]), {"fillvalue": 1 + 0j}, "could not cast `fillvalue`"),
    ((np.ones((2, 2), np.uint8), np.ones((1, 2), np.uint8)), {"fillvalue": -1},
     "could not cast `fillvalue`"),
    ((np.ones((2, 2), np.int8), np.ones((1, 2), np.int8)), {"fillvalue": 128},
     "could not cast `fillvalue`"),
    ((np.ones((2, 2), np.int32), np.ones((1, 2), np.int32)), {"fillvalue": np.nan},
     "could not cast `fillvalue`"),
    ((np.arange(1, 7).reshape(2, 3), np.arange(-6, 0).reshape(3, 2)), {"mode": "valid"},
     "For 'valid' mode, one must be at least as large as the other in every dimension"),
    ((np.arange(-6, 0).reshape(3, 2), np.arange(1, 7).reshape(2, 3)), {"mode": "valid"},
     "For 'valid' mode, one must be at least as large"),
    (([[1]], [[1]]), {"mode": "bogus"}, "Acceptable mode flags are 'valid', 'same', or 'full'"),
    (([[1]], [[1]]), {"boundary": "reflect"}, "Acceptable boundary flags are 'fill'"),
    ((np.ones((2, 2), bool), np.ones((1, 1), bool)), {}, "convolve2d not available for this type"),
    ((np.ones((2, 2), np.float16), np.ones((1, 1), np.float16)), {}, "not available for this"),
])
def test_errors_before_any_work(args, kwargs, match):
    in1, in2 = args
    with pytest.raises(ValueError, match=match):
        convolve2d(in1, in2, **kwargs)
    if np.ndim(in1) == 2:
        with pytest.raises(ValueError, match=match):
            convolve2d(da.from_array(np.asarray(in1), chunks=1), in2, **kwargs)
