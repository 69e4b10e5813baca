"""The kernel registry: one frozen :class:`KernelSpec` per kernel name.

Built-in kernels live in :mod:`chunkernels.kernels` (one module or subpackage each, found there,
not listed); third-party packages add theirs through the entry-point group
``chunkernels.kernels``. Both are loaded the first time a name is looked up or the registry is
listed.

This module sits below every other one but :mod:`chunkernels._errors`: it imports neither the
kernels nor :mod:`chunkernels.cuda`. It learns where the built-in kernels come from through
:func:`set_builtin_provider`, which ``chunkernels/__init__.py`` calls when ``chunkernels`` is
imported (before any submodule, on a Dask worker too).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import itertools
import numbers
import re
import textwrap
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

import numpy as np

from chunkernels._errors import DuplicateKernelError, KernelSpecError, UnknownKernelError

ENTRY_POINT_GROUP = "chunkernels.kernels"
KINDS = ("raw", "elementwise", "reduction")
ALIGNMENTS = ("broadcast", "same")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SOURCE_FILE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.cu")


def _no_halo(ndim: int, **params: Any) -> tuple[int, ...]:
    return (0,) * ndim


def _edge_handled_by_kernel(**params: Any) -> str:
    return "none"


def _numpy_result_type(x_dtype: np.dtype, *operand_dtypes: np.dtype, **params: Any) -> np.dtype:
    return np.result_type(x_dtype, *operand_dtypes)


class always:
    """``result_dtype`` of a kernel whose result has one dtype whatever its inputs:
    ``KernelSpec(result_dtype=always(np.bool_))``.

    A spec travels inside every task of its graph; a module-level class pickles by reference,
    where a lambda would be pickled by value, task by task (cloudpickle scans every loaded
    module for each: milliseconds per task)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def __call__(self, *dtypes: np.dtype, **params: Any) -> np.dtype:
        return self.dtype

    def __reduce__(self):
        return always, (self.dtype,)

    def __eq__(self, other):
        return isinstance(other, always) and other.dtype == self.dtype

    def __hash__(self):
        return hash(self.dtype)

    def __repr__(self):
        return f"always({self.dtype.name})"


