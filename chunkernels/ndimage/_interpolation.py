"""Spline interpolation with ``scipy.ndimage``'s semantics: zoom, resize and the spline prefilter.

The work splits in two kernels: :mod:`chunkernels.kernels.spline_filter` computes the B-spline
coefficients, :mod:`chunkernels.kernels.zoom` resamples them through per-axis tables of the
positions each output reads and their weights (SciPy's ``NI_ZoomShift``, vectorised:
:func:`chunkernels.kernels.zoom.zoom_tables`). The argument rules the kernels share with these
functions are in :mod:`chunkernels._shared.interpolation`. This module checks the arguments,
prefilters, plans the tables and runs the two kernels on NumPy, CuPy and Dask arrays.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from chunkernels import cuda
from chunkernels._apply import apply_kernel
from chunkernels._graph import as_input, is_dask
from chunkernels._shared.filters import check_dtype, check_writable, in_requested_byte_order
from chunkernels._shared.interpolation import (PREPAD, PREPADDED, InterpolationError, check_mode,
                                               check_order, check_output_size, output_shape)
from chunkernels.interop import array_entry
from chunkernels.kernels.spline_filter import check_depths, depth
from chunkernels.kernels.zoom import default_chunks, input_positions, zoom_scales, zoom_tables


def _sequence(value, ndim, what) -> tuple:
    if isinstance(value, str) or not np.iterable(value):
        return (value,) * ndim
    value = tuple(value)
    if len(value) != ndim:
        raise InterpolationError(f"sequence argument must have length equal to input rank: "
                                 f"{what} has {len(value)} values for an input of {ndim} dims")
    return value


# -- public functions ---------------------------------------------------------------------------


def _check_dtype(dtype, what):
    """``dtype`` if SciPy's interpolation reads and writes it (not float16, nor long double), or
    :class:`InterpolationError`, as SciPy's C code raises for those."""
    return check_dtype(dtype, what, error=InterpolationError,
                       takes="scipy.ndimage interpolates")


def _output(kind, output, x, shape):
    """``(dtype, array to fill or None)`` from SciPy's ``output`` argument (``_get_output``):
    the input's and the output's dtypes checked, a real dtype promoted to complex (with a
    warning) for complex data, except where given as a string, which SciPy refuses."""
    complex_input = x.dtype.kind == "c"
    _check_dtype(x.dtype, "input")
    if output is None:
        return x.dtype, None
    if not isinstance(output, type | np.dtype | str) and hasattr(output, "shape"):
        if kind.dask or is_dask(output):
            raise TypeError("output arrays are not supported for Dask arrays: pass a dtype "
                            "(output=numpy.float32) and store the lazy result where you want it")
        check_writable(output, InterpolationError)
        if tuple(output.shape) != tuple(shape):
            raise InterpolationError(f"output shape not correct: output has shape {output.shape}; "
                                     f"the result has shape {tuple(shape)}")
        if complex_input and output.dtype.kind != "c":
            raise InterpolationError(f"output must have complex dtype: the input is "
                                     f"{x.dtype}, output is {output.dtype}")
        if cuda.is_cupy_array(output) != kind.gpu:
            raise TypeError(f"output is a {type(output).__module__} array but the input a "
                            f"{type(x).__module__} one; pass an output on the input's device")
        return _check_dtype(output.dtype, "output"), output
    dtype = np.dtype(output)
    if isinstance(output, str) and not issubclass(dtype.type, np.number | np.bool_):
        raise InterpolationError(f"output must have numeric dtype: output={output!r}")
    if complex_input and dtype.kind != "c":
        if isinstance(output, str):
            raise InterpolationError(f"output must have complex dtype: the input is {x.dtype}, "
                                     f"output={output!r}; pass a complex dtype such as "
                                     f"'complex128'")
        warnings.warn("promoting specified output dtype to complex", stacklevel=3)
        dtype = np.promote_types(dtype, np.complex64)
    return _check_dtype(dtype, "output"), None


def _store(result, out, output):
    """``result`` into ``out`` (an output array), else as returned: in the byte order of a
    non-native ``output`` dtype, as SciPy returns it."""
    if out is None:
        return in_requested_byte_order(result, output)
    out[...] = result
    return out


def _coefficient_dtype(kind, x, dtype) -> np.dtype:
    """SciPy interpolates from float64 coefficients; on the GPU, float32 data zoomed into float32
    keeps float32 ones (half the memory traffic; within 1e-5 of SciPy for data in [0, 1]). Any
    other output (float64, integers rounded to the nearest) gets float64 ones."""
    if x.dtype.kind == "c":
        return np.dtype(np.complex128)
    if x.dtype == np.float32 and dtype == np.float32 and kind.gpu:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _prepad(kind, x, mode, cval):
    """SciPy's ``_prepad_for_spline_filter``: ``PREPAD`` samples of edge values or cval on every
    side, for the modes whose exact spline extension SciPy does not implement. A Dask array keeps
    its chunks, the padding added to the edge chunks by the edge blocks' own tasks (``da.pad``
    would cut the padding into chunks the size of the input's)."""
    if mode not in PREPADDED:
        return x, 0
    kwargs = {"mode": "edge"} if mode == "nearest" else {"mode": "constant", "constant_values": cval}
    if not kind.dask:
        return kind.xp.pad(x, PREPAD, **kwargs), PREPAD
    import dask.array as da

    padded = da.map_blocks(_pad_edge_block, x, PREPAD, kwargs, dtype=x.dtype, meta=x._meta,
                           chunks=_padded_chunks(x.chunks, PREPAD))
    return padded, PREPAD


def _pad_edge_block(block, npad, kwargs, block_info=None):
    """``block`` padded by ``npad`` on the sides where it touches the array's edge."""
    where = block_info[0]
    widths = [(npad if i == 0 else 0, npad if i == n - 1 else 0)
              for i, n in zip(where["chunk-location"], where["num-chunks"])]
    return cuda.array_module(block).pad(block, widths, **kwargs)


def _coefficients(kind, x, order, mode, dtype, axes=None, depths=None):
    """B-spline coefficients of ``x`` along ``axes`` (default all), chunk by chunk for Dask.

    Each chunk is filtered with the halo :func:`chunkernels.kernels.spline_filter.depth` from its
    neighbours (or ``depths``, one per axis, as the caller asks). Along the filtered axes,
    chunks narrower than that halo are first merged with their neighbours until each is at least
    as wide: a block's halo then comes from its two neighbours alone, where one-sample chunks
    would make every block gather dozens of them.
    """
    if kind.dask and x.size == 0:  # nothing to filter; Dask's rechunk would drop CuPy's meta
        return x.astype(dtype)
    params = {"order": order, "axes": axes, "mode": mode, "dtype": dtype}
    if kind.dask:
        if depths is not None:
            params["depths"] = depths
        halo = (depth(order, dtype),) * x.ndim if depths is None else depths
        merged = {a: _merge_chunks(x.chunks[a], halo[a])
                  for a in (range(x.ndim) if axes is None else axes)
                  if not any(math.isnan(c) for c in x.chunks[a])}
        merged = {a: c for a, c in merged.items() if c != x.chunks[a]}
        if merged:
            x = x.rechunk(merged)
    return apply_kernel(kind, x, "spline_filter", params=params, allow_rechunk=True)


def _merge_chunks(chunks, width):
    """``chunks`` with neighbours merged until every chunk is at least ``width`` (or the axis)."""
    merged, run = [], 0
    for c in chunks:
        run += c
        if run >= width:
            merged.append(run)
            run = 0
    if run and merged:
        merged[-1] += run
    elif run or not merged:
        merged.append(run)
    return tuple(merged)


