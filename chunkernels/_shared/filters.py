"""Filter arguments by scipy.ndimage's rules, checked once, up front: for the filter kernels and
the front ends that run them (:mod:`chunkernels.ndimage`, :mod:`chunkernels.signal`).

Every filter kernel's ``validate`` turns the user's arguments into plain, normalised values
(tuples of per-axis modes, sizes and origins, an output dtype) with scipy.ndimage's semantics,
and raises before any work. The halo and Dask boundary of a kernel are derived from these values.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import warnings
from collections.abc import Iterable

import numpy as np

from chunkernels import cuda

#: scipy.ndimage's filter boundary modes, in the order of their codes in
#: ``kernels_cuda/boundary.cuh`` (MODE_REFLECT = 0, ...).
MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
#: scipy's synonyms for filters: the grid- modes behave as their plain names there.
MODE_SYNONYMS = {"grid-mirror": "reflect", "grid-wrap": "wrap", "grid-constant": "constant"}


class FilterArgumentError(ValueError, RuntimeError):
    """An invalid filter argument (mode, size, sequence length, weights, origin, axes).

    Also a ``RuntimeError``, which is what scipy.ndimage raises for several of these, so code
    written against scipy catches it unchanged.
    """


class FilterTypeError(TypeError, FilterArgumentError):
    """A filter argument of the wrong type: a float where an integer is needed (an origin, an
    axis, a size), a complex number where a real one is (a sigma, ``cval`` for real data).

    A ``TypeError``, as scipy.ndimage raises for these, and a :class:`FilterArgumentError`.
    """


class NonFiniteError(FilterArgumentError, OverflowError):
    """A parameter that must be a finite number (a sigma, a truncation, a size) is NaN or
    infinite, or gives an infinite radius.

    A :class:`FilterArgumentError` (a ``ValueError``, what SciPy's ``int()`` raises for NaN) and
    an ``OverflowError`` (what it raises for infinity), so code written against SciPy catches it
    unchanged; the message names the parameter and its value, which SciPy's does not.
    """


class FilterAxisError(np.exceptions.AxisError, FilterArgumentError):
    """An axis out of range: NumPy's ``AxisError`` (a ``ValueError`` and an ``IndexError``), as
    scipy.ndimage raises, and a :class:`FilterArgumentError`."""


class FilterZeroDivisionError(ZeroDivisionError, FilterArgumentError):
    """A parameter that leaves a filter nothing to compute with, such as ``sigma=0`` for
    ``gaussian_filter1d``: a ``ZeroDivisionError``, which is what scipy.ndimage runs into there,
    and a :class:`FilterArgumentError` that says why."""


#: Dtypes scipy.ndimage's filters read and write (float16 and long double raise there).
SCIPY_DTYPES = frozenset(np.dtype(d) for d in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128"))


def check_dtype(dtype, what: str = "input", *, error=None,
                takes: str = "the filters take") -> np.dtype:
    """``dtype`` in native byte order if scipy.ndimage takes it (its filters, and its
    interpolation), else ``error`` (default :class:`FilterArgumentError`) saying what ``takes``
    the accepted dtypes. Either byte order is taken, as SciPy takes it (``>f8`` is float64)."""
    dtype = np.dtype(dtype)
    if not dtype.isnative and dtype.fields is None:
        dtype = dtype.newbyteorder("=")
    if dtype not in SCIPY_DTYPES:
        accepted = ", ".join(sorted(d.name for d in SCIPY_DTYPES))
        raise (error or FilterArgumentError)(
            f"array type {dtype} not supported: the {what} has dtype {dtype}; {takes} "
            f"{accepted} (convert it first, e.g. x.astype(numpy.float32))")
    return dtype


def as_int(value, name: str) -> int:
    """``value`` as a Python int, or :class:`FilterTypeError` (floats are not integers here)."""
    try:
        return operator.index(value)
    except TypeError:
        raise FilterTypeError(f"{name} must be an integer: {value!r} cannot be interpreted as "
                              f"an integer") from None


def real_number(value, name: str) -> float:
    """``value`` as a float, or :class:`FilterTypeError` (a complex or a non-number).

    NumPy float scalars keep their type: scipy computes with the value as given (a float32 sigma
    gives a Gaussian computed in float32). A 0-d array is its scalar, as scipy reads it.
    """
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, numbers.Real):
        raise FilterTypeError(f"{name} must be a real number; got {value!r}")
    return value if isinstance(value, np.floating) else float(value)


def finite(value, name: str, accepted: str, *, where: str = "",
           error: type[Exception] = NonFiniteError):
    """``value`` as :func:`real_number` gives it, if finite; else ``error`` naming ``name``, the
    value (and ``where`` it was given, such as an axis) and saying what is ``accepted``.

    The one check of every filter's (and zoom's) float parameters that become lengths: SciPy
    turns them into integers with ``int()``, which says only "cannot convert float NaN to
    integer" (or skips an axis silently, where a NaN sigma or size compares false with its
    threshold). Refused here before any work, whatever the array.
    """
    value = real_number(value, name)
    if not math.isfinite(value):
        raise error(f"{name} must be a finite number: {name}={value!r}{where}; {accepted}")
    return value


SIGMA = "give the Gaussian's standard deviation in pixels (axes with sigma <= 1e-15 are not " \
        "filtered)"
TRUNCATE = "give the number of standard deviations at which the Gaussian is cut (default 4.0)"


def gaussian_radius(sigma, truncate, radius=None) -> int:
    """A Gaussian's radius as SciPy computes it: ``radius`` if given, else
    ``int(truncate * sigma + 0.5)``, with ``sigma`` and ``truncate`` finite (:func:`finite`)
    and a radius that is a non-negative integer."""
    sigma = finite(sigma, "sigma", SIGMA)
    truncate = finite(truncate, "truncate", TRUNCATE)
    if radius is None:
        reach = truncate * float(sigma) + 0.5
        if not math.isfinite(reach):
            raise NonFiniteError(
                f"the Gaussian's radius int(truncate * sigma + 0.5) is infinite: sigma={sigma!r}, "
                f"truncate={truncate!r}; give a smaller sigma or truncate, or radius= in pixels")
        radius = int(reach)
    if isinstance(radius, bool) or not isinstance(radius, numbers.Integral) or radius < 0:
        raise FilterArgumentError(
            f"Radius must be a nonnegative integer: radius={radius!r} (sigma={sigma}, "
            f"truncate={truncate}); give radius >= 0, or sigma and truncate whose "
            f"int(truncate * sigma + 0.5) is")
    return int(radius)


def canonical_mode(mode) -> str:
    """scipy's mode name for ``mode`` (a synonym becomes its plain name)."""
    if not isinstance(mode, str) or MODE_SYNONYMS.get(mode, mode) not in MODES:
        accepted = ", ".join(repr(m) for m in (*MODES, *MODE_SYNONYMS))
        raise FilterArgumentError(
            f"boundary mode not supported: mode={mode!r}; expected one of {accepted} (or, where "
            f"per-axis modes are allowed, a sequence of them, one per filtered axis)")
    return MODE_SYNONYMS.get(mode, mode)