def _keyword_parameters(fn: Callable, skip: int) -> tuple[tuple[str, ...], frozenset] | None:
    """``(names, required names)`` of the parameters ``fn`` takes by keyword after its first
    ``skip`` positional ones; ``None`` where it takes any (``**params``) or has no signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and extension functions have none
        return None
    names, required = [], set()
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and skip:
            skip -= 1
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
            continue
        names.append(p.name)
        if p.default is p.empty:
            required.add(p.name)
    return tuple(names), frozenset(required)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Everything chunkernels knows about one kernel, described once.

    Parameters
    ----------
    name
        Identifier the kernel is called by (``apply(x, name, ...)``); never a path.
    cpu
        CPU reference, ``cpu(x, *operands, **params) -> numpy.ndarray``. It defines the result.
    gpu
        Stride-aware GPU dispatch, ``gpu(x, *operands, **params) -> cupy.ndarray``, or ``None`` for
        a CPU-only kernel. It receives CuPy arrays on the block's device and must not synchronise.
    kind
        ``"raw"`` (``cupy.RawModule``/``RawKernel``), ``"elementwise"`` or ``"reduction"``.
    source
        File name of the CUDA source in ``kernels_cuda/`` (``"broadcast_add.cu"``).
    code
        Inline CUDA source, for user kernels that do not ship a file. At most one of the two.
    entries
        Representative kernel entry names or C++ template instantiations. CI compiles each with
        ``nvcc`` (``tests/test_nvcc.py``); at run time the dispatch compiles, through NVRTC, the
        instantiation each block needs (``chunkernels.cuda.function``).
    dtypes
        Dtypes the GPU path accepts, for ``x`` and every operand.
    ndim
        ``(min, max)`` number of dimensions the GPU path accepts; ``max=None`` for any.
    operands
        Names of the extra array operands, in the order ``apply`` takes them.
    alignment
        How operands line up with ``x``: ``"broadcast"`` (NumPy broadcasting to ``x.shape``,
        right-aligned) or ``"same"`` (same shape as ``x``).
    halo
        ``halo(ndim, **params) -> tuple`` of per-axis overlap depth; zero for pointwise kernels.
    halo_rule
        The halo rule in words, for listings (``"ceil(truncate * sigma)"``).
    boundary
        ``boundary(**params) -> str``: Dask's boundary for the halo exchange. ``"none"`` when the
        kernel applies its own edge mode at the array's outer edge, ``"periodic"`` for wrap.
    result_dtype
        ``result_dtype(x_dtype, *operand_dtypes, **params) -> numpy.dtype``; NumPy's promotion
        by default.
    result_shape
        ``result_shape(shape, **params) -> tuple``: the shape of the result on a block of
        ``shape``, for a kernel whose result is not shaped like its input (a zoom's output
        region, convolve2d's 'full' window); ``None``: the block's shape. Every block's result
        is checked against it and ``result_dtype`` (reductions' partial statistics excepted).
    supports
        Extra check ``supports(block, *operands, **params) -> (bool, reason)`` run on GPU blocks
        after the dtype and ndim checks.
    contiguous
        The GPU dispatch needs C-contiguous inputs; the copy is then made explicitly before it.
    validate
        ``validate(ndim, **params) -> dict`` normalises and checks parameters once per call.
    cases
        ``cases(rng) -> iterable of (x, operands, params)``: random inputs for ``chunkernels check``.
    partial
        Reduction kernels: CPU statistics of one block, ``partial(x, *operands, **params) ->
        2-D array`` (rows of statistics). ``gpu`` then returns the same rows from the device.
    finalize
        Reduction kernels: ``finalize(stats, dtypes, **params) -> 0-d array`` combines the rows of
        every block (stacked, same array type as the blocks) into the result; ``dtypes`` are the
        input dtypes. ``cpu`` stays the whole-array reference that defines the result.
    stack
        ``stack(params) -> params``: the parameters that compute each entry of a stack of blocks
        (blocks of one shape along a new leading axis) as the kernel computes that block alone,
        for a kernel that never reads across that axis (a filter along listed axes: the axes
        shift by one). CuPy blocks in memory of one layout then run in one launch per pass
        (:mod:`chunkernels._halo`); ``None``: each block runs alone.
    dask_graph
        Kernels whose result is not blockwise in ``x``'s chunks (a zoom changes the shape) plan
        their own Dask graph: ``dask_graph(x, *operands, strict=..., **params) -> dask.array.Array``
        with validated ``params``. :func:`chunkernels.apply` calls it for Dask ``x`` instead of
        ``map_blocks`` / ``map_overlap``; the tasks it makes still run ``cpu`` / ``gpu`` per block.
    skimage
        scikit-image functions this kernel implements, as ``"module:function"`` names
        (``"skimage.metrics:mean_squared_error"``); the scikit-image backend serves them.
    rtol
        Relative tolerance of the kernel's results against ``cpu`` where the defaults in
        :data:`chunkernels.testing.TOLERANCES` are too tight for a documented reason.
    summary
        One line saying what the kernel computes and what its reference is.
    """

    name: str
    cpu: Callable[..., Any]
    gpu: Callable[..., Any] | None = None
    kind: str = "raw"
    source: str | None = None
    code: str | None = None
    entries: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("float32", "float64")
    ndim: tuple[int, int | None] = (0, None)
    operands: tuple[str, ...] = ()
    alignment: str = "broadcast"
    halo: Callable[..., tuple[int, ...]] = _no_halo
    halo_rule: str = "0"
    boundary: Callable[..., str] = _edge_handled_by_kernel
    result_dtype: Callable[..., np.dtype] = _numpy_result_type
    result_shape: Callable[..., tuple[int, ...]] | None = None
    supports: Callable[..., tuple[bool, str]] | None = None
    contiguous: bool = False
    validate: Callable[..., Mapping[str, Any]] | None = None
    cases: Callable[..., Iterable[tuple[Any, tuple, dict]]] | None = None
    partial: Callable[..., Any] | None = None
    finalize: Callable[..., Any] | None = None
    stack: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    dask_graph: Callable[..., Any] | None = None
    skimage: tuple[str, ...] = ()
    rtol: float | None = None
    summary: str = ""

    def __post_init__(self):
        def bad(what):
            raise KernelSpecError(f"kernel {self.name!r}: {what}")

        if not isinstance(self.name, str) or not _IDENTIFIER.fullmatch(self.name):
            raise KernelSpecError(
                f"kernel name {self.name!r} is not an identifier: names are like 'broadcast_add' "
                "(letters, digits, underscores), never paths"
            )
        if self.kind not in KINDS:
            bad(f"kind={self.kind!r}; expected one of {KINDS}")
        if self.alignment not in ALIGNMENTS:
            bad(f"alignment={self.alignment!r}; expected one of {ALIGNMENTS}")
        if not callable(self.cpu):
            bad("cpu must be the CPU reference function")
        if self.gpu is not None and not callable(self.gpu):
            bad("gpu must be a dispatch function or None")
        examples = {"halo": "lambda ndim, **params: (2,) * ndim",
                    "boundary": "lambda **params: 'none'",
                    "result_dtype": "lambda x_dtype, *operand_dtypes, **params: "
                                    "np.dtype(np.float32)"}
        for field, example in examples.items():
            value = getattr(self, field)
            # a dtype is no function, though NumPy's scalar types are callable
            if not callable(value) or isinstance(value, np.dtype) or (
                    isinstance(value, type) and issubclass(value, np.generic)):
                bad(f"{field}={value!r} must be a function of the parameters, not a value: "
                    f"e.g. {field}={example}")
        for field in ("supports", "validate", "cases", "partial", "finalize"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                bad(f"{field}={value!r} must be a function, or None")
        for field in ("entries", "dtypes", "operands", "skimage"):
            value = getattr(self, field)
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                bad(f"{field}={value!r} must be a sequence of names, e.g. {field}=({value!r},)")
        if self.source is not None and self.code is not None:
            bad("give either source (a file in kernels_cuda/) or code (inline), not both")
        if self.source is not None and not _SOURCE_FILE.fullmatch(self.source):
            bad(f"source={self.source!r} must be a bare file name like 'my_kernel.cu' in kernels_cuda/")
        for dt in self.dtypes:
            try:
                np.dtype(dt)
            except TypeError:
                bad(f"dtypes: {dt!r} is not a NumPy dtype (write names like 'float32')")
        def count(n):
            return isinstance(n, numbers.Integral) and not isinstance(n, bool)

        if not (isinstance(self.ndim, (tuple, list)) and len(self.ndim) == 2
                and count(self.ndim[0]) and (self.ndim[1] is None or count(self.ndim[1]))):
            bad(f"ndim={self.ndim!r}; expected a (min, max) pair of dimension counts, max None "
                f"for any, e.g. ndim=(2, 2) for 2-D only")
        lo, hi = self.ndim
        if lo < 0 or (hi is not None and hi < lo):
            bad(f"ndim={self.ndim!r} is not a (min, max) range")
        if self.kind == "reduction" and (self.partial is None or self.finalize is None):
            bad("a reduction kernel needs partial (CPU statistics of a block) and finalize")
        if self.kind != "reduction" and (self.partial is not None or self.finalize is not None):
            bad(f"partial and finalize belong to reduction kernels; this one is kind={self.kind!r}")
        if self.stack is not None and not callable(self.stack):
            bad("stack must be a function of the parameters, or None")
        if self.result_shape is not None and not callable(self.result_shape):
            bad("result_shape must be a function of the block's shape and the parameters, or None")
        if self.dask_graph is not None and not callable(self.dask_graph):
            bad("dask_graph must be a function that plans the kernel's Dask graph, or None")
        for name in self.skimage:
            if not re.fullmatch(r"skimage(\.\w+)+:\w+", name):
                bad(f"skimage={name!r} is not a 'skimage.module:function' name")
        for op in self.operands:
            if not _IDENTIFIER.fullmatch(op):
                bad(f"operand name {op!r} is not an identifier")
        # tuples, so the spec stays hashable and frozen
        for field in ("entries", "dtypes", "operands", "skimage"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        object.__setattr__(self, "ndim", (lo, hi))
        # dtype objects hash and compare faster than dtype.name builds its string: the per-block
        # check runs on every chunk
        object.__setattr__(self, "_gpu_dtypes", frozenset(np.dtype(d) for d in self.dtypes))
        # the parameters the kernel takes: validate's after ndim, else the CPU reference's after
        # x and the operands (read once here, checked on every call by check_parameters)
        object.__setattr__(self, "_parameters", _keyword_parameters(self.validate, 1)
                           if self.validate is not None
                           else _keyword_parameters(self.cpu, 1 + len(self.operands)))

    # -- derived facts, computed the same way everywhere -------------------------------------

    def params(self, ndim: int, params: Mapping[str, Any]) -> dict[str, Any]:
        """Validated, normalised parameters for an ``ndim``-dimensional input.

        Raises
        ------
        TypeError
            A parameter the kernel does not take, or one it needs missing
            (:meth:`check_parameters`).
        """
        self.check_parameters(params)
        if self.validate is None:
            return dict(params)
        return dict(self.validate(ndim, **params))

    @property
    def parameters(self) -> tuple[str, ...] | None:
        """Names of the parameters the kernel takes (its ``validate``'s, else its CPU
        reference's), in order; ``None`` where it takes any (a ``**params`` catch-all)."""
        return None if self._parameters is None else self._parameters[0]

    def check_parameters(self, params: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` naming the kernel, its parameters and the closest match for a
        parameter it does not take, or naming a parameter it needs that is missing.

        Checked once here for every kernel, instead of Python's "validate() got an unexpected
        keyword argument 'sigmaa'", which names neither the kernel nor what it takes. A kernel
        whose ``validate`` takes ``**params`` checks its own.
        """
        if self._parameters is None:
            return
        names, required = self._parameters
        unknown = [k for k in params if k not in names]
        missing = [k for k in names if k in required and k not in params]
        if not unknown and not missing:
            return
        takes = (f"{self.name} takes " + ", ".join(f"{n} (required)" if n in required else n
                                                   for n in names)
                 if names else f"{self.name} takes no parameters")
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(str(k), names, n=1, cutoff=0.6)
                hints.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
            raise TypeError(f"{self.name} got unknown parameter{'s' * (len(unknown) > 1)} "
                            f"{', '.join(hints)}; {takes}")
        raise TypeError(
            f"{self.name} needs parameter{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}"
            f", which {'have' if len(missing) > 1 else 'has'} no default; {takes}. E.g. "
            f"chunkernels.apply(x, {self.name!r}, {', '.join(f'{k}=...' for k in missing)})")

    def depth(self, ndim: int, params: Mapping[str, Any]) -> tuple[int, ...]:
        """Per-axis halo depth for validated ``params``."""
        depth = self.halo(ndim, **params)
        if isinstance(depth, int | np.integer):
            depth = (int(depth),) * ndim
        depth = tuple(int(d) for d in depth)
        if len(depth) != ndim or any(d < 0 for d in depth):
            raise KernelSpecError(
                f"kernel {self.name!r}: halo() returned {depth!r} for ndim={ndim}; "
                f"expected {ndim} non-negative integers"
            )
        return depth

    def out_dtype(self, x_dtype, operand_dtypes=(), params=None) -> np.dtype:
        """Result dtype for inputs of these dtypes."""
        return np.dtype(self.result_dtype(np.dtype(x_dtype), *map(np.dtype, operand_dtypes),
                                          **(params or {})))

    def out_shape(self, shape: tuple[int, ...], params=None) -> tuple[int, ...]:
        """Result shape on a block of ``shape``: the block's own unless ``result_shape`` says."""
        if self.result_shape is None:
            return tuple(shape)
        return tuple(int(n) for n in self.result_shape(tuple(shape), **(params or {})))

    def check_block(self, block, *operands, **params) -> tuple[bool, str]:
        """Whether the GPU path takes this block: ``(ok, reason)``."""
        if self.gpu is None:
            return False, f"{self.name} has no GPU implementation"
        for label, arr in (("x", block), *zip(self.operands, operands)):
            if arr.dtype not in self._gpu_dtypes:
                return False, (f"{label} has dtype {arr.dtype.name}; the GPU path takes "
                               f"{', '.join(self.dtypes)}")
        lo, hi = self.ndim
        if block.ndim < lo or (hi is not None and block.ndim > hi):
            return False, f"x has ndim={block.ndim}; the GPU path takes {self.ndim_text}"
        if self.supports is not None:
            ok, reason = self.supports(block, *operands, **params)
            if not ok:
                return False, reason
        return True, ""

    @property
    def ndim_text(self) -> str:
        lo, hi = self.ndim
        if hi is None:
            return f">={lo}" if lo else "any"
        return str(lo) if lo == hi else f"{lo}..{hi}"

    def describe(self) -> str:
        """The spec in readable form."""
        where = self.source and f"kernels_cuda/{self.source}" or ("inline" if self.code else "-")
        rows = [
            ("name", self.name),
            ("summary", self.summary or "-"),
            ("kind", self.kind),
            ("source", where),
            ("entries", ", ".join(self.entries) or "-"),
            ("dtypes", ", ".join(self.dtypes)),
            ("ndim", self.ndim_text),
            ("operands", ", ".join(self.operands) or "-"),
            ("alignment", self.alignment if self.operands else "-"),
            ("halo", self.halo_rule if self.kind != "reduction" else "0 (reduction: partials per block)"),
            ("scikit-image", ", ".join(self.skimage) or "-"),
            ("gpu", "yes" if self.gpu is not None else "no (CPU reference only)"),
            ("contiguous", "copies to C order first" if self.contiguous else "any strides"),
            ("cpu reference", f"{self.cpu.__module__}.{self.cpu.__qualname__}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {textwrap.shorten(str(v), 200)}" for k, v in rows)


# -- the registry ---------------------------------------------------------------------------

_REGISTRY: dict[str, KernelSpec] = {}
_ORIGIN: dict[str, str] = {}
_LOCK = threading.RLock()
#: The KernelSpec objects :func:`register` took in this process (alive ones), by id.
_REGISTERED_HERE: dict[int, bool] = {}
#: A number per KernelSpec object alive in this process (:func:`spec_serial`), by id.
_SERIALS: dict[int, int] = {}
_NEXT_SERIAL = itertools.count(1)
_loaded = {"builtins": False, "entry_points": False}
#: ``provider() -> iterable of (origin, KernelSpec)``: the built-in kernels, imported when the
#: registry is first used (see :func:`set_builtin_provider`).
_builtin_provider: Callable[[], Iterable[tuple[str, KernelSpec]]] | None = None


def set_builtin_provider(provider: Callable[[], Iterable[tuple[str, KernelSpec]]]) -> None:
    """Tell the registry where the built-in kernels come from.

    ``chunkernels/__init__.py`` hands it :func:`chunkernels.kernels.builtin_specs`: the
    registry, below every kernel, must not import them itself. ``provider()`` yields
    ``(origin, spec)`` pairs (``origin``: the module a spec comes from, shown in duplicate-name
    errors) and is called once, at the registry's first lookup or listing.
    """
    global _builtin_provider
    _builtin_provider = provider


def register(spec: KernelSpec | None = None, /, *, replace: bool = False,
             origin: str | None = None, **fields: Any) -> KernelSpec:
    """Add a kernel to the registry.

    Call it with a :class:`KernelSpec`, or with the spec's fields as keywords
    (``register(name="my_add", cpu=..., gpu=..., code=...)``).

    Parameters
    ----------
    spec
        The kernel description; omit it to build one from ``fields``.
    replace
        Replace a kernel already registered under the same name instead of raising.
    origin
        Where the kernel came from, shown in duplicate-name errors (defaults to the module of
        its CPU reference).

    Returns
    -------
    KernelSpec
        The registered spec.

    Raises
    ------
    DuplicateKernelError
        When the name is taken and ``replace`` is false.
    """
    if spec is None:
        spec = _spec_from_fields(fields)
    elif fields:
        raise TypeError("pass either a KernelSpec or its fields as keywords, not both")
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"register() takes a KernelSpec, got {type(spec).__name__}")
    origin = origin or getattr(spec.cpu, "__module__", "?")
    with _LOCK:
        _load_builtins()
        if spec.name in _REGISTRY and not replace:
            raise DuplicateKernelError(
                f"a kernel named {spec.name!r} is already registered (from {_ORIGIN[spec.name]}); "
                f"register yours under another name, or pass replace=True to override it on "
                f"purpose (chunkernels.unregister({spec.name!r}) removes it)"
            )
        # nothing compiled from a replaced spec's code is reused: chunkernels.cuda.function
        # keys its cache by the code itself
        _REGISTRY[spec.name] = spec
        _ORIGIN[spec.name] = origin
        _registered_here(spec)
    return spec


def _registered_here(spec: KernelSpec) -> None:
    """Remember that ``spec`` was registered in this process (see :func:`ensure_registered`)."""
    if id(spec) not in _REGISTERED_HERE:
        _per_object(_REGISTERED_HERE, spec, True)


def spec_serial(spec: KernelSpec) -> int:
    """A number that names ``spec``, this very object, in this process: the same for as long as
    it lives, and never given to another. The Dask keys of a kernel's results include it
    (besides its name), so that a kernel registered anew under a name already used
    (``replace=True``) gets new keys: a cluster that still holds the results of the kernel it
    replaced would otherwise hand those back for the same keys."""
    with _LOCK:
        serial = _SERIALS.get(id(spec))
        if serial is None:
            serial = next(_NEXT_SERIAL)
            _per_object(_SERIALS, spec, serial)
        return serial


def _per_object(table: dict, spec: KernelSpec, value) -> None:
    """``table[id(spec)] = value`` for as long as ``spec`` lives: the entry goes with it, before
    its id can name another object."""
    table[id(spec)] = value
    weakref.finalize(spec, table.pop, id(spec), None)


def _spec_from_fields(fields: Mapping[str, Any]) -> KernelSpec:
    """``KernelSpec(**fields)``, with an error naming the kernel, the field(s) missing or
    unknown and an example instead of the dataclass's bare ``__init__()`` TypeError."""
    known = [f.name for f in dataclasses.fields(KernelSpec)]
    needed = [f.name for f in dataclasses.fields(KernelSpec)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    kernel = f"kernel {fields['name']!r}" if "name" in fields else "a kernel without a name"
    unknown = [k for k in fields if k not in known]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, known, n=2, cutoff=0.5)
            hints.append(f"{k!r} (did you mean {' or '.join(map(repr, close))}?)" if close
                         else repr(k))
        raise TypeError(f"register() of {kernel}: unknown KernelSpec field(s) {', '.join(hints)}; "
                        f"the fields are {', '.join(known)}")
    missing = [k for k in needed if k not in fields]
    if missing:
        raise TypeError(
            f"register() of {kernel}: missing {' and '.join(missing)} (a KernelSpec needs "
            f"{' and '.join(needed)}: the kernel's name and its CPU reference, which defines the "
            f"result). E.g. chunkernels.register(name={fields.get('name', 'my_add')!r}, "
            f"cpu=reference, gpu=dispatch, code=CUDA_SOURCE), where reference(x, *operands, "
            f"**params) returns the result as a NumPy array")
    return KernelSpec(**fields)


def unregister(name: str) -> KernelSpec:
    """Remove a kernel from the registry and return its spec."""
    with _LOCK:
        spec = get(name)
        del _REGISTRY[name]
        del _ORIGIN[name]
    return spec


def get(name: str) -> KernelSpec:
    """The spec registered under ``name``.

    Raises
    ------
    UnknownKernelError
        Listing the closest registered names.
    """
    try:  # first, as every launch asks (chunkernels.cuda.function): registered names are valid
        return _REGISTRY[name]
    except (KeyError, TypeError):
        pass
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise UnknownKernelError(
            f"{name!r} is not a kernel name: names are identifiers like 'broadcast_add', "
            f"never paths; chunkernels.registered() lists them"
        )
    with _LOCK:
        _load_builtins()
        if name not in _REGISTRY:
            _load_entry_points()
        spec = _REGISTRY.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise UnknownKernelError(
            f"no kernel named {name!r}; {hint}registered kernels: {', '.join(sorted(_REGISTRY))}"
        )
    return spec


def registered() -> list[str]:
    """Names of all registered kernels (built-in, from entry points, and your own), sorted."""
    with _LOCK:
        _load_builtins()
        _load_entry_points()
        return sorted(_REGISTRY)


def describe(name: str) -> str:
    """A readable description of kernel ``name``'s spec."""
    return get(name).describe()


def _load_builtins() -> None:
    if _loaded["builtins"]:
        return
    if _builtin_provider is None:
        raise RuntimeError(
            "the kernel registry was used before chunkernels/__init__.py told it where the "
            "built-in kernels are (chunkernels._registry.set_builtin_provider): use it after "
            "`import chunkernels` has finished, not from code that runs while it imports"
        )
    _loaded["builtins"] = True
    for origin, spec in _builtin_provider():
        if spec.name in _REGISTRY:
            raise DuplicateKernelError(f"built-in kernel {spec.name!r} registered twice (from "
                                       f"{_ORIGIN[spec.name]} and {origin})")
        _REGISTRY[spec.name] = spec
        _ORIGIN[spec.name] = origin
        _registered_here(spec)


def _load_entry_points() -> None:
    """Register kernels that installed packages publish under ``chunkernels.kernels``.

    An entry point names a KernelSpec, an iterable of them, or a callable returning either. A
    broken plug-in is reported with a warning and skipped: it must not break every other kernel.
    """
    if _loaded["entry_points"]:
        return
    _loaded["entry_points"] = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, KernelSpec):
                obj = obj()
            specs = [obj] if isinstance(obj, KernelSpec) else list(obj)
            for spec in specs:
                register(spec, origin=f"entry point {ep.name!r} ({ep.value})")
        except Exception as exc:  # noqa: BLE001 - any plug-in failure is reported, not fatal
            warnings.warn(
                f"could not load chunkernels kernels from entry point {ep.name!r} "
                f"({ep.value}): {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )


def ensure_registered(spec: KernelSpec) -> None:
    """Register ``spec`` if its name is unknown here (a Dask worker receiving a user kernel).

    Not a spec that :func:`register` took in this process and that was unregistered or replaced
    since: a task of an earlier graph still running here (a thread of the local scheduler goes
    on after the graph's first error) must not bring it back."""
    if spec.name in _REGISTRY or id(spec) in _REGISTERED_HERE:
        return
    with _LOCK:
        _load_builtins()
        if spec.name not in _REGISTRY and id(spec) not in _REGISTERED_HERE:
            _REGISTRY[spec.name] = spec
            _ORIGIN[spec.name] = "a task sent by the client"
