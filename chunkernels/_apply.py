"""``apply`` and ``blockwise``: registered kernels over Dask, NumPy and CuPy arrays.

Everything that can be wrong with the inputs is checked here, before a graph is built: operand
shapes and chunk alignment (Dask's ``map_blocks`` pairs blocks by position whatever their sizes),
halo depth against chunk and array sizes, parameters.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from chunkernels import _graph, _halo, cuda
from chunkernels._dispatch import finalize, run_block
from chunkernels._errors import AlignmentError, HaloError
from chunkernels._kind import ArrayKind
from chunkernels._registry import KernelSpec, ensure_registered, get, spec_serial
from chunkernels.interop import array_entry


class BlockFunction:
    """A registered kernel bound to its parameters, callable on blocks.

    Pass it to ``dask.array.map_blocks`` / ``map_overlap`` in your own graphs; it computes
    NumPy blocks with the CPU reference and CuPy blocks on the GPU, and tells Dask what it needs::

        f = chunkernels.blockwise("broadcast_add")
        z = da.map_blocks(f, x, y, **f.kwargs(x, y))

    The spec travels with the function, so user-registered kernels also run on Dask workers in
    other processes. CuPy arrays among the parameters are copied (on their device) when the
    function is made, so a graph computes with the values they had when it was built, as the
    kernels' validation does for NumPy arrays.
    """

    def __init__(self, spec: KernelSpec, params: Mapping[str, Any] | None = None, *,
                 strict: bool = False):
        self.spec = spec
        self.raw_params = {k: v.copy() if cuda.is_cupy_array(v) else v
                           for k, v in (params or {}).items()}
        self.strict = strict
        self._params: dict[int, dict[str, Any]] = {}
        self._dtypes: dict[tuple, np.dtype] = {}

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.raw_params.items())
        return f"blockwise({self.spec.name!r}{', ' if params else ''}{params})"

    def params(self, ndim: int) -> dict[str, Any]:
        """Parameters validated for ``ndim``-dimensional blocks (cached)."""
        params = self._params.get(ndim)
        if params is None:
            params = self._params[ndim] = self.spec.params(ndim, self.raw_params)
        return params

    def depth(self, ndim: int) -> dict[int, int]:
        """Halo depth per axis that ``map_overlap`` must give this kernel."""
        return dict(enumerate(self.spec.depth(ndim, self.params(ndim))))

    @property
    def boundary(self) -> str:
        """Dask boundary for ``map_overlap`` (``"none"``: the kernel applies its own edge mode).

        Computed from the parameters as given; :meth:`kwargs` computes it from the parameters
        validated for ``x``'s ndim, as :func:`apply` does.
        """
        return self.spec.boundary(**self.raw_params)

    def dtype(self, x_dtype, *operand_dtypes) -> np.dtype:
        """Result dtype for inputs of these dtypes (parameters as given; see :meth:`kwargs`)."""
        return self.spec.out_dtype(x_dtype, operand_dtypes, self.raw_params)

    def kwargs(self, x, *operands) -> dict[str, Any]:
        """Keyword arguments for ``da.map_blocks`` (no halo) or ``da.map_overlap`` on ``x``."""
        # the parameters validated for x, as apply() uses them: validation may fill in defaults
        # or rewrite values (a synonym of an edge mode) that the dtype and boundary depend on
        params = self.params(x.ndim)
        dtype = self.spec.out_dtype(x.dtype, [o.dtype for o in operands], params)
        out = {"dtype": dtype, "meta": _graph.meta(x, dtype)}
        depth = self.depth(x.ndim)
        if any(depth.values()):
            out.update(depth=depth, boundary=self.spec.boundary(**params))
        return out

    def _out_dtype(self, ndim: int, dtypes: tuple) -> np.dtype:
        """Result dtype for ``ndim``-d blocks of these input dtypes (cached: run_block checks
        every block's result against it, and working it out costs microseconds)."""
        key = (ndim, *dtypes)
        dtype = self._dtypes.get(key)
        if dtype is None:
            dtype = self._dtypes[key] = self.spec.out_dtype(dtypes[0], dtypes[1:],
                                                            self.params(ndim))
        return dtype

    def __call__(self, block, *operands):
        ensure_registered(self.spec)
        out_dtype = self._out_dtype(block.ndim, (block.dtype, *(o.dtype for o in operands)))
        return run_block(self.spec, block, operands, self.params(block.ndim), strict=self.strict,
                         out_dtype=out_dtype)

    def stacked(self, stack):
        """The kernel on each entry of ``stack`` (blocks of one shape along a new leading axis)
        in one run, with the spec's ``stack`` parameters; its result stacks the blocks' results."""
        ensure_registered(self.spec)
        params = self.spec.stack(self.params(stack.ndim - 1))
        return run_block(self.spec, stack, (), params, strict=self.strict,
                         out_dtype=self._out_dtype(stack.ndim - 1, (stack.dtype,)))

    def __dask_tokenize__(self):
        from dask.base import tokenize

        # a CuPy parameter is this function's own copy: named by its identity, not by its
        # values, whose hashing would copy it to the host (a device synchronisation)
        params = {k: ("cupy", id(v), v.shape, v.dtype.str) if cuda.is_cupy_array(v) else v
                  for k, v in self.raw_params.items()}
        return ("chunkernels", self.spec.name, spec_serial(self.spec), tokenize(params),
                self.strict)


def blockwise(kernel: str, *, strict: bool = False, **params: Any) -> BlockFunction:
    """A map_blocks/map_overlap-compatible block function for registered kernel ``kernel``.

    Parameters
    ----------
    kernel
        Registered kernel name.
    strict
        Raise instead of falling back to the CPU reference on blocks the GPU path refuses.
    **params
        The kernel's parameters.

    Returns
    -------
    BlockFunction
        Callable on blocks, with ``.depth(ndim)``, ``.boundary``, ``.dtype(...)`` and
        ``.kwargs(x, *operands)`` for Dask.

    Raises
    ------
    TypeError
        A parameter the kernel does not take (a misspelling is named), refused now rather than
        on the first block.
    """
    spec = get(kernel)
    spec.check_parameters(params)
    return BlockFunction(spec, params, strict=strict)


# ``kind`` is positional-only: a kernel parameter of that name goes to ``params``
@array_entry("x", "operands", coerce=False)
def apply(kind, /, x, kernel: str, *operands, strict: bool = False, align: bool = False,
          allow_rechunk: bool = False, **params: Any):
    """Apply registered kernel ``kernel`` to ``x`` (and its extra array operands).

    Parameters
    ----------
    x
        A Dask array (NumPy or CuPy chunks), a ``numpy.ndarray``, a ``cupy.ndarray``, a
        ``torch.Tensor`` (CPU or CUDA; used in place, without a copy) or an
        ``xarray.DataArray`` of any of these (:mod:`chunkernels.interop`). Big-endian data (and
        operands) are swapped to native byte order first.
    kernel
        Registered kernel name (``chunkernels.kernels()`` lists them).
    *operands
        The kernel's extra array operands, in the order its spec names them. NumPy/CuPy arrays
        and Python scalars are accepted with a Dask ``x`` and chunked to match it.
    strict
        Raise :class:`UnsupportedBlockError` on blocks the GPU path refuses, instead of computing
        them with the CPU reference and a :class:`CPUFallbackWarning`.
    align
        Rechunk Dask operands whose chunks do not line up with ``x``, instead of raising
        :class:`AlignmentError`.
    allow_rechunk
        Make an axis of ``x`` one chunk where the kernel's halo is not smaller than the array
        along it, instead of raising :class:`HaloError`. Chunks smaller than the halo need no
        rechunk: the halo is gathered from as many neighbouring chunks as it spans.
    **params
        The kernel's parameters.

    Returns
    -------
    dask.array.Array, numpy.ndarray, cupy.ndarray, torch.Tensor or xarray.DataArray
        The same type as ``x``: a lazy Dask array with the right ``meta`` and ``dtype``, or a
        computed NumPy / CuPy array, or a tensor on ``x``'s device, or a DataArray labelled as
        ``x`` (a reduction kernel's 0-d result: its plain value).

    Raises
    ------
    UnknownKernelError
        ``kernel`` is not registered.
    AlignmentError
        An operand does not broadcast to ``x`` or its chunks do not line up (and not ``align``).
    HaloError
        The halo is not smaller than the array along an axis of several chunks (and not
        ``allow_rechunk``).
    UnknownChunkSizesError
        A Dask ``x`` whose chunk sizes are unknown (NaN) along an axis with a halo, or anywhere
        for a kernel that plans its own graph (labels, measurements): a :class:`HaloError` too.
    UnsupportedBlockError
        Under ``strict=True``, a block the GPU path refuses.
    """
    return apply_kernel(kind, x, kernel, operands, params, strict=strict, align=align,
                        allow_rechunk=allow_rechunk)


def apply_kernel(kind: ArrayKind | None, x, kernel: str, operands=(),
                 params: Mapping[str, Any] | None = None, *, strict: bool = False,
                 align: bool = False, allow_rechunk: bool = False):
    """:func:`apply` for a caller that knows ``x``'s kind: a front end, whose public entry
    decided it (``None``: ``x`` is no array chunkernels computes on, which is refused).
    ``operands`` and ``params`` are the kernel's, as a sequence and a mapping."""
    spec = get(kernel)
    params = params or {}
    if len(operands) != len(spec.operands):
        names = ", ".join(spec.operands) or "none"
        raise TypeError(f"{spec.name} takes {len(spec.operands)} array operand(s) after x "
                        f"({names}); got {len(operands)}")
    if kind is None:
        raise TypeError(f"apply takes a dask.array.Array, numpy.ndarray or cupy.ndarray; got "
                        f"{type(x).__module__}.{type(x).__name__} (convert it with np.asarray, "
                        f"cupy.asarray or dask.array.from_array)")
    for name, value in (("strict", strict), ("align", align)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{spec.name}: {name}={value!r}; expected True or False")
    for name, op in zip(spec.operands, operands):
        if op is None or isinstance(op, (str, bytes)):
            raise TypeError(f"{spec.name}: operand {name} is {type(op).__name__} {op!r}; expected "
                            f"an array (NumPy, CuPy or Dask) or a number")
    # a graph that is not blockwise in x's chunks (labels, measurements) needs their sizes
    x = _graph.as_input(x, spec.name, "x", chunk_sizes=spec.dask_graph is not None)
    operands = tuple(_graph.native(o) if hasattr(o, "dtype") else o for o in operands)
    if kind.dask:
        if spec.dask_graph is not None:  # not blockwise in x's chunks
            return spec.dask_graph(x, *operands, strict=strict, **spec.params(x.ndim, params))
        return _apply_dask(kind, spec, x, operands, params, strict=strict, align=align,
                           allow_rechunk=allow_rechunk)
    params = spec.params(x.ndim, params)
    operands = tuple(_as_array(kind, o, x.dtype) for o in operands)
    for name, op in zip(spec.operands, operands):
        _check_shape(spec, name, op, x)
    if spec.kind != "reduction":
        return run_block(spec, x, operands, params, strict=strict)
    if not kind.gpu:
        return np.asarray(spec.cpu(x, *operands, **params))
    stats = run_block(spec, x, operands, params, strict=strict)
    return finalize(spec, params, (x.dtype, *(o.dtype for o in operands)), [stats])


def _apply_dask(kind, spec, x, operands, params, *, strict, align, allow_rechunk):
    import dask.array as da

    params = spec.params(x.ndim, params)
    fn = BlockFunction(spec, params, strict=strict)
    fn._params[x.ndim] = params = fn.raw_params  # validated, CuPy arrays copied
    ops = []
    for name, op in zip(spec.operands, operands):
        if not _graph.is_dask(op):
            op = _as_array(kind.chunks, op, x.dtype)
            _check_shape(spec, name, op, x)
            op = da.from_array(op, chunks=_matching_chunks(op, x), asarray=False)
        ops.append(_aligned(spec, name, op, x, align))

    dtype = spec.out_dtype(x.dtype, [o.dtype for o in ops], params)
    if spec.kind == "reduction":
        return _reduce(kind, fn, spec, params, x, ops, dtype)
    meta = kind.meta(dtype, x.ndim)
    depth = spec.depth(x.ndim, params)
    # Along an axis of one chunk there are no neighbours: the kernel's own edge mode does it all.
    depth = tuple(0 if len(c) == 1 else d for c, d in zip(x.chunks, depth))
    if not any(depth):
        name = f"{spec.name}-{_graph.tokenize(fn, x, *ops)}"
        return _graph.map_blocks(fn, name, x, ops, dtype, meta)

    for name, op in zip(spec.operands, ops):
        if op.shape != x.shape:
            raise AlignmentError(f"{spec.name} has a halo, so operand {name!r} must have x's shape "
                                 f"{x.shape}; got {op.shape} (broadcast it first: "
                                 f"da.broadcast_to({name}, x.shape).rechunk(x.chunks))")
    return overlap(fn, spec.name, x, ops, depth, spec.boundary(**params), dtype, meta,
                   allow_rechunk)


def overlap(fn, label, x, ops, depth, boundary, dtype, meta, allow_rechunk):
    """``fn`` over the blocks of ``x`` (and ``ops``) extended by their halo of ``depth``, the
    halo checked first (:func:`_ensure_halo`).

    ``label`` names the kernel (or pipeline) in keys and errors; ``boundary`` is what its spec
    says, for all axes or per axis.
    """
    x, ops, depth = _ensure_halo(label, x, ops, depth, allow_rechunk)
    boundary = _halo.boundaries(boundary, x.ndim, label)
    name = f"{label}-overlap-{_graph.tokenize(fn, x, *ops, depth, boundary)}"
    return _graph.overlap(fn, name, x, ops, depth, boundary, dtype, meta)


def _reduce(kind, fn, spec, params, x, ops, dtype):
    """A reduction over Dask arrays: one partial-statistics task per block, one finalize task.

    The result is a lazy 0-d Dask array; its graph grows with the number of blocks only.
    """
    dtypes = (x.dtype, *(op.dtype for op in ops))
    return _graph.reduce(fn, functools.partial(finalize, spec, params, dtypes),
                         f"{spec.name}-{_graph.tokenize(fn, x, *ops)}", x, ops, chunks=(),
                         dtype=dtype, meta=kind.meta(dtype, 0))


def _ensure_halo(label, x, ops, depth, allow_rechunk):
    """Check the halo against chunk and array sizes; rechunk only when allowed.

    Chunks smaller than the halo are fine: the halo exchange gathers it from as many neighbouring
    chunks as it spans. A halo that is not smaller than the array along an axis would make every
    block carry that whole axis; that axis is rechunked to one chunk instead (the kernel's own
    edge mode then does everything there), which needs ``allow_rechunk``.
    """
    fixes = {}
    if any(depth):  # the exchange places every block, along every axis
        _graph.check_chunk_sizes(x, label, "x")
    for axis, (d, chunks) in enumerate(zip(depth, x.chunks)):
        if d == 0:
            continue
        if d >= x.shape[axis]:
            fixes[axis] = (x.shape[axis],)
    if fixes and not allow_rechunk:
        detail = "; ".join(f"axis {a}: halo {_halo_text(depth[a])}, chunks {x.chunks[a]}, "
                           f"array {x.shape[a]}"
                           for a in fixes)
        raise HaloError(
            f"{label}: the halo the kernel's parameters need is not smaller than the array "
            f"along an axis of several chunks ({detail}); every block would hold that whole axis. "
            f"Make it one chunk first, e.g. x = x.rechunk({_fmt_rechunk(fixes)}), or pass "
            f"allow_rechunk=True"
        )
    if fixes:
        x = x.rechunk(fixes)
        ops = [op.rechunk(fixes) for op in ops]
        depth = tuple(0 if len(c) == 1 else d for c, d in zip(x.chunks, depth))
    return x, ops, depth


def _halo_text(depth: int) -> str:
    """A halo depth in words: kernels that need a whole axis ask for a depth no array reaches."""
    return "the whole axis" if depth >= _halo.WHOLE_AXIS else str(depth)


def _fmt_rechunk(fixes):
    return "{" + ", ".join(f"{a}: {c[0] if len(c) == 1 else c}" for a, c in fixes.items()) + "}"


def _check_shape(spec, name, op, x):
    """``op`` must broadcast to ``x.shape`` (or equal it, for ``alignment='same'``)."""
    if spec.alignment == "same":
        ok = op.shape == x.shape
        want = f"x's shape {x.shape}"
    else:
        ok = op.ndim <= x.ndim and all(
            n in (1, m) for n, m in zip(op.shape[::-1], x.shape[::-1]))
        want = f"a shape that broadcasts to x's shape {x.shape} without changing it"
    if not ok:
        raise AlignmentError(f"{spec.name}: operand {name!r} has shape {op.shape}; it needs {want}")


def _matching_chunks(op, x):
    """Chunks for an in-memory operand so its blocks pair with ``x``'s (right-aligned)."""
    lead = x.ndim - op.ndim
    return tuple(x.chunks[lead + j] if n == x.shape[lead + j] else (n,)
                 for j, n in enumerate(op.shape))


def _aligned(spec, name, op, x, align):
    """``op`` with chunks lining up with ``x``'s along every shared axis, or an error."""
    _check_shape(spec, name, op, x)
    lead = x.ndim - op.ndim
    wrong = {}
    for j, n in enumerate(op.shape):
        a = lead + j
        if n == x.shape[a] and op.chunks[j] != x.chunks[a]:
            wrong[j] = x.chunks[a]
    if not wrong:
        return op
    if align:
        return op.rechunk(wrong)
    j = next(iter(wrong))
    raise AlignmentError(
        f"{spec.name}: operand {name!r} is chunked {op.chunks[j]} along its axis {j}, which lines "
        f"up with x's axis {lead + j}, chunked {x.chunks[lead + j]}; Dask's map_blocks would pair "
        f"blocks of different sizes. Rechunk it to match: {name} = {name}.rechunk("
        f"{ {k: v for k, v in wrong.items()} }), or pass align=True"
    )


def _as_array(kind, value, x_dtype):
    """An operand as an in-memory array of ``kind`` (NumPy or CuPy); Python scalars keep
    NumPy's weak typing."""
    if isinstance(value, numbers.Number) and not isinstance(value, np.generic):
        return kind.xp.asarray(value, dtype=np.result_type(x_dtype, value))
    if not kind.gpu:
        return cuda.to_host(value)
    return kind.xp.asarray(value)
