"""Spline interpolation arguments by scipy.ndimage's rules: for the interpolation kernels
(:mod:`chunkernels.kernels.spline_filter`, :mod:`chunkernels.kernels.zoom`) and the front end
that runs them (:mod:`chunkernels.ndimage`'s ``zoom``, ``resize`` and ``spline_filter``)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from chunkernels._shared.filters import finite

#: Edge modes, as scipy.ndimage spells them.
MODES = ("constant", "grid-constant", "nearest", "reflect", "grid-mirror", "mirror", "wrap",
         "grid-wrap")
#: Synonyms scipy.ndimage accepts.
_SYNONYMS = {"grid-mirror": "reflect"}
#: Samples SciPy pads on every side before prefiltering for these modes, whose exact spline
#: boundary conditions it does not implement (``_prepad_for_spline_filter``): the zoom's tables
#: then index the padded coefficients.
PREPAD = 12
PREPADDED = ("nearest", "grid-constant")


class InterpolationError(ValueError, RuntimeError):
    """An argument ``scipy.ndimage`` refuses: spline order, edge mode, zoom sequence length.

    A ``ValueError`` by chunkernels' rules and a ``RuntimeError`` as SciPy raises for these, so
    code written against either catches it.
    """


class NonFiniteZoomError(InterpolationError, OverflowError):
    """A zoom factor that is NaN or infinite, or gives an infinite output length.

    An :class:`InterpolationError` (a ``ValueError``, what SciPy's ``round()`` raises for NaN)
    and an ``OverflowError`` (what it raises for infinity); the message names the factor.
    """


class OutputTooLargeError(InterpolationError, MemoryError):
    """An interpolation output that no machine or cluster could hold (over
    :data:`MAX_OUTPUT_BYTES`), refused before any work.

    An :class:`InterpolationError` and a ``MemoryError``, which is what NumPy raises when it
    cannot allocate one; the message gives the shape, the bytes and the limit.
    """


#: The largest output zoom and resize make: 256 TiB, more than any machine or cluster holds in
#: memory. Beyond it the planning alone (a table entry per output index and tap) would take the
#: host's memory and minutes before anything failed (zoom=1e6 on 20 x 24 samples asks for 3.8 PB).
MAX_OUTPUT_BYTES = 2**48

ZOOM = "give the factor by which to scale each axis (the output length is round(n * zoom))"


def output_shape(in_shape, zoom) -> tuple[int, ...]:
    """scipy.ndimage.zoom's output shape ``round(n * zoom)`` for one factor per axis, the factors
    checked first: finite numbers (:class:`NonFiniteZoomError`), giving non-negative lengths."""
    shape = []
    for axis, (n, f) in enumerate(zip(in_shape, zoom)):
        f = finite(f, "zoom", ZOOM, where=f" for axis {axis}", error=NonFiniteZoomError)
        length = n * float(f)
        if not math.isfinite(length):
            raise NonFiniteZoomError(f"zoom={f!r} gives an infinite output length along axis "
                                     f"{axis} (of {n} samples); {ZOOM}")
        shape.append(int(round(length)))
    if any(n < 0 for n in shape):
        raise ValueError(f"negative dimensions are not allowed: zoom={tuple(zoom)!r} gives the "
                         f"output shape {tuple(shape)} for an input of shape {tuple(in_shape)}; "
                         f"give zoom >= 0")
    return tuple(shape)


def check_output_size(who: str, in_shape, out_shape, dtype) -> None:
    """Refuse an output of ``out_shape`` and ``dtype`` over :data:`MAX_OUTPUT_BYTES`
    (:class:`OutputTooLargeError`), before the tables, the prefilter or a graph are made."""
    size = math.prod(out_shape) * np.dtype(dtype).itemsize
    if size <= MAX_OUTPUT_BYTES:
        return
    from dask.utils import format_bytes

    # a size past a float's range (zoom=1e300) is told by its power of two
    shown = format_bytes(size) if size < 2**1000 else f"over 2**{size.bit_length() - 1} bytes"
    raise OutputTooLargeError(
        f"{who}: the output would be {shown}: shape {tuple(out_shape)} of "
        f"{np.dtype(dtype).name} from an input of shape {tuple(in_shape)}; chunkernels refuses "
        f"outputs over {format_bytes(MAX_OUTPUT_BYTES)} (2**48 bytes), more than any machine or "
        f"cluster holds, before any work. Check the zoom factors or output shape (a factor meant "
        f"for one axis given for all?), or zoom a region of the input")


def check_order(order, *, low=0) -> int:
    """``order`` as an int in ``low..5``, or :class:`InterpolationError`."""
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or not low <= order <= 5:
        raise InterpolationError(f"spline order not supported: order={order!r}; scipy.ndimage "
                                 f"interpolates with integer orders {low}..5")
    return int(order)


def check_mode(mode) -> str:
    """``mode`` normalised (``'grid-mirror'`` is ``'reflect'``), or :class:`InterpolationError`."""
    if mode not in MODES:
        raise InterpolationError(f"boundary mode not supported: mode={mode!r}; expected one of "
                                 f"{', '.join(MODES)}")
    return _SYNONYMS.get(mode, mode)
