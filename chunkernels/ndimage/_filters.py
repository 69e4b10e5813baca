"""scipy.ndimage's linear filters on NumPy, CuPy and Dask arrays.

Each function has scipy.ndimage's signature and semantics and runs the registered kernel of the
same name through :func:`chunkernels.apply`: NumPy inputs (and NumPy chunks) run scipy itself,
CuPy inputs (and CuPy chunks) the CUDA kernels, Dask arrays a halo exchange sized from the
filter's parameters, with the ``wrap`` mode taking its halo from the other end of the array. The
result has the input's type. Parameters are checked before any work is done.
"""

from __future__ import annotations

import numbers

import numpy as np

from chunkernels import _graph, cuda
from chunkernels._apply import apply_kernel
from chunkernels._shared import filters
from chunkernels._shared.filters import (FilterArgumentError, FilterTypeError,
                                         FilterZeroDivisionError)
from chunkernels.interop import array_entry


@array_entry("input", "output")
def correlate1d(kind, input, weights, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """Calculate a 1-D correlation along the given axis.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array (array-likes are converted with ``numpy.asarray``).
    weights : array_like
        1-D sequence of numbers.
    axis : int
        The axis of ``input`` along which to calculate.
    output : array or dtype, optional
        The array in which to place the output (NumPy or CuPy inputs), or the dtype of the
        returned array. By default the input's dtype.
    mode : {'reflect', 'constant', 'nearest', 'mirror', 'wrap'}
        How the input is extended beyond its boundaries (also 'grid-mirror', 'grid-constant',
        'grid-wrap', synonyms of 'reflect', 'constant', 'wrap').
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    origin : int
        Placement of the filter: 0 centres it; positive values shift it to the left.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The correlation, with the input's shape and type.

    Raises
    ------
    FilterArgumentError
        Empty or non-1-D weights, an unknown mode, an origin out of range, an axis out of range.
    """
    return _filter(kind, "correlate1d", input, output, weights=weights, axis=axis, mode=mode,
                   cval=cval, origin=origin)


@array_entry("input", "output")
def convolve1d(kind, input, weights, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """Calculate a 1-D convolution along the given axis.

    Parameters are those of :func:`correlate1d`; the weights are applied reversed (convolution),
    and ``origin`` moves the filter the other way, as scipy.ndimage.convolve1d.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The convolution, with the input's shape and type.
    """
    return _filter(kind, "convolve1d", input, output, weights=weights, axis=axis, mode=mode,
                   cval=cval, origin=origin)


@array_entry("input", "output")
def correlate(kind, input, weights, output=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """Multidimensional correlation.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    weights : array_like
        Weights, with as many dimensions as filtered axes.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array.
    mode : {'reflect', 'constant', 'nearest', 'mirror', 'wrap'}
        How the input is extended beyond its boundaries (one mode for every axis).
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    origin : int or sequence of int
        Placement of the filter along each filtered axis.
    axes : tuple of int, optional
        The axes to filter (default: all); ``weights.ndim`` must equal their number.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The correlation, with the input's shape and type.
    """
    return _filter(kind, "correlate", input, output, weights=weights, mode=mode, cval=cval,
                   origin=origin, axes=axes)


@array_entry("input", "output")
def convolve(kind, input, weights, output=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """Multidimensional convolution.

    Parameters are those of :func:`correlate`; the weights are applied reversed along every axis
    and each origin moves the filter the other way, as scipy.ndimage.convolve.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The convolution, with the input's shape and type.
    """
    return _filter(kind, "convolve", input, output, weights=weights, mode=mode, cval=cval,
                   origin=origin, axes=axes)


@array_entry("input", "output")
def gaussian_filter1d(kind, input, sigma, axis=-1, order=0, output=None, mode="reflect", cval=0.0,
                      truncate=4.0, *, radius=None):
    """1-D Gaussian filter.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    sigma : scalar
        Standard deviation of the Gaussian kernel.
    axis : int
        The axis to filter.
    order : int
        0 convolves with the Gaussian; 1, 2, ... with its derivatives of that order.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array.
    mode : {'reflect', 'constant', 'nearest', 'mirror', 'wrap'}
        How the input is extended beyond its boundaries.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    truncate : float
        Truncate the filter at this many standard deviations.
    radius : int, optional
        Radius of the kernel; overrides ``truncate``.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    axis = filters.check_axis(axis, np.ndim(input))
    sigma = filters.finite(sigma, "sigma", filters.SIGMA)
    # gaussian_filter skips axes with sigma <= 1e-15; scipy's gaussian_filter1d builds the kernel
    # whatever sigma is, so a sigma that gives no kernel is an error here, as it is there
    if sigma == 0:
        raise FilterZeroDivisionError("sigma must be positive for gaussian_filter1d: sigma=0 "
                                      "gives no Gaussian kernel (gaussian_filter skips such "
                                      "axes)")
    if radius is not None and (not isinstance(radius, numbers.Integral) or radius < 0):
        raise FilterArgumentError(f"Radius must be a nonnegative integer: radius={radius!r}; "
                                  f"gaussian_filter1d takes one radius, an int >= 0")
    filters.gaussian_radius(sigma, truncate, radius)  # a negative sigma's is refused, as scipy
    # scipy's gaussian_filter1d is a correlate1d, which makes a real output dtype complex for
    # complex data (gaussian_filter refuses it)
    return _filter(kind, "gaussian_filter", input, output, promotes=True, sigma=sigma, order=order,
                   mode=filters.canonical_mode(mode), cval=cval, truncate=truncate, radius=radius,
                   axes=(axis,))


@array_entry("input", "output")
def gaussian_filter(kind, input, sigma, order=0, output=None, mode="reflect", cval=0.0,
                    truncate=4.0, *, radius=None, axes=None):
    """Multidimensional Gaussian filter.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    sigma : scalar or sequence of scalars
        Standard deviation of the Gaussian kernel, for every filtered axis or one per axis.
        Axes with sigma <= 1e-15 are not filtered.
    order : int or sequence of ints
        0 convolves with the Gaussian; 1, 2, ... with its derivatives of that order, per axis.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array. Intermediate
        passes are stored in this dtype, as scipy stores them.
    mode : str or sequence of str
        How the input is extended beyond its boundaries, for every axis or one per filtered axis.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    truncate : float
        Truncate the filter at this many standard deviations.
    radius : None, int or sequence of ints
        Radius of the kernel per axis; overrides ``truncate``.
    axes : tuple of int, optional
        The axes to filter (default: all).

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    return _filter(kind, "gaussian_filter", input, output, sigma=sigma, order=order, mode=mode,
                   cval=cval, truncate=truncate, radius=radius, axes=axes)


@array_entry("input", "output")
def uniform_filter1d(kind, input, size, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """1-D uniform (moving average) filter along the given axis.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    size : int
        Length of the filter (at least 1).
    axis : int
        The axis to filter.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array.
    mode : {'reflect', 'constant', 'nearest', 'mirror', 'wrap'}
        How the input is extended beyond its boundaries.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    origin : int
        Placement of the filter.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    axis = filters.check_axis(axis, np.ndim(input))
    size = filters.as_int(size, "size")
    if size < 1:
        raise FilterArgumentError(f"incorrect filter size: size={size!r}; it must be at least 1")
    return _filter(kind, "uniform_filter", input, output, size=size,
                   mode=filters.canonical_mode(mode), cval=cval,
                   origin=filters.check_origin(origin, size, "size"), axes=(axis,))


@array_entry("input", "output")
def uniform_filter(kind, input, size=3, output=None, mode="reflect", cval=0.0, origin=0, *,
                   axes=None):
    """Multidimensional uniform (moving average) filter.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    size : int or sequence of ints
        Filter length for every filtered axis or one per axis; axes of size <= 1 are not filtered.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array.
    mode : str or sequence of str
        How the input is extended beyond its boundaries, for every axis or one per filtered axis.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    origin : int or sequence of ints
        Placement of the filter per axis.
    axes : tuple of int, optional
        The axes to filter (default: all).

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    return _filter(kind, "uniform_filter", input, output, size=size, mode=mode, cval=cval,
                   origin=origin, axes=axes)


@array_entry("input", "output")
def sobel(kind, input, axis=-1, output=None, mode="reflect", cval=0.0):
    """Sobel filter: the derivative along ``axis``, smoothed along the other axes.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array (at least 1-D).
    axis : int
        The axis of the derivative.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array.
    mode : str or sequence of str
        How the input is extended beyond its boundaries, for every axis or one per axis.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    return _filter(kind, "sobel", input, output, axis=axis, mode=mode, cval=cval)


@array_entry("input", "output")
def laplace(kind, input, output=None, mode="reflect", cval=0.0, *, axes=None):
    """N-D Laplace filter based on approximate second derivatives.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array.
    mode : str or sequence of str
        How the input is extended beyond its boundaries, for every axis or one per filtered axis.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    axes : tuple of int, optional
        The axes to filter (default: all).

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    return _filter(kind, "laplace", input, output, mode=mode, cval=cval, axes=axes)


@array_entry("input", "output")
def prewitt(kind, input, axis=-1, output=None, mode="reflect", cval=0.0):
    """Prewitt filter: the derivative along ``axis``, box-smoothed along the other axes.

    Parameters are those of :func:`sobel`: ``[-1, 0, 1]`` along ``axis``, then ``[1, 1, 1]``
    along every other axis, each pass stored in the output dtype as scipy.ndimage.prewitt stores
    it.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.
    """
    return _filter(kind, "prewitt", input, output, axis=axis, mode=mode, cval=cval)


@array_entry("input", "output")
def gaussian_laplace(kind, input, sigma, output=None, mode="reflect", cval=0.0, *, axes=None,
                     truncate=4.0, radius=None):
    """Multidimensional Laplace filter using Gaussian second derivatives.

    As scipy.ndimage.gaussian_laplace (scipy's ``generic_laplace``): for each filtered axis, a
    Gaussian filter of order 2 along it and 0 along the other filtered axes, with that axis'
    mode; the terms are added in the output dtype.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray or dask.array.Array
        The input array.
    sigma : scalar or sequence of scalars
        Standard deviation of the Gaussian, for every filtered axis or one per filtered axis.
    output : array or dtype, optional
        The array in which to place the output, or the dtype of the returned array. Every pass
        and every sum is stored in this dtype, as scipy stores them.
    mode : str or sequence of str
        How the input is extended beyond its boundaries, for every axis or one per filtered
        axis; an axis' mode applies to every pass of its term.
    cval : scalar
        Value to fill past the edges with ``mode='constant'``.
    axes : tuple of int, optional
        The axes to filter (default: all).
    truncate : float
        Truncate the Gaussian at this many standard deviations (scipy's ``**kwargs`` to
        ``gaussian_filter``).
    radius : None, int or sequence of ints
        Radius of the Gaussian, overriding ``truncate``; one for every axis or one per axis of
        the *input* (as scipy passes it to ``gaussian_filter``; the unfiltered axes' are unused).

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The filtered array, with the input's shape and type.

    Notes
    -----
    On a Dask array the halo along each filtered axis is its radius. Where the modes mix
    ``'wrap'`` with others, every term filters every filtered axis with its own mode, so a
    block's edge would need a halo both wrapped around the array and not: those axes are made
    one chunk first.
    """
    return _filter(kind, "gaussian_laplace", input, output, sigma=sigma, mode=mode, cval=cval,
                   axes=axes, truncate=truncate, radius=radius)


@array_entry("input", "output")
def gaussian_gradient_magnitude(kind, input, sigma, output=None, mode="reflect", cval=0.0, *,
                                axes=None, truncate=4.0, radius=None):
    """Multidimensional gradient magnitude using Gaussian derivatives.

    As scipy.ndimage.gaussian_gradient_magnitude (scipy's ``generic_gradient_magnitude``): for
    each filtered axis, a Gaussian filter of order 1 along it and 0 along every other axis, with
    that axis' mode; the terms are squared and added in the output dtype, and the square root is
    cast back to it (integer outputs included).

    Parameters are those of :func:`gaussian_laplace`, except that ``sigma``, like ``radius``, is
    one for every axis or one per axis of the *input*: as scipy, the Gaussian smooths the
    unfiltered axes too. ``axes`` are the axes of the gradient (default: all).

    Returns
    -------
    numpy.ndarray, cupy.ndarray or dask.array.Array
        The gradient magnitude, with the input's shape and type.

    Notes
    -----
    On a Dask array the halo along each axis is its radius. Where the modes mix ``'wrap'`` with
    others those axes are made one chunk first, as for :func:`gaussian_laplace`.
    """
    return _filter(kind, "gaussian_gradient_magnitude", input, output, sigma=sigma, mode=mode,
                   cval=cval, axes=axes, truncate=truncate, radius=radius)


#: The filters for which scipy promotes a real output dtype to complex (with a warning) when the
#: input (or the weights) are complex, and refuses it for the others: the correlations, which
#: take complex weights, and uniform_filter; gaussian_filter1d, a correlate1d there, promotes too.
_PROMOTING = frozenset({"correlate1d", "convolve1d", "correlate", "convolve", "uniform_filter"})


def _filter(kind, kernel, x, output, *, promotes=None, **params):
    """Run filter ``kernel`` on ``x`` (of ``kind``), into ``output`` when it is an array
    (scipy's rules).

    ``promotes``: whether a real output dtype becomes complex for complex data (default: as
    scipy's function of that name does it, :data:`_PROMOTING`).
    """
    x = _graph.as_input(x, kernel)
    filters.check_dtype(x.dtype)
    if kind.dask and filters.is_array(output):
        raise TypeError(f"output= cannot be an array for a Dask input (the result is lazy); "
                        f"pass a dtype, e.g. output={output.dtype.name!r}")
    weights = params.get("weights")
    complex_weights = weights is not None and _dtype_of(weights).kind == "c"
    cval = params.get("cval", 0.0)
    if np.iscomplexobj(cval) and x.dtype.kind != "c":
        raise FilterTypeError(f"Cannot provide a complex-valued cval when the input is real: "
                              f"cval={cval!r} for an input of dtype {x.dtype}; give a real "
                              f"cval, or a complex input")
    dtype, target = filters.resolve_output(output, x, complex_weights=complex_weights,
                                           promotes=kernel in _PROMOTING if promotes is None else
                                           promotes)
    if target is not None and cuda.is_cupy_array(target) != kind.gpu:
        raise TypeError(f"output is a {type(target).__module__} array and the input a "
                        f"{type(x).__module__} one; give an output on the input's device")
    result = apply_kernel(kind, x, kernel, params={**params, "output": dtype}, allow_rechunk=True)
    if target is None:
        return filters.in_requested_byte_order(result, output)
    target[...] = result
    return target


def _dtype_of(a) -> np.dtype:
    """The dtype of an array (NumPy, CuPy) or of what ``numpy.asarray`` makes of ``a``."""
    return a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype
