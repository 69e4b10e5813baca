"""xarray DataArrays in, DataArrays out: which labels a result keeps.

A chunkernels function given a ``DataArray`` works on its data (``DataArray.data``: NumPy, CuPy
or Dask, a Dask-backed DataArray staying lazy) and gives its results their labels back
(:func:`on_grid`):

* a result of the input's shape is labelled as the input: its dims, coordinates, attributes
  (unless ``xarray.set_options(keep_attrs=False)``) and name; not its ``encoding``, which
  describes how the input was stored;
* a result with the input's dims whose samples moved along some (a zoom, a resize, a 'full' or
  'valid' convolution: other lengths, or samples the function places elsewhere) keeps the dims,
  the attributes, the name and every coordinate that does not lie along a moved dim. A 1-D
  coordinate along a moved dim is resampled where the function says where its samples stand in
  the input (``positions``) and the coordinate is regular, evenly spaced numbers or dates
  (:func:`resampled`); any other is dropped;
* any other result (a reduction, a measurement, a table) comes back as the plain values the
  function returns for the data, as xarray's reductions drop the dims they reduce.

DataArrays passed as other arguments (labels, an output, operands) are used by position, as
their data; one that shares dim names with the input must have them in the input's order
(:func:`check_dims`), as NumPy's broadcasting aligns them.

xarray is never imported here: a DataArray can only exist once the caller has imported it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chunkernels._imports import imported


def module():
    """The ``xarray`` module once the caller has imported it, else ``None``."""
    return imported("xarray")


def check_dims(first, other, name: str) -> None:
    """Refuse DataArray argument ``other`` (named ``name``) whose dims NumPy's positional
    broadcasting would not align with ``first``'s by name: it must name none of ``first``'s
    dims, or have ``first``'s last dims, in order."""
    dims = tuple(other.dims)
    if not set(dims) & set(first.dims):
        return
    trailing = tuple(first.dims)[len(first.dims) - len(dims):] if len(dims) <= first.ndim else None
    if dims != trailing:
        raise ValueError(
            f"{name} has dims {dims} and the input {tuple(first.dims)}: chunkernels reads "
            f"DataArrays by position, so {name} must have the input's dims in its order (or "
            f"its last ones, for broadcasting); transpose it first, e.g. "
            f"{name}.transpose(*input.dims)")


def on_grid(result, template, positions: Callable[[int, int, int], Any] | None = None):
    """``result``, computed from ``template.data``, labelled as the module docstring says.

    Parameters
    ----------
    result
        An array (NumPy, CuPy or Dask).
    template : xarray.DataArray
        The input.
    positions
        ``positions(axis, n_in, n_out)``: where the result's ``n_out`` samples along ``axis``
        stand among the input's ``n_in``, in (fractional) input indices, or ``None`` where
        they are not on the input's grid. Without it, an axis of the input's length is taken
        to be on its grid, any other as not.
    """
    if getattr(result, "ndim", None) != template.ndim:
        return result
    xr = module()
    moved = {}  # dim -> where its samples stand in the input (None: unknown)
    for axis, (dim, n, m) in enumerate(zip(template.dims, template.shape, result.shape)):
        where = positions(axis, n, m) if positions is not None else None
        same = np.array_equal(where, np.arange(n)) if where is not None else positions is None
        if n != m or not same:
            moved[dim] = where
    along = [name for name, c in template.coords.items() if set(moved) & set(c.dims)]
    kept = template.drop_vars(along) if along else template
    keep_attrs = xr.get_options()["keep_attrs"] is not False  # True, or xarray's "default"
    out = xr.DataArray(result, coords=kept.coords, dims=template.dims, name=template.name,
                       attrs=dict(template.attrs) if keep_attrs else {})
    new = {}
    for name in along:
        coordinate = template.coords[name]
        where = moved[coordinate.dims[0]] if coordinate.ndim == 1 else None
        values = None if where is None else resampled(np.asarray(coordinate.values), where)
        if values is not None:
            new[name] = (coordinate.dims[0], values, dict(coordinate.attrs))
    return out.assign_coords(new) if new else out


def resampled(values: np.ndarray, positions: Sequence[float]) -> np.ndarray | None:
    """1-D coordinate ``values`` at the fractional indices ``positions``, or ``None`` where
    they are not regular (evenly spaced numbers, dates or durations, at least two of them).

    Regular values are a line through their index, so their value anywhere on it (outside the
    input too) is exact. Dates and durations stay in their unit, rounded to it; integers stay
    integers where every position is whole, else become floats; floats keep their precision.
    """
    n = values.shape[0]
    kind = values.dtype.kind
    if n < 2 or kind not in "iufmM":
        return None
    where = np.asarray(positions, dtype=np.float64)
    if kind in "mM":
        if np.isnat(values).any():
            return None
        whole = values.view(np.int64)
        span = int(whole[-1]) - int(whole[0])
        if span % (n - 1) or not (np.diff(whole) == span // (n - 1)).all():
            return None
        return (whole[0] + np.round(where * (span // (n - 1))).astype(np.int64)).view(values.dtype)
    if kind in "iu":
        whole = values.astype(np.int64)
        span = int(whole[-1]) - int(whole[0])
        if span % (n - 1) or not (np.diff(whole) == span // (n - 1)).all():
            return None
        out = whole[0] + where * (span // (n - 1))
        info = np.iinfo(values.dtype)
        if (where == np.round(where)).all() and ((out >= info.min) & (out <= info.max)).all():
            return out.astype(values.dtype)
        return out
    if not np.isfinite(values[[0, -1]]).all():
        return None
    step = (float(values[-1]) - float(values[0])) / (n - 1)
    # evenly spaced up to the rounding of the values themselves (float32 grids carry theirs)
    tolerance = 16 * np.finfo(values.dtype).eps * float(np.abs(values[[0, -1]]).max())
    if not (np.abs(np.diff(values.astype(np.float64)) - step) <= tolerance).all():
        return None
    return (float(values[0]) + where * step).astype(values.dtype)
