"""PyTorch tensors in, tensors out (chunkernels.interop): values equal the NumPy/CuPy paths, and
the conversions the documentation calls copy-free share memory (pointer equality). CPU tensors
run wherever torch is importable; CUDA tensors need a GPU. torch is not a test dependency: these
tests skip without it."""

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi

import chunkernels
from chunkernels import interop, ndimage
from chunkernels.testing import assert_close

torch = pytest.importorskip("torch")


def _ptr(a) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


# -- CPU tensors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fn, args, kwargs", [
    (ndimage.zoom, (1.7,), {"order": 3, "mode": "reflect"}),
    (ndimage.zoom, ((0.5, 2.0),), {"order": 1, "grid_mode": True, "mode": "grid-constant"}),
    (ndimage.resize, ((9, 31),), {"order": 0}),
    (ndimage.spline_filter, (3,), {}),
    (ndimage.spline_filter1d, (5,), {"axis": 0}),
])
def test_cpu_tensor_in_tensor_out(fn, args, kwargs):
    x = np.random.default_rng(0).random((12, 15)).astype(np.float32)
    expected = fn(x, *args, **kwargs)
    got = fn(torch.from_numpy(x), *args, **kwargs)
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu"
    assert got.dtype == torch.from_numpy(expected).dtype
    np.testing.assert_array_equal(got.numpy(), expected)


def test_cpu_tensor_views_are_read_in_place():
    base = torch.arange(60.0).reshape(6, 10)
    for t in (base, base.T, base[::2, 1:7], base[:, 3]):
        a = interop.to_array(t)
        assert isinstance(a, np.ndarray)
        assert _ptr(a) == t.data_ptr()  # same memory, no copy
        assert a.strides == tuple(s * t.element_size() for s in t.stride())
        np.testing.assert_array_equal(a, t.numpy())
    expected = ndi.zoom(base.T.numpy(), 1.5, order=1)
    np.testing.assert_array_equal(ndimage.zoom(base.T, 1.5, order=1).numpy(), expected)


def test_numpy_results_become_tensors_without_a_copy():
    a = np.random.default_rng(1).random((5, 4))
    t = interop.to_tensor(a)
    assert t.data_ptr() == _ptr(a)
    for copied in (a[::-1], np.broadcast_to(a[0], (5, 4))):  # negative strides, read-only
        t = interop.to_tensor(copied)
        assert t.data_ptr() != _ptr(copied)
        np.testing.assert_array_equal(t.numpy(), copied)
    assert interop.to_tensor((a, 3)) [1] == 3
    assert isinstance(interop.to_tensor([a, a])[0], torch.Tensor)


def test_apply_takes_tensors():
    x = torch.rand(8, 6, dtype=torch.float64)
    y = torch.rand(6, dtype=torch.float64)
    got = chunkernels.apply(x, "broadcast_add", y)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), x.numpy() + y.numpy())
    got = chunkernels.apply(x.numpy(), "broadcast_add", y)  # a tensor operand, a NumPy x
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, x.numpy() + y.numpy())


def test_every_front_end_takes_tensors():
    """Through the one entry, measurements, metrics and sources take tensors too; values come
    back as tensors (NumPy scalars as 0-d tensors, as the metrics returned them before)."""
    from chunkernels import metrics, sources

    x = torch.rand(12, 10, dtype=torch.float64)
    labels, count = ndimage.label(x > 0.6)
    assert isinstance(labels, torch.Tensor) and isinstance(count, int)
    index = torch.arange(1, count + 1)
    sums = ndimage.sum_labels(x, labels, index)
    assert isinstance(sums, torch.Tensor)
    np.testing.assert_allclose(sums.numpy(), ndi.sum_labels(x.numpy(), labels.numpy(),
                                                            index.numpy()))
    mse = metrics.mean_squared_error(x, x * 0)
    assert isinstance(mse, torch.Tensor) and mse.ndim == 0
    assert abs(mse.item() - float((x.numpy() ** 2).mean())) < 1e-12
    assert isinstance(sources.threshold(x, 0.5), torch.Tensor)
    stats, mask = sources.kappa_sigma_clip(x, return_mask=True)
    assert isinstance(stats, sources.ClipResult) and isinstance(mask, torch.Tensor)
    assert isinstance(interop.to_tensor(np.float32(2.5)), torch.Tensor)


