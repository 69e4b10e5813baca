"""Bad inputs refused before any work, with what is wrong and how to fix it (issue #20)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi

import chunkernels
from chunkernels import ndimage

READ_ONLY = (r"^output array is read-only \(output\.flags\.writeable is False\), so the result "
             r"cannot be written into it; nothing was computed\. Pass a writeable array of the "
             r"result's shape \(numpy\.empty_like\(output\), or a copy\), or a dtype such as "
             r"output=numpy\.{dtype} for a new array$")

X = np.random.default_rng(0).random((12, 10))

FRONT_ENDS = {
    "gaussian_filter": (lambda out: ndimage.gaussian_filter(X, 1.5, output=out), X.shape),
    "gaussian_filter1d": (lambda out: ndimage.gaussian_filter1d(X, 1.5, output=out), X.shape),
    "uniform_filter": (lambda out: ndimage.uniform_filter(X, 3, output=out), X.shape),
    "correlate1d": (lambda out: ndimage.correlate1d(X, [1, 2, 1], output=out), X.shape),
    "convolve": (lambda out: ndimage.convolve(X, np.ones((3, 3)), output=out), X.shape),
    "sobel": (lambda out: ndimage.sobel(X, output=out), X.shape),
    "laplace": (lambda out: ndimage.laplace(X, output=out), X.shape),
    "gaussian_gradient_magnitude": (
        lambda out: ndimage.gaussian_gradient_magnitude(X, 1.0, output=out), X.shape),
    "zoom": (lambda out: ndimage.zoom(X, 2, output=out), (24, 20)),
    "resize": (lambda out: ndimage.resize(X, (7, 9), output=out), (7, 9)),
    "spline_filter": (lambda out: ndimage.spline_filter(X, output=out), X.shape),
    "label": (lambda out: ndimage.label(X > 0.5, output=out), X.shape),
}
ERRORS = {"zoom": ndimage.InterpolationError, "resize": ndimage.InterpolationError,
          "spline_filter": ndimage.InterpolationError, "label": ndimage.LabelError}


@pytest.mark.parametrize("name", FRONT_ENDS)
def test_a_read_only_output_array_is_refused_before_any_work(name, monkeypatch):
    """Issue #20: a read-only ``output=`` failed only once the whole filter had run (and SciPy's
    ``label`` writes into it regardless)."""
    call, shape = FRONT_ENDS[name]
    dtype = np.int32 if name == "label" else np.float64
    out = np.zeros(shape, dtype)
    out.setflags(write=False)

    def no_work(*args, **kwargs):
        raise AssertionError("the kernel ran before the output was checked")

    monkeypatch.setattr(chunkernels._apply, "run_block", no_work)
    monkeypatch.setattr(ndi, "label", no_work)
    with pytest.raises(ERRORS.get(name, ndimage.FilterArgumentError),
                       match=READ_ONLY.format(dtype=np.dtype(dtype).name)) as caught:
        call(out)
    assert isinstance(caught.value, ValueError)  # what scipy raises ("output array is read-only")
    assert not out.any()
    monkeypatch.undo()
    writable = np.zeros(shape, dtype)
    call(writable)  # the same call with a writeable output fills it
    assert writable.any()
