"""spline_filter: B-spline prefilter (interpolation coefficients) along chosen axes.

``scipy.ndimage.spline_filter1d`` applied along each of ``axes`` in turn: the recursive
(IIR) filter of Unser et al. with SciPy's boundary conditions per mode. The filter's impulse
response is a sum of geometric sequences, one per pole ``z`` (:func:`impulse_response`), so a
chunk needs only a finite halo: past :func:`depth` samples, what lies beyond the chunk changes
the coefficients by less than the result dtype's epsilon times the data's largest magnitude. On a
Dask array the filter therefore runs chunk by chunk with that halo from the neighbouring chunks,
never on whole axes. CUDA source: ``kernels_cuda/spline_filter.cu``.
"""

from __future__ import annotations

import math
import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec
from chunkernels._shared.interpolation import check_mode, check_order

#: Poles of the B-spline prefilter per order (SciPy's ``get_filter_poles``).
POLES = {
    2: (math.sqrt(8.0) - 3.0,),
    3: (math.sqrt(3.0) - 2.0,),
    4: (math.sqrt(664.0 - math.sqrt(438976.0)) + math.sqrt(304.0) - 19.0,
        math.sqrt(664.0 + math.sqrt(438976.0)) - math.sqrt(304.0) - 19.0),
    5: (math.sqrt(67.5 - math.sqrt(4436.25)) + math.sqrt(26.25) - 6.5,
        math.sqrt(67.5 + math.sqrt(4436.25)) - math.sqrt(26.25) - 6.5),
}
#: Boundary condition of the filter per edge mode (SciPy's ``apply_filter``): the modes without
#: an exact spline extension use the mirror one.
INIT = {"mirror": 0, "constant": 0, "grid-constant": 0, "wrap": 0, "grid-wrap": 1,
        "reflect": 2, "nearest": 2}
_THREADS = 128


def _eps(dtype) -> float:
    dtype = np.dtype(dtype)
    return float(np.finfo(dtype).eps) if dtype.kind in "fc" else float(np.finfo(np.float64).eps)


def gain(order: int) -> float:
    """The filter's gain: every sample is scaled by it before the recursions."""
    g = 1.0
    for z in POLES[order]:
        g *= (1.0 - z) * (1.0 - 1.0 / z)
    return g


def impulse_response(order: int) -> tuple[tuple[float, float], ...]:
    """The filter's impulse response as ``((c, z), ...)``: ``h[k] = sum(c * z**abs(k))``.

    The filter is ``gain * prod(-z / ((1 - z q**-1) (1 - z q)))`` over its poles ``z`` (``q``
    the shift). With ``s = q + 1/q`` each factor is ``1 / (s - (z + 1/z))``, and partial
    fractions in ``s`` split the product into one two-sided geometric sequence per pole:
    ``c = gain * -z / (1 - z**2) / prod(a_z - a_p)`` over the other poles ``p``, ``a = p + 1/p``.
    (Cubic: ``h[k] = sqrt(3) * (sqrt(3) - 2)**abs(k)``.)
    """
    poles = POLES[order]
    terms = []
    for z in poles:
        c = gain(order) * -z / (1.0 - z * z)
        for p in poles:
            if p != z:
                c /= (z + 1.0 / z) - (p + 1.0 / p)
        terms.append((c, z))
    return tuple(terms)


def tail(order: int, d: int) -> float:
    """``sum(abs(h[k]) for k > d)`` bounded above (exact for one pole): what the samples more
    than ``d`` positions to one side contribute to a coefficient, per unit of their size."""
    return sum(abs(c) * abs(z) ** (d + 1) / (1.0 - abs(z)) for c, z in impulse_response(order))


def depth(order: int, dtype=np.float64) -> int:
    """Halo, in samples, after which a chunk's coefficients are exact to ``dtype``'s resolution.

    A chunk filtered with ``d`` samples of halo on each side and SciPy's mirror boundary
    condition at the halo's end sees the samples beyond replaced by mirrored ones: each differs
    from the true one by at most ``2 * max|x|``, and together they reach a coefficient with
    weight at most :func:`tail` ``(order, d)``. The halo is the smallest ``d`` for which
    ``2 * tail(order, d) <= eps`` of ``dtype`` (float64's for other dtypes), so the error is at
    most ``eps * max|x|``: cubic, 13 samples in float32 and 28 in float64.
    """
    if order < 2:
        return 0
    eps = _eps(dtype)
    d = 0
    while 2.0 * tail(order, d) > eps:
        d += 1
    return d


def horizon(order: int, dtype) -> int:
    """Terms after which the boundary sums' powers ``z**i`` drop below ``dtype``'s epsilon."""
    z = max(abs(p) for p in POLES[order])
    return math.ceil(math.log(_eps(dtype)) / math.log(z))


def reference(x, *, order=3, axes=None, mode="mirror", dtype=np.float64, depths=None):
    """CPU reference: ``scipy.ndimage.spline_filter1d`` along each of ``axes``, into ``dtype``.
    (``depths``, the halo of Dask chunks, does not change a block's coefficients.)"""
    import scipy.ndimage as ndi

    if order < 2 or not axes:
        return np.array(x, dtype=dtype)
    # as scipy's spline_filter: the first axis is filtered from the input itself (an integer
    # output truncates the coefficients, not the samples), the next ones in the output in place
    out = np.empty(np.shape(x), dtype=dtype)
    source = x
    for axis in axes:
        ndi.spline_filter1d(source, order, axis, output=out, mode=mode)
        source = out
    return out


