"""Spline interpolation arguments by scipy.ndimage's rules: for the interpolation kernels
(:mod:`chunkernels.kernels.spline_filter`, :mod:`chunkernels.kernels.zoom`) and the front end
that runs them (:mod:`chunkernels.ndimage`'s ``zoom``, ``resize`` and ``spline_filter``)."""

from __future__ import annotations

import numbers

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
