"""scipy.signal's convolve2d on NumPy, CuPy and Dask arrays, PyTorch tensors and xarray
DataArrays (the output type follows ``in1``).

The GPU lesson's convolution ports line for line::

    from chunkernels.signal import convolve2d
    convolved = convolve2d(diracs, gauss)          # NumPy, CuPy or Dask (chunked) diracs
"""

from __future__ import annotations

import numpy as np

from chunkernels import cuda
from chunkernels._apply import apply_kernel
from chunkernels._graph import as_input
from chunkernels._dispatch import run_block
from chunkernels._registry import get
from chunkernels._shared.filters import FilterArgumentError
from chunkernels.interop import array_entry
from chunkernels.kernels import convolve2d as convolve2d_kernel


def _positions(arguments, axis, n_in, n_out):
    """Where the output samples stand in ``in1`` (an xarray DataArray's coordinates follow):
    'same' is its grid, 'full' extends it by the filter's reach on both sides, 'valid' keeps its
    inner part; ``None`` where 'valid' swaps the inputs (the result is on ``in2``'s grid)."""
    m = np.shape(arguments["in2"])
    mode = arguments["mode"]
    if mode == "same":
        return np.arange(n_out)
    if mode == "full":
        return np.arange(n_out) - (m[axis] - 1) // 2
    if all(n >= k for n, k in zip(arguments["in1"].shape, m)):  # 'valid', not swapped
        return np.arange(n_out) + m[axis] // 2
    return None


@array_entry("in1", "in2", positions=_positions)
def convolve2d(kind, in1, in2, mode="full", boundary="fill", fillvalue=0):
    """Convolve two 2-D arrays, as ``scipy.signal.convolve2d``.

    Parameters
    ----------
    in1 : numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The image. A Dask array is convolved chunk by chunk, with halos from its neighbours. A
        DataArray gives a DataArray; for 'full' and 'valid', its regular coordinates are
        extended or cut to the output's samples.
    in2 : array_like
        The filter (NumPy or CuPy), 2-D. CuPy weights stay on the device: the GPU path reads
        them there, without the host round trip (and device synchronisation) of copying them.
    mode : {'full', 'same', 'valid'}
        The full discrete convolution (shape ``in1.shape + in2.shape - 1``), its centre with
        ``in1``'s shape, or only the outputs that need no boundary values. For 'valid', the
        inputs are swapped when ``in2`` is the larger in every dimension, as scipy swaps them.
    boundary : {'fill', 'wrap', 'symm'}
        How ``in1`` is extended: ``fillvalue``, periodically, or mirrored (edge repeated). Also
        'pad', 'circular' and 'symmetric'.
    fillvalue : scalar
        The value ``boundary='fill'`` pads with, cast to the result type as scipy casts it.

    Returns
    -------
    numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The convolution, in ``numpy.result_type(in1, in2)``, with ``in1``'s array type. Integer
        sums wrap in that type, as scipy's do. Complex inputs are computed by scipy on the CPU
        (CuPy blocks with a ``CPUFallbackWarning``).

    Raises
    ------
    FilterArgumentError
        Inputs that are not 2-D, an unknown mode or boundary, a fill value that is not a scalar
        or that the result type cannot hold, a result type scipy has no convolution for (bool,
        float16), or for ``mode='valid'`` inputs of which neither is at least as large as the
        other in every dimension.
    """
    x = as_input(in1, "convolve2d", "in1", chunk_sizes=True)
    spec = get("convolve2d")
    params = spec.params(x.ndim, {"weights": in2, "mode": mode, "boundary": boundary,
                                  "fillvalue": fillvalue})
    weights = params["weights"]
    out_dtype = spec.out_dtype(x.dtype, (), params)
    convolve2d_kernel.check_types(out_dtype)
    params["fillvalue"] = convolve2d_kernel.fill_value(params["fillvalue"], out_dtype)
    if params["mode"] == "valid" and not all(n >= m for n, m in zip(x.shape, weights.shape)):
        if not all(m >= n for n, m in zip(x.shape, weights.shape)):
            raise FilterArgumentError(
                f"For 'valid' mode, one must be at least as large as the other in every "
                f"dimension: in1 {x.shape}, in2 {weights.shape}")
        # scipy swaps the inputs (convolution commutes): the smaller in1 becomes the filter
        x, params["weights"] = (kind.from_host(cuda.to_host(weights)),
                                convolve2d_kernel.validate(2, kind.to_host(x))["weights"])
    if x.size == 0 or params["weights"].size == 0:  # scipy's shapes for empty inputs, from scipy
        return kind.from_host(spec.cpu(kind.to_host(x), **params))
    if not kind.dask:  # the parameters are validated: run it now, without validating again
        return run_block(spec, x, (), params)
    if params["mode"] == "same":
        return apply_kernel(kind, x, "convolve2d", params=params, allow_rechunk=True)
    return _chunked_window(kind, x, params, out_dtype)


def _chunked_window(kind, x, params, out_dtype):
    """'full' or 'valid' on a Dask array: 'same' on a padded (full) or plain (valid) array,
    sliced to the mode's window; the padding extends the array as ``boundary`` says."""
    import dask.array as da

    weights, bd = params["weights"], params["boundary"]
    if params["mode"] == "full":
        pad = [(m - 1, m - 1) for m in weights.shape]
        if bd == "fill":
            # the fill value is one of the result type, which in1's type may not hold
            x = da.pad(x.astype(out_dtype), pad, constant_values=params["fillvalue"])
        elif all(m - 1 <= n for n, m in zip(x.shape, weights.shape)):
            x = da.pad(x, pad, mode=convolve2d_kernel.PAD_MODE[bd])
        else:
            # dask's pad extends by at most the array's length (wider pads come out the wrong
            # shape): an image smaller than its kernel is extended by index instead
            for axis, (n, m) in enumerate(zip(x.shape, weights.shape)):
                x = da.take(x, convolve2d_kernel.extension(n, m - 1, bd), axis=axis)
        keep = [n - 2 * (m - 1) + m - 1 for n, m in zip(x.shape, weights.shape)]
    else:
        keep = [n - m + 1 for n, m in zip(x.shape, weights.shape)]
    same = apply_kernel(kind, x, "convolve2d", params={**params, "mode": "same",
                                                       "boundary": "fill"}, allow_rechunk=True)
    return same[tuple(slice(m // 2, m // 2 + k) for m, k in zip(weights.shape, keep))]