def dispatch(x, *, order=3, axes=None, mode="mirror", dtype=np.float64, depths=None):
    """GPU path: a C-ordered copy of ``x`` in ``dtype``, filtered in place one axis at a time.

    One thread runs the recursions along one line. For every axis but the last, neighbouring
    threads take neighbouring lines, so each step of the recursion is one coalesced access.
    Integer outputs are filtered in float64 and, as SciPy stores each axis's pass in the output,
    truncated after every axis.
    """
    cp = cuda.cupy()
    dtype = np.dtype(dtype)
    work = dtype if dtype.kind == "f" else np.dtype(np.float64)
    out = cp.array(x, dtype=work, order="C", copy=True)
    if order < 2 or out.size == 0:
        return out.astype(dtype, copy=False)
    index64 = out.nbytes > layout.INT32_MAX
    index = np.int64 if index64 else np.int32
    kernel = cuda.function("spline_filter", f"spline_filter<{cuda.cuda_type(out.dtype)}, "
                                            f"{'long long' if index64 else 'int'}, {INIT[mode]}>")
    poles = POLES[order] + (0.0,) * (2 - len(POLES[order]))
    real = out.dtype.type
    for axis in axes:
        n = out.shape[axis]
        if n <= 1:  # SciPy leaves lines of one sample as they are (no gain either)
            continue
        inner = math.prod(out.shape[axis + 1:])
        lines = out.size // n
        kernel((-(-lines // _THREADS),), (_THREADS,),
               (out, index(lines), index(n), index(inner), real(gain(order)), real(poles[0]),
                real(poles[1]), np.int32(len(POLES[order])), index(horizon(order, out.dtype))))
        if work != dtype:
            out = out.astype(dtype).astype(work)
    return out.astype(dtype, copy=False)


def _validate(ndim, *, order=3, axes=None, mode="mirror", dtype=np.float64, depths=None):
    order = check_order(order)
    mode = check_mode(mode)
    if axes is None:
        axes = tuple(range(ndim))
    axes = tuple(int(a) for a in np.atleast_1d(axes))
    for a in axes:
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(a, ndim)
    axes = tuple(a % ndim for a in axes)
    params = {"order": order, "axes": axes, "mode": mode, "dtype": np.dtype(dtype)}
    if depths is not None:  # the halo along each axis, in place of depth(order, dtype)
        params["depths"] = check_depths(depths, ndim)
    return params


def check_depths(value, ndim: int) -> tuple[int, ...]:
    """``value`` (dask-image's ``depth``) as one halo per axis: an integer for every axis, a
    sequence of ``ndim`` integers or a dict ``{axis: integer}`` (other axes 0), each at least 0
    (else ``ValueError``)."""
    if isinstance(value, dict):
        per_axis = [0] * ndim
        for axis, d in value.items():
            per_axis[normalize_axis_index(operator.index(axis), ndim)] = d
        value = per_axis
    elif np.ndim(value) == 0:
        value = [value] * ndim
    value = list(value)
    if len(value) != ndim:
        raise ValueError(f"depth must hold one halo per axis of the {ndim}-d input, got "
                         f"{len(value)}: {value!r}; pass one integer for every axis")
    try:
        halos = tuple(operator.index(d) for d in value)
    except TypeError:
        raise ValueError(f"depth must hold integers, got {value!r}") from None
    if any(d < 0 for d in halos):
        raise ValueError(f"depth must be at least 0 along every axis, got {halos}")
    return halos


def _halo(ndim, *, order=3, axes=(), mode="mirror", dtype=np.float64, depths=None):
    if depths is None:
        d = depth(order, dtype)
        depths = (d,) * ndim
    return tuple(depths[a] if a in axes else 0 for a in range(ndim))


def _boundary(*, mode="mirror", **_):
    # the periodic filter needs the other end of the array; the other modes' boundary conditions
    # are applied by the filter itself at the array's outer edge
    return "periodic" if mode == "grid-wrap" else "none"


def _result_dtype(x_dtype, *, dtype=np.float64, **_):
    return np.dtype(dtype)


def _supports(x, *, dtype=np.float64, **_):
    if np.dtype(dtype).kind not in "fiu":
        return False, (f"the GPU path writes float or integer coefficients, not "
                       f"{np.dtype(dtype)}")
    return True, ""


def _cases(rng):
    """Random inputs for ``chunkernels check``: every order, every boundary condition."""
    for order, mode, dtype in ((3, "mirror", "float64"), (2, "reflect", "float32"),
                               (4, "grid-wrap", "float64"), (5, "nearest", "float64"),
                               (3, "constant", "float32")):
        x = rng.random((70, 45)).astype(dtype)
        yield x, (), {"order": order, "mode": mode, "dtype": dtype}
    yield rng.integers(0, 255, (40, 9, 33)).astype("uint8"), (), {"order": 3, "axes": (0, 2)}


SPEC = KernelSpec(
    name="spline_filter",
    summary="B-spline interpolation coefficients along the given axes; reference "
            "scipy.ndimage.spline_filter1d",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="spline_filter.cu",
    entries=(
        "spline_filter<float, int, 0>",
        "spline_filter<double, int, 1>",
        "spline_filter<double, long long, 2>",
    ),
    dtypes=("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
            "int64", "uint64", "bool"),
    ndim=(0, None),
    halo=_halo,
    halo_rule="smallest d with 2 * sum(|h[k]|, k > d) <= eps (h: the filter's impulse response, "
              "a geometric sequence per pole), along the filtered axes",
    boundary=_boundary,
    validate=_validate,
    result_dtype=_result_dtype,
    supports=_supports,
    cases=_cases,
    rtol=1e-5,
)