def _padded_chunks(chunks, npad):
    return tuple((c[0] + 2 * npad,) if len(c) == 1 else (c[0] + npad, *c[1:-1], c[-1] + npad)
                 for c in chunks)


def _resample(kind, who, x, out_shape, output, order, mode, cval, prefilter, grid_mode,
              identity):
    """Zoom ``x`` (NumPy, CuPy or Dask, of ``kind``) to ``out_shape``: prefilter, tables,
    resampling, for function ``who`` (zoom or resize).

    ``identity``: the zoom is by 1 on every axis, which SciPy answers with a copy of the input
    (cast to the output dtype) when prefiltering.
    """
    order = check_order(order)
    checked = check_mode(mode)
    if x.ndim < 1:
        raise InterpolationError("input and output rank must be > 0: got a 0-d input")
    dtype, out = _output(kind, output, x, out_shape)
    check_output_size(who, x.shape, out_shape, dtype)
    if grid_mode and mode in ("constant", "wrap"):
        suggest = "grid-constant" if mode == "constant" else "grid-wrap"
        warnings.warn(f"It is recommended to use mode = {suggest} instead of {mode} when "
                      f"grid_mode is True.", stacklevel=3)
    if identity and prefilter:  # SciPy's early exit (gh-20999)
        return _store(x.astype(dtype, copy=True), out, output)
    if math.prod(out_shape) == 0:  # nothing to interpolate (nor any block to plan)
        return _store(kind.from_host(np.empty(out_shape, dtype=dtype)), out, output)
    if dtype.kind == "c" and x.dtype.kind != "c":
        # SciPy's C resampler writes no complex output for real data (it refuses it there, past
        # the copy and the empty result above)
        raise InterpolationError(f"data type not supported: a complex output ({dtype}) for a "
                                 f"real input ({x.dtype}); zoom x.astype({dtype.name!r}) for a "
                                 f"complex result")
    npad = 0
    coefficients = x
    if prefilter and order > 1:
        padded, npad = _prepad(kind, x, checked, cval)
        coefficients = _coefficients(kind, padded, order, checked,
                                     _coefficient_dtype(kind, x, dtype))
    taps, weights = zoom_tables(x.shape, out_shape, order=order, mode=checked,
                                grid_mode=grid_mode, npad=npad)
    chunks = None
    if kind.dask:
        chunks = default_chunks(taps, _padded_chunks(x.chunks, npad))
    result = apply_kernel(kind, coefficients, "zoom", params={
        "taps": taps, "weights": weights, "cval": cval, "dtype": dtype, "chunks": chunks})
    return _store(result, out, output)


def _grid_mode(x, grid_mode) -> bool:
    """zoom's ``grid_mode`` for input ``x``: SciPy zooms complex data as its real and imaginary
    parts without passing grid_mode on, so it is False for complex inputs there, and here too."""
    return bool(grid_mode) and x.dtype.kind != "c"


def _positions(grid_mode, n_in, n_out):
    (scale,) = zoom_scales((n_in,), (n_out,), grid_mode)
    return input_positions(np.arange(n_out), scale, grid_mode)


def _zoom_positions(arguments, axis, n_in, n_out):
    """Where zoom's output samples stand in the input (a DataArray's coordinates follow)."""
    return _positions(_grid_mode(arguments["input"], arguments["grid_mode"]), n_in, n_out)


def _resize_positions(arguments, axis, n_in, n_out):
    """Where resize's output samples stand in the input (a DataArray's coordinates follow)."""
    return _positions(bool(arguments["grid_mode"]), n_in, n_out)