def test_output_tensor_is_filled_and_returned():
    x = torch.rand(6, 7, dtype=torch.float64)
    out = torch.zeros(12, 14, dtype=torch.float32)
    ptr = out.data_ptr()
    got = ndimage.zoom(x, 2.0, output=out)
    assert got is out and out.data_ptr() == ptr
    assert_close(out.numpy(), ndi.zoom(x.numpy(), 2.0, output=np.float32), rtol=1e-6)


def test_tensor_errors():
    with pytest.raises(TypeError, match=r"requires grad.*t\.detach\(\)"):
        ndimage.zoom(torch.rand(4, 4, requires_grad=True), 2.0)
    with pytest.raises(TypeError, match="tensors on device meta are not supported"):
        ndimage.zoom(torch.empty(4, 4, device="meta"), 2.0)


def test_conjugate_and_negative_views_are_resolved():
    x = torch.randn(5, 6, dtype=torch.complex128)
    got = ndimage.zoom(x.conj(), 1.4, order=1)
    np.testing.assert_allclose(got.numpy(), ndi.zoom(x.numpy().conj(), 1.4, order=1))


def test_dask_and_numpy_untouched_with_torch_imported():
    x = np.random.default_rng(2).random((10, 10))
    got = ndimage.zoom(da.from_array(x, chunks=4), 1.5)
    assert isinstance(got, da.Array)
    assert_close(got.compute(), ndi.zoom(x, 1.5))
    assert isinstance(ndimage.zoom(x, 1.5), np.ndarray)


@pytest.mark.parametrize("size", [(20, 9), (5, 13)])
def test_resize_matches_torch_interpolate(size):
    """resize(order=1) is ``F.interpolate(mode='bilinear')``: align_corners=True is the default
    grid_mode=False; align_corners=False is grid_mode=True with the edges clamped ('nearest')."""
    functional = torch.nn.functional
    x = torch.rand(1, 1, 11, 7, dtype=torch.float64)
    aligned = functional.interpolate(x, size=size, mode="bilinear", align_corners=True)
    got = ndimage.resize(x[0, 0], size, order=1)
    np.testing.assert_allclose(got.numpy(), aligned[0, 0].numpy(), rtol=0, atol=1e-14)
    centred = functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    got = ndimage.resize(x[0, 0], size, order=1, grid_mode=True, mode="nearest")
    np.testing.assert_allclose(got.numpy(), centred[0, 0].numpy(), rtol=0, atol=1e-14)


def test_import_chunkernels_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, chunkernels, chunkernels.ndimage, chunkernels.interop; " \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


# -- CUDA tensors ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_tensor_zero_copy_both_ways():
    import cupy as cp

    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    t = torch.rand(40, 30, device="cuda")
    for view in (t, t.T, t[::3, 2:]):
        a = interop.to_array(view)
        assert isinstance(a, cp.ndarray) and a.data.ptr == view.data_ptr()
        assert a.strides == tuple(s * view.element_size() for s in view.stride())
    a = cp.random.random((7, 9))
    back = interop.to_tensor(a)
    assert back.is_cuda and back.data_ptr() == a.data.ptr


@pytest.mark.gpu
def test_cuda_tensor_zoom_output_and_streams():
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    x = torch.rand(24, 20, 18, device="cuda")
    expected = ndi.zoom(x.cpu().numpy().astype(np.float64), 1.6, order=3)
    got = ndimage.zoom(x, 1.6)
    assert got.is_cuda and got.dtype == torch.float32
    assert np.abs(got.cpu().numpy() - expected).max() <= 1e-5
    out = torch.empty(got.shape, device="cuda", dtype=torch.float64)
    ptr = out.data_ptr()
    assert ndimage.zoom(x, 1.6, output=out) is out and out.data_ptr() == ptr
    assert np.abs(out.cpu().numpy() - expected).max() <= 1e-5
    # on a side stream: the input is made there, the zoom queued after it, the result used there
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = torch.rand(64, 64, 64, device="cuda") * 0 + x[0, 0, 0]
        z = ndimage.zoom(y, 2.0, order=1).sum()
    side.synchronize()
    assert abs(z.item() / 128**3 - x[0, 0, 0].item()) < 1e-5
    assert ndimage.resize(x, (10, 10, 10), order=1).is_cuda