def per_axis(value, count: int, name: str) -> list:
    """``value`` repeated ``count`` times, or the sequence itself when it has ``count`` items."""
    if not isinstance(value, str) and np.iterable(value):
        values = list(value)
        if len(values) != count:
            raise FilterArgumentError(
                f"sequence argument must have length equal to input rank: {name}={value!r} has "
                f"{len(values)} item(s) for {count} filtered axis/axes; give one value, or one "
                f"per filtered axis")
        return values
    return [value] * count


def modes(mode, count: int) -> tuple[str, ...]:
    """One canonical mode per filtered axis (``mode`` is a name or a sequence of names); none,
    and ``mode`` not read, where no axis is filtered, as scipy's generic filters read it."""
    if not count:
        return ()
    return tuple(canonical_mode(m) for m in per_axis(mode, count, "mode"))


def check_axes(axes, ndim: int) -> tuple[int, ...]:
    """``axes`` as unique non-negative axis numbers (``None``: every axis), as scipy checks them."""
    if axes is None:
        return tuple(range(ndim))
    if np.isscalar(axes):
        axes = (axes,)
    if not isinstance(axes, Iterable):
        raise FilterArgumentError(f"axes must be an integer, iterable of integers, or None; got "
                                  f"{axes!r}")
    out = []
    for ax in axes:
        ax = as_int(ax, "axes")
        if not -ndim <= ax < ndim:
            raise FilterAxisError(f"specified axis: {ax} is out of range for an array of "
                                  f"ndim={ndim} (axes={axes!r}); axes count from -{ndim} to "
                                  f"{ndim - 1}")
        out.append(ax % ndim)
    if len(set(out)) != len(out):
        raise FilterArgumentError(f"axes must be unique; got {axes!r}")
    return tuple(out)