@array_entry("input", "output", positions=_zoom_positions)
def zoom(kind, input, zoom, output=None, order=3, mode="constant", cval=0.0, prefilter=True, *,
         grid_mode=False):
    """Zoom an array by spline interpolation, as ``scipy.ndimage.zoom``, chunk by chunk.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The array to zoom (any number of dims). Dask arrays give a lazy result chunked like
        the input (each output block reads one input block plus the spline's support); tensors
        give a tensor on the same device, computed without copies (:mod:`chunkernels.interop`);
        DataArrays a DataArray whose regular coordinates along the zoomed axes are resampled
        onto the output's samples (others along them are dropped).
    zoom : float or sequence of float
        Zoom factor, one for all axes or one per axis. The output shape is
        ``round(input.shape * zoom)``.
    output : array or dtype, optional
        Array to fill (NumPy, CuPy or tensor inputs) or dtype of the result; default the
        input's dtype. Integer outputs are rounded half away from zero and clipped.
    order : int, optional
        Spline order, 0..5 (0 nearest, 1 linear, 3 cubic). Default 3.
    mode : {'constant', 'grid-constant', 'nearest', 'reflect', 'grid-mirror', 'mirror', 'wrap', 'grid-wrap'}
        How the input extends beyond its edges, as in SciPy. Default ``'constant'``.
    cval : scalar, optional
        Value beyond the edges for the constant modes. Default 0.
    prefilter : bool, optional
        Compute B-spline coefficients first (orders > 1). Pass ``False`` when ``input`` already
        holds them (:func:`spline_filter` with the same mode). Default True.
    grid_mode : bool, optional
        False: the zoom maps the first and last pixel centres onto each other (SciPy's default,
        PyTorch's ``align_corners=True``). True: it maps the pixels' outer edges. Complex
        inputs are zoomed with False whatever is given, as SciPy 1.17 zooms them (its complex
        path does not pass ``grid_mode`` on).

    Returns
    -------
    numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The zoomed array, of the input's type (``output`` itself when it is an array).

    Raises
    ------
    InterpolationError
        Unsupported order or mode, a zoom sequence of the wrong length, a 0-d input, an output
        of the wrong shape, an input or output dtype SciPy does not interpolate (float16, long
        double) (a ``ValueError`` and a ``RuntimeError``, as SciPy raises).
    ValueError
        A negative zoom (a negative output length).

    Notes
    -----
    Results equal SciPy's up to rounding for orders 0 and 1, and within 1e-9 (float64) for the
    spline orders. On the GPU, float32 inputs zoomed into float32 are prefiltered and summed in
    float32: within 1e-5 of SciPy for data in [0, 1].
    """
    x = as_input(input, "zoom", chunk_sizes=True)
    if x.ndim < 1:
        raise InterpolationError("input and output rank must be > 0: got a 0-d input")
    factors = _sequence(zoom, x.ndim, "zoom")
    out_shape = output_shape(x.shape, factors)
    # SciPy's early exit tests the factors: 1.01 on 5 samples still interpolates onto 5
    identity = all(f == 1 for f in factors)
    return _resample(kind, "zoom", x, out_shape, output, order, mode, cval, prefilter,
                     _grid_mode(x, grid_mode), identity)


@array_entry("input", "output", positions=_resize_positions)
def resize(kind, input, output_shape, output=None, order=3, mode="constant", cval=0.0,
           prefilter=True, *, grid_mode=False):
    """Resample an array to ``output_shape``: :func:`zoom` with the shape given instead of factors.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The array to resample (a DataArray's coordinates as for :func:`zoom`).
    output_shape : sequence of int
        The result's shape, one length per axis of ``input``.
    output, order, mode, cval, prefilter, grid_mode
        As :func:`zoom`. With ``grid_mode=False`` (default) the first and last samples map onto
        each other, as PyTorch's ``interpolate(..., align_corners=True)``; ``grid_mode=True``
        maps the pixels' outer edges, as ``align_corners=False`` (pick ``mode='nearest'`` or
        ``'grid-constant'`` for the edges).

    Returns
    -------
    numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The resampled array, of the input's type.

    Raises
    ------
    InterpolationError
        As :func:`zoom`; also an ``output_shape`` of the wrong length.
    ValueError
        A negative length in ``output_shape``.
    """
    x = as_input(input, "resize", chunk_sizes=True)
    if x.ndim < 1:
        raise InterpolationError("input and output rank must be > 0: got a 0-d input")
    shape = tuple(_sequence(output_shape, x.ndim, "output_shape"))
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"output_shape={tuple(output_shape)!r}: lengths must be "
                             f"non-negative integers")
    shape = tuple(int(n) for n in shape)
    return _resample(kind, "resize", x, shape, output, order, mode, cval, prefilter, grid_mode,
                     shape == tuple(x.shape))


