"""Image comparison metrics with scikit-image's semantics, on NumPy, CuPy and Dask arrays.

>>> import numpy as np, dask.array as da
>>> from chunkernels.metrics import mean_squared_error
>>> a = da.ones((4, 4), chunks=2); b = da.zeros((4, 4), chunks=(4, 1))
>>> mean_squared_error(a, b).compute()
array(1.)

Output type follows input type: Dask arrays give a lazy 0-d Dask array, CuPy arrays a 0-d CuPy
array, NumPy arrays a ``numpy.float64`` as scikit-image returns. Dask inputs with different
chunkings are aligned (rechunked) automatically. These functions also serve scikit-image calls
through chunkernels' scikit-image backend (:mod:`chunkernels.skimage_backend`).
"""

from __future__ import annotations

import numpy as np

from chunkernels._apply import apply, apply_kernel
from chunkernels._graph import as_input
from chunkernels._kind import CUPY, ArrayKind
from chunkernels._registry import get, registered
from chunkernels.interop import array_entry


@array_entry("image0", "image1", coerce=False, returns="values")
def mean_squared_error(kind, image0, image1):
    """Mean squared error between two images of the same shape.

    Parameters
    ----------
    image0, image1 : numpy.ndarray, cupy.ndarray, dask.array.Array or xarray.DataArray
        Images of any dimensionality and the same shape (DataArrays: their data, by
        position).

    Returns
    -------
    numpy.float64, cupy.ndarray or dask.array.Array
        The MSE: a float for NumPy inputs, a 0-d array for CuPy, a lazy 0-d array for Dask.

    Raises
    ------
    ValueError
        The shapes differ, or an image is complex.
    """
    return _metric(kind, "mean_squared_error", image0, image1)


@array_entry("image_true", "image_test", coerce=False, returns="values")
def normalized_root_mse(kind, image_true, image_test, *, normalization="euclidean"):
    """Normalized root mean squared error (NRMSE) between two images.

    Parameters
    ----------
    image_true, image_test : numpy.ndarray, cupy.ndarray, dask.array.Array or xarray.DataArray
        Ground truth and test image, same shape.
    normalization : {'euclidean', 'min-max', 'mean'}
        Denominator: the root mean square of ``image_true``, its range, or its mean
        (case-insensitive).

    Returns
    -------
    numpy.float64, cupy.ndarray or dask.array.Array
        The NRMSE, typed as in :func:`mean_squared_error`.

    Raises
    ------
    ValueError
        The shapes differ, an image is complex, or ``normalization`` is not supported.
    """
    return _metric(kind, "normalized_root_mse", image_true, image_test,
                   normalization=normalization)


#: Kernel name -> public function with scikit-image's errors and return types.
PUBLIC = {"mean_squared_error": mean_squared_error, "normalized_root_mse": normalized_root_mse}


def _metric(kind, name, a, b, **params):
    for image in (a, b):
        if not hasattr(image, "shape") or not hasattr(image, "dtype"):
            raise TypeError(f"{name} takes NumPy, CuPy or Dask arrays; got {type(image).__name__}")
    a = as_input(a, name, "image_true", chunk_sizes=True)
    b = as_input(b, name, "image_test", chunk_sizes=True)
    if a.shape != b.shape:
        raise ValueError(f"Input images must have the same dimensions. (shapes {a.shape} and "
                         f"{b.shape})")
    from chunkernels.kernels.mean_squared_error import float_type

    float_type(a.dtype, b.dtype)  # refuses complex images, as scikit-image does
    kind, a, b = _same_kind(kind, a, b)
    result = apply_kernel(kind, a, name, (b,), params, align=True)
    if isinstance(result, np.ndarray):
        return np.float64(result)
    return result


def _same_kind(kind, a, b):
    """``(kind, a, b)``: both Dask if either is, else both CuPy if either is (the device copy is
    explicit). ``kind`` is ``a``'s."""
    other = ArrayKind.of(b)
    if other is None or kind is None:
        return kind, a, b  # not arrays chunkernels computes on: apply refuses them
    if kind.dask or other.dask:
        import dask.array as da

        a = a if kind.dask else da.from_array(a, chunks=b.chunks, asarray=False)
        b = b if other.dask else da.from_array(b, chunks=a.chunks, asarray=False)
        return ArrayKind(dask=True, gpu=kind.gpu), a, b
    if kind.gpu or other.gpu:
        xp = CUPY.xp
        return CUPY, xp.asarray(a), xp.asarray(b)
    return kind, a, b


def kernel_for(skimage_name: str):
    """The registered spec whose ``skimage`` field names ``"module:function"``, or ``None``."""
    for name in registered():
        spec = get(name)
        if skimage_name in spec.skimage:
            return spec
    return None


def implementation(skimage_name: str):
    """The function serving scikit-image's ``"module:function"``, derived from the registry.

    Built-in metrics have public functions here; any other registered kernel that declares the
    name in its spec's ``skimage`` field is served through :func:`chunkernels.apply`.
    """
    spec = kernel_for(skimage_name)
    if spec is None:
        raise KeyError(f"no registered kernel implements {skimage_name!r}")
    if spec.name in PUBLIC:
        return PUBLIC[spec.name]
    return lambda x, *operands, **params: apply(x, spec.name, *operands, align=True, **params)


def supported() -> list[str]:
    """scikit-image functions that registered kernels implement, sorted."""
    return sorted({s for name in registered() for s in get(name).skimage})