def check_axis(axis, ndim: int) -> int:
    """A single axis, normalised (negative counts from the end)."""
    if ndim == 0:
        raise FilterAxisError(f"axis {axis} is out of bounds for array of dimension 0: this "
                              f"filter needs an array with at least one axis")
    if (isinstance(axis, numbers.Real) and not isinstance(axis, numbers.Integral)
            and not -ndim <= axis < ndim):
        # scipy checks the range before the type: axis=1.0 on 1-d data is an AxisError there
        raise FilterAxisError(f"axis {axis} is out of bounds for array of dimension {ndim}; "
                              f"axes count from -{ndim} to {ndim - 1}")
    return check_axes((axis,), ndim)[0]


def check_origin(origin, size: int, what: str = "weights") -> int:
    """``origin`` as an int in scipy's range for a filter of ``size`` taps."""
    origin = as_int(origin, "origin")
    if origin < -(size // 2) or origin > (size - 1) // 2:
        raise FilterArgumentError(
            f"Invalid origin; origin must satisfy -({what}.shape[k] // 2) <= origin[k] <= "
            f"({what}.shape[k]-1) // 2: origin {origin} for a filter of size {size} (accepted: "
            f"{-(size // 2)} to {(size - 1) // 2})")
    return origin


def check_cval(cval):
    """``cval`` as a Python number (complex only where the input may be complex)."""
    if not isinstance(cval, numbers.Number):
        raise FilterTypeError(f"cval must be a number; got {cval!r}")
    return complex(cval) if np.iscomplexobj(cval) else float(cval)


def output_dtype(output) -> np.dtype | None:
    """The dtype asked for by ``output`` (``None``: the input's), as scipy reads it."""
    dtype = _requested_dtype(output)
    return None if dtype is None else check_dtype(dtype, "output")


def _requested_dtype(output) -> np.dtype | None:
    """``output`` as a numeric dtype, not yet checked against the dtypes the filters write.

    Not a dtype at all is a :class:`FilterTypeError` (scipy's ``numpy.dtype(output)`` raises a
    ``TypeError``); a non-numeric dtype a :class:`FilterArgumentError`, as scipy raises.
    """
    if output is None:
        return None
    try:
        dtype = np.dtype(output)
    except TypeError:
        raise FilterTypeError(
            f"output={output!r} is not a dtype; pass a dtype (np.float32, 'float64'), or an "
            f"array to the public functions in chunkernels.ndimage") from None
    if not issubclass(dtype.type, np.number | np.bool_):
        raise FilterArgumentError(f"output must have numeric dtype; got {dtype}")
    return dtype


def in_requested_byte_order(result, output):
    """``result`` in the byte order ``output`` asked for, where it is a dtype of non-native byte
    order (``'>f8'``): SciPy returns that dtype, while chunkernels computes in native ones
    (:func:`check_dtype`). CuPy arrays, which are native only, and promoted results (a real
    dtype asked for complex data) stay as they are; an output array is filled as it is."""
    if output is None or is_array(output) or cuda.is_cupy_array(result):
        return result
    requested = np.dtype(output)
    if requested.isnative or requested.newbyteorder("=") != result.dtype:
        return result
    return result.astype(requested)


def result_dtype(x_dtype, *operand_dtypes, output=None, weights=None, **params) -> np.dtype:
    """A filter's result dtype: ``output`` if given, else the input's; complex whenever the input
    or the weights are, as scipy.ndimage's ``_get_output`` promotes it."""
    x_dtype = np.dtype(x_dtype)
    dtype = x_dtype if output is None else np.dtype(output)
    complex_weights = weights is not None and np.asarray(weights).dtype.kind == "c"
    if (x_dtype.kind == "c" or complex_weights) and dtype.kind != "c":
        return np.promote_types(dtype, np.complex64)
    return dtype


def is_array(a) -> bool:
    """Whether ``a`` is a NumPy or CuPy array (an ``output`` to fill, not a dtype)."""
    return isinstance(a, np.ndarray) or cuda.is_cupy_array(a)


def resolve_output(output, x, *, complex_weights: bool = False, promotes: bool = False):
    """``(dtype or None, array to fill or None)`` from scipy.ndimage's ``output`` argument.

    As scipy's ``_get_output``: an array must have the result's shape, and a complex dtype when
    the input or the weights are complex; a real dtype given as a type or ``numpy.dtype`` is
    promoted to complex with a warning where scipy promotes it (``promotes``: the correlations,
    gaussian_filter1d, uniform_filter and uniform_filter1d), and refused where it is given as a
    string or scipy refuses it. The promotion comes first: float16, which the filters do not
    write, is complex64 then, as in scipy.
    """
    complex_out = x.dtype.kind == "c" or complex_weights
    if output is None:
        return None, None
    if is_array(output):
        check_writable(output)
        if tuple(output.shape) != tuple(x.shape):
            raise FilterArgumentError(f"output shape not correct: output has shape "
                                      f"{tuple(output.shape)}, the input {tuple(x.shape)}")
        if complex_out and output.dtype.kind != "c":
            raise FilterArgumentError(
                f"output must have complex dtype: the input ({x.dtype}) or the weights are "
                f"complex, the output array is {output.dtype}; pass a complex output")
        return output.dtype, output
    dtype = _requested_dtype(output)
    if complex_out and dtype.kind != "c":
        if isinstance(output, str) or not promotes:
            raise FilterArgumentError(
                f"output must have complex dtype: the input ({x.dtype}) or the weights are "
                f"complex, output={output!r}; pass a complex dtype such as numpy.complex128")
        warnings.warn("promoting specified output dtype to complex", UserWarning, stacklevel=4)
        dtype = np.promote_types(dtype, np.complex64)
    return check_dtype(dtype, "output"), None


def check_writable(output, error: type[Exception] = FilterArgumentError) -> None:
    """Refuse a read-only ``output`` array before any work (scipy says so only once it writes,
    and its ``label`` writes into it regardless; a read-only memory map would crash then)."""
    if isinstance(output, np.ndarray) and not output.flags.writeable:
        raise error(
            "output array is read-only (output.flags.writeable is False), so the result cannot "
            "be written into it; nothing was computed. Pass a writeable array of the result's "
            "shape (numpy.empty_like(output), or a copy), or a dtype such as output=numpy."
            f"{output.dtype.name} for a new array")


def weights_array(weights, name: str = "weights") -> np.ndarray:
    """Filter weights as a read-only host array: float64, or complex128 for complex weights."""
    if hasattr(weights, "get") and not isinstance(weights, np.ndarray):  # a CuPy array
        weights = weights.get()
    weights = np.asarray(weights)
    if weights.dtype.kind not in "biufc":
        raise FilterArgumentError(f"{name} must be numeric; got dtype {weights.dtype}")
    weights = np.array(weights, dtype=np.complex128 if weights.dtype.kind == "c" else np.float64)
    weights.setflags(write=False)
    return weights


def boundary(mode, axes=None, axis=None, **params):
    """Dask's ``map_overlap`` boundary for a filter's modes.

    ``wrap`` needs the halo from the other end of the array (``"periodic"``); every other mode
    is applied by the kernel itself at the array's outer edge (``"none"``). Per-axis modes give a
    per-axis dict (axes not named are not filtered, and get ``"none"``).
    """
    if isinstance(mode, str):
        return "periodic" if MODE_SYNONYMS.get(mode, mode) == "wrap" else "none"
    if axis is not None:
        axes = (axis,)
    axes = range(len(mode)) if axes is None else axes
    per = {int(ax): "periodic" if MODE_SYNONYMS.get(m, m) == "wrap" else "none"
           for ax, m in zip(axes, mode)}
    kinds = set(per.values())
    if kinds == {"none"} or not per:
        return "none"
    return per




def depth_along(ndim: int, reach: dict[int, int]) -> tuple[int, ...]:
    """Per-axis halo: ``reach[axis]`` on the filtered axes, 0 elsewhere."""
    return tuple(int(reach.get(ax, 0)) for ax in range(ndim))


def reach(size: int, origin: int = 0) -> int:
    """How far a filter of ``size`` taps shifted by ``origin`` reads from its centre."""
    return size // 2 + abs(origin)


@functools.lru_cache(maxsize=256, typed=True)  # typed: a float32 sigma gives other weights
def gaussian_weights(sigma: float, order: int, radius: int) -> np.ndarray:
    """Correlation weights of a 1-D Gaussian (derivative of ``order``), as scipy builds them.

    scipy.ndimage.gaussian_filter1d convolves with the kernel, that is correlates with it
    reversed; the reversal is included here. Cached (every block of a Dask array asks for the
    same weights), so the array is read-only.
    """
    x = np.arange(-radius, radius + 1)
    phi = _phi(sigma, x)
    phi = phi / phi.sum()
    if order == 0:
        return _read_only(phi[::-1].copy())
    return _read_only((_derivative_factor(sigma, order, x) * phi)[::-1].copy())


def _phi(sigma, x):
    """scipy's unnormalised Gaussian at integer offsets ``x``."""
    return np.exp(-0.5 / (sigma * sigma) * x**2)


def _derivative_factor(sigma, order, x):
    """scipy's ``q(x)``: the Gaussian's derivative of ``order`` is ``q(x) phi(x)``; each derivative
    maps ``q`` to ``q' + q p'`` with ``p'(x) = -x / sigma^2``."""
    exponents = np.arange(order + 1)
    q = np.zeros(order + 1)
    q[0] = 1
    deriv = np.diag(exponents[1:], 1) + np.diag(np.ones(order) / -(sigma * sigma), -1)
    for _ in range(order):
        q = deriv.dot(q)
    return (x[:, None] ** exponents).dot(q)


# -- taps that reach past the array: folded onto its own values ------------------------------------
#
# A filter whose taps reach further from the centre than the axis is long (sigma=1e9 on 20
# samples, uniform_filter(size=10**6), 1000 weights on 30 samples) reads beyond the array only
# what its edge mode makes there: reflect, mirror and wrap extend it periodically, nearest
# repeats its edge values, constant adds cval. So every weight beyond the offsets -n..n of an
# axis of n samples multiplies a value that a tap inside -n..n reads too, for every output: the
# same point of the period, or (nearest, constant) the value the tap at -n or n reads, which is
# beyond the edge for every output. Added onto that tap (*folded*), the 2n + 1 taps give SciPy's
# sums, whatever the parameters, with the work and memory of a filter as wide as the array;
# the results are SciPy's up to rounding (the sums are added in another order). The kernels fold
# where a block is shorter than the taps' reach, which happens only where the block is the whole
# axis (a Dask axis is made one chunk first where the halo is not smaller than it). The CPU
# references fold only taps reaching beyond SCIPY_REACH too: nearer ones SciPy extends the line
# for itself at little cost, and its own sums are its results to the last bit (integer outputs,
# which round between passes, included).

#: Taps that reach past their axis, but no further than this from the centre, are left to
#: SciPy's own extension of the line by the CPU references (``least`` below); SciPy's cost grows
#: with the reach times the line, so wider ones are folded there too.
SCIPY_REACH = 64


def period(mode: str, n: int) -> int | None:
    """The period of ``mode``'s extension of an axis of ``n`` samples: wrap ``n``, reflect
    ``2n``, mirror ``2n - 2`` (at least 1); ``None`` for nearest and constant."""
    p = {"wrap": n, "reflect": 2 * n, "mirror": 2 * n - 2}.get(mode)
    return None if p is None else max(p, 1)


def folds(reach: int, n: int, least: int = 0) -> bool:
    """Whether taps reaching ``reach`` from the centre pass beyond an axis of ``n`` samples, and
    are folded onto it (:func:`fold`); with ``least``, only taps reaching beyond it too (the CPU
    references pass :data:`SCIPY_REACH`)."""
    return reach > max(n, least)


def folded_taps(m: int, origin: int, n: int) -> int:
    """How many taps ``m`` taps shifted by ``origin`` are along an axis of ``n`` samples once
    folded (``2n + 1`` where they reach beyond it, else ``m``)."""
    return 2 * n + 1 if folds(reach(m, origin), n) else m


def _bins(offsets, n: int, mode: str):
    """The taps ``0..2n`` (offsets ``-n..n``) onto which taps at ``offsets`` fold."""
    p = period(mode, n)
    if p is None:  # nearest, constant: everything beyond the edge reads what offset -n or n reads
        return np.clip(offsets, -n, n) + n
    return (offsets + n) % p  # the same point of the period, among -n .. -n + p - 1


def fold(weights, origin: int, n: int, mode: str, axis: int = 0, least: int = 0):
    """``(weights, origin)`` of a correlation along ``axis`` (of ``n`` samples, with ``mode``)
    equal to the given one: the weights folded onto ``2n + 1`` taps and origin 0 where they
    reach beyond the axis (and beyond ``least``, :func:`folds`), else unchanged. N-D weights
    fold along ``axis`` only."""
    m = weights.shape[axis]
    if not folds(reach(m, origin), n, least):
        return weights, origin
    bins = _bins(np.arange(m) - m // 2 - origin, n, mode)
    moved = np.moveaxis(np.asarray(weights), axis, 0)
    if moved.ndim == 1 and moved.dtype.kind == "f":  # bincount: 20 times np.add.at's speed
        return _read_only(np.bincount(bins, weights=moved, minlength=2 * n + 1)), 0
    out = np.zeros((2 * n + 1, *moved.shape[1:]), dtype=moved.dtype)
    np.add.at(out, bins, moved)
    return _read_only(np.ascontiguousarray(np.moveaxis(out, 0, axis))), 0


def fold_all(weights, origins, shape, mode: str):
    """:func:`fold` along every axis of N-D ``weights`` (one origin per axis) for an array of
    ``shape`` and one ``mode``: ``(weights, origins)``, the same objects where nothing folds."""
    origins = list(origins)
    for axis, n in enumerate(shape):
        weights, origins[axis] = fold(weights, origins[axis], n, mode, axis)
    return weights, tuple(origins)


def gaussian_pass_weights(sigma, order: int, radius: int, n: int, mode: str,
                          least: int = 0) -> np.ndarray:
    """A Gaussian pass's correlation weights along an axis of ``n`` samples (origin 0):
    :func:`gaussian_weights`, folded (:func:`folded_gaussian_weights`) where ``radius`` passes
    beyond the axis (and beyond ``least``, :func:`folds`)."""
    if folds(radius, n, least):
        return folded_gaussian_weights(sigma, order, radius, n, mode)
    return gaussian_weights(sigma, order, radius)


#: A Gaussian's weights are exactly 0.0 beyond this many sigmas: exp(-39**2 / 2) underflows.
UNDERFLOW = 39
#: Folded Gaussians of up to this many nonzero weights are summed one by one, in pieces of
#: PIECE (a few milliseconds per million); wider ones, by far wider than the period they fold
#: onto, by the Euler-Maclaurin formula (:func:`_lattice_sums`).
DIRECT = 2**22
PIECE = 2**20


@functools.lru_cache(maxsize=256, typed=True)
def folded_gaussian_weights(sigma, order: int, radius: int, n: int, mode: str) -> np.ndarray:
    """:func:`fold` of ``gaussian_weights(sigma, order, radius)`` for an axis of ``n`` samples,
    computed without making those weights (a sigma of 1e9 has 8e9 of them).

    Up to :data:`DIRECT` nonzero weights are computed as SciPy computes them and added into
    their taps piece by piece; a Gaussian wider than that and at least 8 times its period (or
    8 samples, for nearest and constant, whose tails fold onto one tap each) is summed per tap
    with the Euler-Maclaurin formula, exact to rounding there. Cached, read-only.
    """
    reach_ = min(radius, math.ceil(UNDERFLOW * float(sigma)))
    if reach_ > DIRECT and float(sigma) >= 8 * (period(mode, n) or 1):
        return _read_only(_folded_gaussian_em(sigma, order, radius, n, mode))
    return _read_only(_folded_gaussian_direct(sigma, order, reach_, n, mode))


def _pieces(reach_: int):
    for start in range(-reach_, reach_ + 1, PIECE):
        yield np.arange(start, min(start + PIECE, reach_ + 1))


def _folded_gaussian_direct(sigma, order, reach_, n, mode):
    """The weights at offsets ``-reach_..reach_`` (the others are 0.0) as SciPy makes them,
    normalised by the sum of all, added into their taps."""
    total = sum(_phi(sigma, x).sum() for x in _pieces(reach_))
    out = np.zeros(2 * n + 1)
    for x in _pieces(reach_):
        kernel = _phi(sigma, x) / total
        if order:
            kernel = _derivative_factor(sigma, order, x) * kernel
        # the correlation's weight at offset o is the kernel's at -o
        out += np.bincount(_bins(-x, n, mode), weights=kernel, minlength=2 * n + 1)
    return out


def _folded_gaussian_em(sigma, order, radius, n, mode):
    """The folded weights summed over each tap's offsets by :func:`_lattice_sums`.

    In ``t = offset / sigma`` the correlation weight at an offset is
    ``(-1)**order * sigma**-order * Q(t) * exp(-t**2 / 2) / S``: ``Q`` is scipy's ``q`` scaled
    (``Q' - t Q`` per derivative), ``S`` the sum of the Gaussian over ``-radius..radius``.
    """
    poly = np.polynomial.Polynomial
    q = poly([1.0])
    for _ in range(order):
        q = q.deriv() - poly([0.0, 1.0]) * q
    g = q * (-1) ** order
    s = float(sigma)
    r = float(radius)
    scale = s ** -order / _lattice_sums(poly([1.0]), s, np.array([-r]), np.array([r]), 1.0)[0]
    out = np.zeros(2 * n + 1)
    p = period(mode, n)
    if p is None:
        inside = np.arange(-n + 1, n, dtype=np.float64)
        out[1:-1] = g(inside / s) * np.exp(-0.5 * (inside / s) ** 2)
        out[[0, -1]] = _lattice_sums(g, s, np.array([-r, float(n)]), np.array([-float(n), r]),
                                     1.0)
    else:
        c = np.arange(-n, -n + p, dtype=np.float64)
        first = c - p * np.floor((r + c) / p)   # the first offset >= -radius of each tap
        last = c + p * np.floor((r - c) / p)    # the last <= radius
        out[:p] = _lattice_sums(g, s, first, last, float(p))
    return out * scale


#: B_2k / (2k)! for k = 1..8: the Euler-Maclaurin formula's coefficients.
_EM = (1 / 12, -1 / 720, 1 / 30240, -1 / 1209600, 1 / 47900160, -691 / 1307674368000,
       1 / 74724249600, -3617 / 10670622842880000)


def _lattice_sums(g, sigma, first, last, step):
    """``sum(f(o) for o in range(first, last + 1, step))`` per entry of ``first`` and ``last``,
    for ``f(o) = g(o / sigma) * exp(-(o / sigma)**2 / 2)``, ``g`` a polynomial and
    ``sigma >= 8 * step``: the Euler-Maclaurin formula, ``integral / step + (f(first) +
    f(last)) / 2 + sum_k B_2k / (2k)! * step**(2k-1) * (f^(2k-1)(last) - f^(2k-1)(first))``.

    ``f``'s derivatives are polynomials times the Gaussian (``g' - t g`` per derivative, in
    ``t``), so the terms fall as ``(step / (2 pi sigma))**2`` each: eight of them leave less
    than 1e-20 of the sum.
    """
    ta, tb = first / sigma, last / sigma
    ea, eb = np.exp(-0.5 * ta * ta), np.exp(-0.5 * tb * tb)
    total = sigma * _gaussian_moments(g.coef, ta, tb) / step + (g(ta) * ea + g(tb) * eb) / 2
    derivative = g
    t = np.polynomial.Polynomial([0.0, 1.0])
    for k, coefficient in enumerate(_EM, 1):
        derivative = derivative.deriv() - t * derivative
        total += coefficient * (step / sigma) ** (2 * k - 1) * (derivative(tb) * eb
                                                                - derivative(ta) * ea)
        derivative = derivative.deriv() - t * derivative
    return total


def _gaussian_moments(coef, ta, tb):
    """``integral of sum_i coef[i] t**i exp(-t**2 / 2) dt`` from ``ta`` to ``tb``, term by term
    (``J_i = ta**(i-1) e(ta) - tb**(i-1) e(tb) + (i - 1) J_(i-2)``); ``J_0`` from ``erfc`` on the
    side of 0 where both ends are, so tails keep their digits."""
    from scipy.special import erfc

    ea, eb = np.exp(-0.5 * ta * ta), np.exp(-0.5 * tb * tb)
    root = math.sqrt(0.5)
    j0 = math.sqrt(math.pi / 2) * np.where(
        ta >= 0, erfc(ta * root) - erfc(tb * root),
        np.where(tb <= 0, erfc(-tb * root) - erfc(-ta * root),
                 2 - erfc(tb * root) - erfc(-ta * root)))
    moments = [j0, ea - eb]
    for i in range(2, len(coef)):
        moments.append(ta ** (i - 1) * ea - tb ** (i - 1) * eb + (i - 1) * moments[i - 2])
    return sum(c * m for c, m in zip(coef, moments))


@functools.lru_cache(maxsize=256)
def folded_uniform_counts(size: int, origin: int, n: int, mode: str) -> np.ndarray:
    """:func:`fold` of ``size`` unit weights shifted by ``origin`` onto an axis of ``n`` samples:
    how many of them land on each tap, exact integers (as float64), counted without making them.
    Divided by ``size``, the uniform filter's mean. Cached, read-only."""
    lo = -(size // 2) - origin
    hi = lo + size - 1
    p = period(mode, n)
    out = np.zeros(2 * n + 1)
    if p is None:
        offsets = np.arange(-n, n + 1)
        out[:] = (offsets >= lo) & (offsets <= hi)
        out[0] = max(0, min(hi, -n) - lo + 1)
        out[-1] = max(0, hi - max(lo, n) + 1)
    else:  # the offsets in lo..hi congruent to each tap's, in exact integers
        out[:p] = [(hi - c) // p + (c - lo) // p + 1 for c in range(-n, -n + p)]
    return _read_only(out)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def stacked_axes(params):
    """A spec's ``stack``: ``params`` for a stack of blocks along a new leading axis, for a
    filter along the validated ``axes`` (which shift by one)."""
    return {**params, "axes": tuple(a + 1 for a in params["axes"])}


def stacked_axis(params):
    """A spec's ``stack`` for a filter along the validated ``axis``."""
    return {**params, "axis": params["axis"] + 1}