@array_entry("input", "output")
def spline_filter1d(kind, input, order=3, axis=-1, output=np.float64, mode="mirror",
                    depth=None):
    """B-spline coefficients along one axis, as ``scipy.ndimage.spline_filter1d``.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The samples. Dask arrays are filtered chunk by chunk, each chunk with a halo after
        which the result is exact to the output dtype's resolution (rechunked where a chunk
        is smaller than that halo).
    order : int, optional
        Spline order, 0..5 (0 and 1 return a copy). Default 3.
    axis : int, optional
        The axis filtered. Default the last.
    output : array or dtype, optional
        Array to fill or dtype of the result. Default float64.
    mode : str, optional
        Edge mode the coefficients are for (as :func:`zoom`'s). Default ``'mirror'``.
    depth : int, optional
        Dask arrays: the halo along ``axis``, in samples, as ``dask_image.ndinterp``'s
        ``depth``. Default (None): the halo after which the coefficients are exact to the
        output dtype's resolution (:func:`chunkernels.kernels.spline_filter.depth`: 13 samples
        for cubic float32, 28 for float64). A smaller halo is cheaper and approximate. Whole
        arrays are filtered exactly whatever it is. ``ValueError`` unless one integer, at
        least 0.

    Returns
    -------
    numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The coefficients, of the input's type.
    """
    order = check_order(order)
    x = as_input(input, "spline_filter1d", chunk_sizes=True)
    axis = normalize_axis_index(axis, x.ndim)
    depths = None
    if depth is not None:
        if np.ndim(depth) != 0:
            raise ValueError(f"spline_filter1d: depth must be one integer, the halo along the "
                             f"filtered axis; got {depth!r}")
        depths = check_depths({axis: depth}, x.ndim)
    dtype, out = _output(kind, output, x, x.shape)
    if order < 2:
        return _store(x.astype(dtype, copy=True), out, output)
    return _store(_coefficients(kind, x, order, mode, dtype, axes=(axis,), depths=depths), out,
                  output)


@array_entry("input", "output")
def spline_filter(kind, input, order=3, output=np.float64, mode="mirror", depth=None):
    """B-spline coefficients along every axis, as ``scipy.ndimage.spline_filter``.

    Parameters
    ----------
    input : numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The samples (Dask arrays: chunk by chunk, as :func:`spline_filter1d`).
    order : int, optional
        Spline order, 2..5. Default 3.
    output : array or dtype, optional
        Array to fill or dtype of the result. Default float64.
    mode : str, optional
        Edge mode the coefficients are for. Default ``'mirror'``.
    depth : int, sequence of int or dict, optional
        Dask arrays: the halo along each axis, as ``dask_image.ndinterp``'s ``depth`` (one
        integer for every axis, one per axis, or ``{axis: halo}``). Default (None): exact to
        the output dtype's resolution, as :func:`spline_filter1d`'s.

    Returns
    -------
    numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The coefficients, of the input's type. Pass them to :func:`zoom` with
        ``prefilter=False`` and the same ``mode``.
    """
    order = check_order(order, low=2)
    x = as_input(input, "spline_filter", chunk_sizes=True)
    depths = None if depth is None else check_depths(depth, x.ndim)
    dtype, out = _output(kind, output, x, x.shape)
    return _store(_coefficients(kind, x, order, mode, dtype, depths=depths), out, output)
