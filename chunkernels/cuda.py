"""Lazy access to CUDA: CuPy is imported on first use and kernels compile on first launch.

Nothing here runs at ``import chunkernels``: no CuPy import, no CUDA context. Compiled kernels are
cached per device, keyed by everything that changes the generated code (the kernel's code, C++
name expression); launch geometry and array sizes are runtime arguments, so uneven edge chunks
never trigger a recompile.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import re
import struct
import threading
import warnings
from pathlib import Path
from typing import Any

from chunkernels._errors import KernelArgumentError, LaunchFallbackError, LaunchFallbackWarning
from chunkernels._imports import imported
from chunkernels._registry import get

#: NVRTC options every chunkernels kernel is compiled with. They belong to the library: users
#: cannot pass compiler options, so a kernel behaves the same wherever it is compiled.
COMPILE_OPTIONS = ("--std=c++17",)

#: Compiled functions by (device, kernel, name expression, the kernel's code: its inline source
#: text or its file name, None for a library file).
_FUNCTIONS: dict[tuple[int, str, str, str | None], Any] = {}
_COMPILE_LOCK = threading.Lock()

_CONSTANTS: dict[tuple, Any] = {}
_MAX_CONSTANTS = 256
_CONSTANTS_LOCK = threading.Lock()


def cupy():
    """The ``cupy`` module, imported on first use."""
    try:
        import cupy as cp
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "this needs CuPy, which is not installed: pip install 'chunkernels[cuda12]' "
            "(or [cuda13]) on a machine with an NVIDIA GPU"
        ) from exc
    return cp


def is_cupy_array(a: Any) -> bool:
    """Whether ``a`` is a ``cupy.ndarray``, answered without importing CuPy."""
    cp = imported("cupy")  # not a half-imported one: no CuPy array exists before its import ends
    return cp is not None and isinstance(a, cp.ndarray)


def to_host(a: Any):
    """A NumPy array from a NumPy or CuPy array (or anything ``numpy.asarray`` takes): a CuPy
    array is copied off its device."""
    import numpy as np

    return a.get() if is_cupy_array(a) else np.asarray(a)


def array_module(a: Any):
    """``cupy`` for a CuPy array (or a Dask array of CuPy chunks), else ``numpy``."""
    import numpy as np

    return cupy() if is_cupy_array(getattr(a, "_meta", a)) else np


def gpu_count() -> int:
    """Number of CUDA devices usable through CuPy; 0 when CuPy or a driver is missing."""
    try:
        import cupy as cp

        return cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no GPU"
        return 0


def device_constant(host, dtype):
    """Host array ``host`` as a C-ordered CuPy array of ``dtype`` on the current device,
    uploaded once per device and value.

    Filter weights and resampling tables, which every block of a graph passes again, then cost
    no host-to-device copy after the first block. The result is shared: treat it as read-only.
    Past a few hundred entries the oldest is dropped.
    """
    import numpy as np

    cp = cupy()
    a = np.ascontiguousarray(host, dtype=dtype)
    key = (cp.cuda.runtime.getDevice(), a.dtype.str, a.shape, a.tobytes())
    dev = _CONSTANTS.get(key)
    if dev is None:
        dev = cp.asarray(a)
        with _CONSTANTS_LOCK:  # Dask's threads share the cache
            while len(_CONSTANTS) >= _MAX_CONSTANTS:
                del _CONSTANTS[next(iter(_CONSTANTS))]
            _CONSTANTS[key] = dev
    return dev


@functools.cache
def sm_count(device: int) -> int:
    """Number of streaming multiprocessors of CUDA device ``device`` (for grid sizes)."""
    return cupy().cuda.Device(device).attributes["MultiProcessorCount"]


@functools.cache
def source_dir() -> Path:
    """The folder holding the CUDA sources.

    An installed wheel carries them inside the package (``chunkernels/kernels_cuda``); a source
    checkout keeps them at the repository's top (``kernels_cuda/``).
    """
    package = Path(__file__).resolve().parent
    for candidate in (package / "kernels_cuda", package.parent / "kernels_cuda"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"chunkernels' CUDA sources were not found in {package / 'kernels_cuda'} (installed "
        f"wheel) nor in {package.parent / 'kernels_cuda'} (source checkout); reinstall chunkernels"
    )


def source(kernel: str) -> str:
    """CUDA source text of registered kernel ``kernel`` (its file, or its inline code).

    A name ending in ``.cu`` is one of the library's own sources in :func:`source_dir` (helpers
    such as the halo exchange's gather, which are not registered kernels: a kernel name is an
    identifier, so the two never collide).
    """
    if kernel.endswith(".cu"):
        return _inline_includes(source_dir() / kernel)
    return _spec_source(kernel, get(kernel))


def _spec_source(kernel: str, spec) -> str:
    """CUDA source text of ``spec``, registered as ``kernel``."""
    if spec.code is not None:
        return spec.code
    if spec.source is None:
        raise ValueError(f"kernel {kernel!r} has no CUDA source (neither source= nor code=)")
    return _inline_includes(source_dir() / spec.source)


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([A-Za-z_][A-Za-z0-9_]*\.cuh)"[ \t]*$', re.M)


def _inline_includes(path: Path) -> str:
    """The text of ``path`` with its ``#include "name.cuh"`` lines replaced by those headers.

    Headers beside the kernels (``kernels_cuda/*.cuh``) hold device helpers several kernels share.
    Inlining them gives NVRTC one self-contained source, and CuPy's compile cache, which hashes
    the source text, then sees a change to a header too.
    """
    seen: set[str] = set()

    def expand(text: str) -> str:
        def header(match):
            name = match.group(1)
            if name in seen:  # included already: its guard would skip it anyway
                return ""
            seen.add(name)
            return expand((path.parent / name).read_text())

        return _LOCAL_INCLUDE.sub(header, text)

    return expand(path.read_text())


def function(kernel: str, name_expression: str):
    """The compiled CUDA function ``name_expression`` of registered kernel ``kernel``, a
    :class:`Kernel` (launched like ``cupy.RawKernel``).

    Compiles on first use for the current device and caches the result per device, so a Dask
    worker bound to GPU 3 compiles and runs on GPU 3. ``name_expression`` is a kernel entry name
    or a C++ template instantiation such as ``"broadcast_add<float, float, float, int, 2, 4>"``.
    ``kernel`` may also name a library source file (``"halo_gather.cu"``, see :func:`source`).
    The cache is also keyed by the kernel's code (its inline text, or its file): a kernel
    registered again with other code (``register(..., replace=True)``) compiles anew, one
    registered again with the same code reuses what was compiled.
    """
    cp = cupy()
    spec = None if kernel.endswith(".cu") else get(kernel)
    code = None if spec is None else spec.source if spec.code is None else spec.code
    key = (cp.cuda.runtime.getDevice(), kernel, name_expression, code)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        with _COMPILE_LOCK:
            fn = _FUNCTIONS.get(key)
            if fn is None:
                # from the spec the key was made of, whatever was registered since
                text = source(kernel) if spec is None else _spec_source(kernel, spec)
                module = cp.RawModule(code=text, options=COMPILE_OPTIONS,
                                      name_expressions=[name_expression])
                fn = _FUNCTIONS[key] = Kernel(module.get_function(name_expression),
                                              name_expression)
    return fn


def forget(kernel: str) -> None:
    """Drop compiled functions of ``kernel`` on every device, whatever code they came from.

    Not needed for a kernel registered again with other code (the cache is keyed by the code);
    the benchmarks and tests call it to count the compilations of a cold start.
    """
    with _COMPILE_LOCK:
        for key in [k for k in _FUNCTIONS if k[1] == kernel]:
            del _FUNCTIONS[key]


# -- launching ------------------------------------------------------------------------------------


def _gil_setting(text: str):
    """``CHUNKERNELS_LAUNCH_HOLDS_GIL``'s value as :data:`LAUNCH_HOLDS_GIL` takes it."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("auto", ""):
        return "auto"
    raise ValueError(
        f"CHUNKERNELS_LAUNCH_HOLDS_GIL={text!r} is not understood; use 1 (launches hold the GIL), "
        f"0 (they release it) or auto (the default: hold it, except on a Dask distributed "
        f"worker's threads)")


#: Whether :class:`Kernel` launches hold the GIL while ``cuLaunchKernel`` runs: ``True`` (the call
#: goes through ``ctypes.PyDLL``), ``False`` (``ctypes.CDLL``, which releases it) or ``"auto"``,
#: decided once per thread: released on a Dask ``distributed`` worker's threads, where a launch
#: that blocks on a full launch queue would otherwise stall the worker's event loop
#: (heartbeats, transfers), held everywhere else. The environment variable
#: ``CHUNKERNELS_LAUNCH_HOLDS_GIL`` (``1``, ``0``, ``auto``) sets it in every process that
#: imports chunkernels, Dask's worker processes included.
LAUNCH_HOLDS_GIL = _gil_setting(os.environ.get("CHUNKERNELS_LAUNCH_HOLDS_GIL", "auto"))

#: Set true, every :class:`Kernel` launch goes through CuPy's ``RawKernel`` (releasing the GIL,
#: with CuPy's own argument conversion): the benchmarks' comparison rows. Counted as CuPy
#: launches in :func:`launch_counts`, not as fallbacks.
LAUNCH_THROUGH_CUPY = False

#: The environment variable that decides what a fallback to CuPy's launch does: ``warn`` (the
#: default: warned once per reason, counted) or ``error`` (raises
#: :class:`LaunchFallbackError`; the test suite sets it). Read at each
#: fallback, so that it can be set after import.
FALLBACK_ENV = "CHUNKERNELS_LAUNCH_FALLBACK"


class Kernel:
    """A compiled CUDA function on one device, launched like ``cupy.RawKernel``:
    ``kernel(grid, block, args, shared_mem=0)`` on the current CuPy stream.

    The launch calls the driver's ``cuLaunchKernel`` through ctypes, holding the GIL or not as
    :data:`LAUNCH_HOLDS_GIL` says for the launching thread. CuPy releases the GIL around each
    launch, a call of a few microseconds that does not wait for the GPU; under Dask's threaded
    scheduler every such release lets another worker thread take the GIL, and the launching
    thread then waits to be woken to take it back. Holding it keeps a task's launches back to
    back. On a Dask ``distributed`` worker the launch releases it instead, so that a launch
    blocked on a full launch queue never stalls the worker's event loop.

    Each argument is packed where the compiled function's parameter lies and at its size, as
    the driver reports them (``cuFuncGetParamInfo``, asked once per function): a CuPy array as
    its 8-byte device pointer (None as a null pointer), a one-element NumPy array (a struct
    passed by value) as its bytes, a NumPy scalar as its dtype, a Python int as a signed integer
    of the parameter's size, a float as a float32 or float64 by size, a bool as one byte. A
    value that does not fit its parameter (another size, a type that cannot be passed, the
    wrong number of arguments, an int out of range) raises :class:`KernelArgumentError` naming
    the kernel, the parameter and the value: never a silent conversion. The driver reports
    sizes, not C types: a value's own type tells an integer from a float of the same size, so
    pass the parameter's (a Python int for a ``double`` is packed as an integer).

    Where the layout cannot be had (no ``libcuda.so.1``, a driver older than CUDA 12.4 without
    ``cuFuncGetParamInfo``, a CuPy without the function handle) the kernel launches through
    CuPy's ``RawKernel``, with CuPy's own argument conversion: counted by reason in
    :func:`launch_counts`, warned once (:class:`LaunchFallbackWarning`), an error
    (:class:`LaunchFallbackError`) where ``CHUNKERNELS_LAUNCH_FALLBACK=error``.

    Parameters
    ----------
    raw
        The ``cupy.RawKernel``, compiled for the current device.
    name
        What messages call the kernel (its C++ name expression); ``raw.name`` by default.

    Attributes
    ----------
    layout
        ``(offset, size)`` in bytes of each parameter, from the driver; None after a fallback.
    fallback
        Why the kernel launches through CuPy, or None.
    """

    __slots__ = ("raw", "name", "layout", "fallback", "_handle", "_hold", "_release", "_stream",
                 "_plan", "_plans", "_local", "_size")

    def __init__(self, raw, name: str | None = None):
        self.raw = raw
        self.name = name or raw.name
        self.layout = self.fallback = self._handle = self._hold = self._release = None
        self._plan = _NoPlan  # the last launch's: the next launch most likely has its types
        self._plans: dict[tuple[type, ...], _Plan] = {}  # argument types -> how to pack them
        self._local = threading.local()  # .slot: this thread's (buffer, its address, launch)
        driver = _driver()
        try:
            if driver.missing:
                raise _NoLayout(driver.missing)
            self._handle = ctypes.c_void_p(_function_handle(raw))
            self.layout = _parameter_layout(driver.param_info, self._handle,
                                            driver.param_count)
        except _NoLayout as exc:
            self.fallback = str(exc)
            return
        self._hold, self._release = driver.hold, driver.release
        self._stream = cupy().cuda.get_current_stream
        # kernelParams (a pointer per parameter), then the values as the parameters lie
        self._size = _parameters_start(len(self.layout)) + (sum(self.layout[-1]) if
                                                            self.layout else 0)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.raw.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, nbytes: int) -> None:
        self.raw.max_dynamic_shared_size_bytes = nbytes

    def __call__(self, grid, block, args, shared_mem=0):
        if LAUNCH_THROUGH_CUPY or self.fallback is not None:
            return self._through_cupy(grid, block, args, shared_mem)
        try:
            buffer, at, auto = self._local.slot
        except AttributeError:
            buffer, at, auto = self._new_slot()
        try:
            if not self._plan.pack(buffer, args):
                self._plan_for(args).pack(buffer, args)
        except (struct.error, OverflowError):
            raise _out_of_range(self.name, self.layout, args) from None
        ptr = self._stream().ptr
        try:
            stream = _STREAMS[ptr]
        except KeyError:
            stream = _stream_argument(ptr)
        setting = LAUNCH_HOLDS_GIL
        launch = auto if setting == "auto" else self._hold if setting else self._release
        grid, block = (*grid, 1, 1), (*block, 1, 1)
        status = launch(self._handle, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                        shared_mem, stream, at, None)
        if status == _INVALID_CONTEXT:
            # a thread that has made no CUDA runtime call has no current context yet (CuPy
            # makes one for each launch); cudaFree(0) makes the device's the current one
            cupy().cuda.runtime.free(0)
            status = launch(self._handle, grid[0], grid[1], grid[2], block[0], block[1],
                            block[2], shared_mem, stream, at, None)
        if status:
            raise cupy().cuda.driver.CUDADriverError(status)
        next(_DRIVER_LAUNCHES)

    def _plan_for(self, args) -> _Plan:
        """The plan for arguments of the types of ``args``: kept, or made (and checked: this
        raises :class:`KernelArgumentError`); the next launch tries it first."""
        types = tuple(map(type, args))
        plan = self._plans.get(types)
        if plan is None:
            plan = _pack_plan(self.name, self.layout, args, cupy().ndarray)
            if len(self._plans) >= _MAX_PLANS:  # a few argument types per kernel; a guard
                self._plans.clear()
            self._plans[types] = plan
        self._plan = plan
        return plan

    def _new_slot(self) -> tuple:
        """This thread's buffer (its parameter pointers written), its address and the launch
        function :data:`LAUNCH_HOLDS_GIL` ``= "auto"`` picks for the thread."""
        buffer = ctypes.create_string_buffer(max(self._size, 1))
        at = ctypes.addressof(buffer)
        start = _parameters_start(len(self.layout))
        for i, (offset, _) in enumerate(self.layout):
            ctypes.c_void_p.from_address(at + 8 * i).value = at + start + offset
        auto = self._hold if _auto_holds_gil() else self._release
        self._local.slot = buffer, ctypes.c_void_p(at), auto
        return self._local.slot

    def _through_cupy(self, grid, block, args, shared_mem):
        _note_cupy_launch(None if LAUNCH_THROUGH_CUPY else self.fallback, self.name)
        return self.raw(grid, block, args, shared_mem=shared_mem)


class _NoLayout(Exception):
    """Why a kernel's parameter layout cannot be had: the kernel launches through CuPy."""


class _Plan:
    """How :class:`Kernel` packs arguments of one tuple of types (``types``) for parameters at
    ``offsets``: ``pack(buffer, args)`` checks that ``args`` are of those types, writes them at
    ``start`` in ``buffer`` as the parameters lie, and answers True; or answers False, writing
    nothing, for arguments of other types (another plan may take them).

    ``pack`` is generated for the types (``source`` holds its text): one check of each
    argument's type and one ``struct`` call, with no loop, cost a launch less than walking the
    arguments would. ``kinds`` says what each argument becomes: ``"value"`` (packed as it is,
    with its ``codes`` entry), ``"pointer"`` (a CuPy array: its device pointer), ``"bytes"``
    (a NumPy value passed as its bytes; an array's size is checked at each launch) or
    ``"null"`` (None: a null pointer).
    """

    __slots__ = ("types", "codes", "kinds", "struct", "source", "pack")

    def __init__(self, name, offsets, start, args, codes, kinds):
        self.types = tuple(map(type, args))
        self.codes, self.kinds = tuple(codes), tuple(kinds)
        fields, end = [], 0
        for code, offset in zip(codes, offsets, strict=True):
            if offset > end:
                fields.append(f"{offset - end}x")  # padding up to the parameter's offset
            fields.append(code)
            end = offset + struct.calcsize("<" + code)
        self.struct = struct.Struct("<" + "".join(fields))  # "<": no padding but ours
        n = len(args)
        names = [f"a{i}" for i in range(n)]
        values, checks = [], []
        for i, (a, kind) in enumerate(zip(names, kinds, strict=True)):
            if kind == "bytes":  # the size of an array or a struct scalar is not its type's
                checks.append(f"    if {a}.nbytes != {args[i].nbytes} or {a}.size != 1:\n"
                              f"        raise blob_mismatch(name, {i}, {args[i].nbytes}, {a})\n")
            values.append({"value": a, "pointer": f"{a}.data.ptr", "bytes": f"{a}.tobytes()",
                           "null": "0"}[kind])
        unpack = f"    {', '.join(names)}, = args\n" if n else ""
        same = " or ".join(f"type({a}) is not t{i}" for i, a in enumerate(names)) or "False"
        self.source = (f"def pack(buffer, args):\n"
                       f"    if len(args) != {n}:\n        return False\n{unpack}"
                       f"    if {same}:\n        return False\n{''.join(checks)}"
                       f"    pack_into(buffer, {start}, {', '.join(values)})\n"
                       f"    return True\n")
        scope = {f"t{i}": t for i, t in enumerate(self.types)}
        scope.update(name=name, pack_into=self.struct.pack_into, blob_mismatch=_blob_mismatch)
        exec(self.source, scope)  # noqa: S102 - our own text, of type names and numbers only
        self.pack = scope["pack"]


class _NoPlan:
    """The plan a kernel starts with: it takes no arguments, so the first launch makes one."""

    @staticmethod
    def pack(buffer, args) -> bool:
        return False


def _parameters_start(count: int) -> int:
    """Where a kernel's values start in a launch buffer: after ``kernelParams``, its
    ``count`` pointers, rounded up to 16 bytes (the widest alignment a parameter takes)."""
    return -(-8 * count // 16) * 16


def _pack_plan(name: str, layout, args, device_array: type) -> _Plan:
    """How ``args`` are packed for a kernel ``name`` whose parameters lie at ``layout``
    (``(offset, size)`` in bytes each), or :class:`KernelArgumentError` naming the first value
    that does not fit its parameter.

    ``device_array`` (``cupy.ndarray``) values are passed as their 8-byte device pointers.
    """
    import numpy as np

    if len(args) != len(layout):
        raise KernelArgumentError(
            f"kernel {name} takes {len(layout)} arguments (its compiled parameters, of "
            f"{', '.join(str(s) for _, s in layout) or 'no'} bytes), got {len(args)}: "
            f"({', '.join(_type_name(a) for a in args)}); pass one value per parameter")
    codes, kinds = [], []
    for i, (value, (_, size)) in enumerate(zip(args, layout, strict=True)):
        kind = "value"
        if isinstance(value, device_array):
            if size != 8:
                raise _mismatch(name, i, size, value, "passed as its 8-byte device pointer")
            code, kind = "Q", "pointer"
        elif isinstance(value, np.ndarray) and value.size != 1:
            raise _not_a_struct(name, i, size, value)
        elif isinstance(value, (np.ndarray, np.generic)):
            if value.dtype.kind not in "biufcV":  # text, dates, objects: no C value
                raise _unsupported(name, i, size, value)
            if value.nbytes != size:
                raise _mismatch(name, i, size, value)
            code = _NUMPY_CODES.get((value.dtype.kind, size))
            if code is None or isinstance(value, np.ndarray):
                code, kind = f"{size}s", "bytes"  # a struct, or a complex number: its bytes
        elif value is None:  # a null pointer, as CuPy passes it
            code, kind = ("Q" if size == 8 else None), "null"
        elif isinstance(value, bool):
            code = "?" if size == 1 else None
        elif isinstance(value, int):
            code = _INT_CODES.get(size)
        elif isinstance(value, float):
            code = _FLOAT_CODES.get(size)
        else:
            raise _unsupported(name, i, size, value)
        if code is None:
            raise _mismatch(name, i, size, value)
        codes.append(code)
        kinds.append(kind)
    return _Plan(name, [offset for offset, _ in layout], _parameters_start(len(layout)), args,
                 codes, kinds)


# struct codes, in standard sizes ("<"): Python ints are signed, floats by the parameter's size
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT_CODES = {4: "f", 8: "d"}
_NUMPY_CODES = {("b", 1): "?", ("i", 1): "b", ("u", 1): "B", ("i", 2): "h", ("u", 2): "H",
                ("f", 2): "e", ("i", 4): "i", ("u", 4): "I", ("f", 4): "f", ("i", 8): "q",
                ("u", 8): "Q", ("f", 8): "d"}
# the C types a parameter of each size may hold, for messages
_TYPES_OF_SIZE = {1: "numpy.int8, numpy.uint8, numpy.bool_ or bool",
                  2: "numpy.int16, numpy.uint16 or numpy.float16",
                  4: "numpy.int32, numpy.uint32, numpy.float32, or a Python int or float",
                  8: "a CuPy array (a pointer), numpy.int64, numpy.uint64, numpy.float64, or a "
                     "Python int or float"}
_MAX_PLANS = 32


def _type_name(value) -> str:
    """``value``'s type as messages write it (a NumPy value's size too)."""
    t = type(value)
    if t.__module__ == "builtins":
        return t.__qualname__
    name = f"{t.__module__}.{t.__qualname__}"
    return f"{name} of {value.nbytes} bytes" if t.__module__ == "numpy" else name


def _mismatch(name, i, size, value, how="") -> KernelArgumentError:
    accepted = _TYPES_OF_SIZE.get(size, f"a NumPy array or scalar of {size} bytes (a struct)")
    return KernelArgumentError(
        f"kernel {name}: argument {i} is a {_type_name(value)}{', ' + how if how else ''}, but "
        f"parameter {i} of the compiled function is {size} bytes; pass a value of the "
        f"parameter's C type ({accepted})")


def _blob_mismatch(name, i, size, value) -> KernelArgumentError:
    if value.size != 1:
        return _not_a_struct(name, i, size, value)
    return _mismatch(name, i, size, value)


def _not_a_struct(name, i, size, value) -> KernelArgumentError:
    return KernelArgumentError(
        f"kernel {name}: argument {i} is a numpy.ndarray of {value.size} elements (shape "
        f"{value.shape}); only a one-element NumPy array, a struct, is passed by value (parameter "
        f"{i} is {size} bytes); for device memory pass a CuPy array (cupy.asarray)")


def _unsupported(name, i, size, value) -> KernelArgumentError:
    return KernelArgumentError(
        f"kernel {name}: argument {i} is a {_type_name(value)}, which a launch cannot pass "
        f"(parameter {i} is {size} bytes); pass a CuPy array (as its device pointer), a NumPy "
        f"scalar, a Python int, float or bool, or a NumPy array (a struct, by value)")


def _out_of_range(name, layout, args) -> KernelArgumentError:
    """The error for a Python int or float that its parameter cannot hold."""
    import numpy as np

    for i, (value, (_, size)) in enumerate(zip(args, layout, strict=True)):
        if type(value) is bool or not isinstance(value, (int, float)) or isinstance(
                value, np.generic):
            continue
        integer = isinstance(value, int)
        try:
            struct.pack("<" + (_INT_CODES if integer else _FLOAT_CODES)[size], value)
        except (struct.error, OverflowError):
            if integer:
                kind, fix = ("signed integer", f"pass a NumPy scalar of the parameter's C type "
                                               f"(numpy.uint{8 * size} for an unsigned one)")
            else:
                kind, fix = "float", "pass a value a float32 can hold"
            return KernelArgumentError(
                f"kernel {name}: argument {i}, the {type(value).__name__} {value!r}, does not "
                f"fit parameter {i}, a {size}-byte {kind}; {fix}")
    return KernelArgumentError(f"kernel {name}: the arguments could not be packed: "
                               f"({', '.join(_type_name(a) for a in args)})")


def _parameter_layout(param_info, handle, param_count=None) -> tuple[tuple[int, int], ...]:
    """``(offset, size)`` in bytes of each parameter of the compiled function ``handle``, as the
    driver's ``cuFuncGetParamInfo`` (``param_info``) reports them.

    Drivers with ``cuFuncGetParamCount`` (``param_count``) say how many there are; older ones
    are asked for parameter 0, 1, ... until they answer ``CUDA_ERROR_INVALID_VALUE``, past the
    last one (an API error that compute-sanitizer reports unless told not to).
    """
    layout: list[tuple[int, int]] = []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    count = None
    if param_count is not None:
        _ask(param_count, "cuFuncGetParamCount", handle, ctypes.byref(size))
        count = size.value
    while len(layout) < (_MAX_PARAMETERS + 1 if count is None else count):
        status = _ask(param_info, "cuFuncGetParamInfo", handle, len(layout), offset, size,
                      past_the_end=count is None)
        if status == _INVALID_VALUE:
            break
        layout.append((offset.value, size.value))
    end = 0
    for at, nbytes in layout:
        if nbytes == 0 or at < end:
            raise _NoLayout(f"the driver's cuFuncGetParamInfo gave parameters that overlap or are "
                            f"empty: {layout}")
        end = at + nbytes
    return tuple(layout)


def _ask(entry, name, *args, past_the_end=False) -> int:
    """``entry(*args)``'s status: 0, or ``CUDA_ERROR_INVALID_VALUE`` where ``past_the_end`` (a
    parameter index past the last one); a thread without a current context gets one first
    (``cudaFree(0)``, see :meth:`Kernel.__call__`); any other error is :class:`_NoLayout`."""
    status = entry(*args)
    if status == _INVALID_CONTEXT:
        cupy().cuda.runtime.free(0)
        status = entry(*args)
    if status and not (past_the_end and status == _INVALID_VALUE):
        raise _NoLayout(f"the driver's {name} failed with CUDA error {status}")
    return status


# a kernel's parameters take at most 32764 bytes (CUDA 12.1+), so at most that many of them
_MAX_PARAMETERS = 32764


def _function_handle(raw) -> int:
    """The ``CUfunction`` of ``cupy.RawKernel`` ``raw`` on the current device (compiling it).

    Not public CuPy API, and no public one exists: ``RawKernel.kernel`` is listed on CuPy's
    ``RawKernel`` page without a description, and the ``cupy.cuda.function.Function`` it
    returns, with its ``ptr``, is not in CuPy's reference. It is the least internal route (the
    same from CuPy 7 to 14); a CuPy without it makes the kernel launch through CuPy, counted.
    """
    try:
        return int(raw.kernel.ptr)
    except AttributeError as exc:
        version = getattr(imported("cupy"), "__version__", "?")
        raise _NoLayout(f"CuPy {version} gives no function handle (RawKernel.kernel.ptr: "
                        f"{exc})") from None


class _Driver:
    """The driver entry points a launch uses, or why they are ``missing``."""

    def __init__(self, hold=None, release=None, param_info=None, missing=None, param_count=None):
        self.hold, self.release, self.param_info, self.missing = (hold, release, param_info,
                                                                  missing)
        self.param_count = param_count  # cuFuncGetParamCount, where the driver has it


@functools.cache
def _driver() -> _Driver:
    """``cuLaunchKernel`` twice, through ``ctypes.PyDLL`` (the call keeps the GIL) and
    ``ctypes.CDLL`` (it releases it), and ``cuFuncGetParamInfo``, from the driver library
    ``libcuda.so.1``.

    ``cuLaunchKernel`` has no ``argtypes``: converting its eleven arguments through them costs
    more than the rest of a launch. :meth:`Kernel.__call__` passes each as its C type needs:
    the pointers (function, stream, parameters) as ``ctypes.c_void_p`` or None, the unsigned
    grid, block and shared-memory sizes as Python ints, which ctypes passes as C ints (the same
    bits below 2**31; a larger value raises). ``cuFuncGetParamInfo``, called once per compiled
    function, has them.
    """
    try:
        held, released = ctypes.PyDLL("libcuda.so.1"), ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return _Driver(missing=f"the CUDA driver library libcuda.so.1 was not found ({exc})")
    hold, release = held.cuLaunchKernel, released.cuLaunchKernel
    hold.restype = release.restype = ctypes.c_int
    try:
        info = released.cuFuncGetParamInfo
    except AttributeError:
        return _Driver(hold, release, missing=(
            f"the CUDA driver ({_driver_version(released)}) has no cuFuncGetParamInfo, which "
            f"came with CUDA 12.4 (driver 550); update the NVIDIA driver"))
    info.restype = ctypes.c_int
    size_p = ctypes.POINTER(ctypes.c_size_t)
    info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, size_p, size_p]
    # newer drivers say how many parameters a function has: then no query past the last one
    count = getattr(released, "cuFuncGetParamCount", None)
    if count is not None:
        count.restype = ctypes.c_int
        count.argtypes = [ctypes.c_void_p, size_p]
    return _Driver(hold, release, info, param_count=count)


def _driver_version(driver) -> str:
    version = ctypes.c_int()
    if driver.cuDriverGetVersion(ctypes.byref(version)):
        return "version unknown"
    return f"CUDA {version.value // 1000}.{version.value % 1000 // 10}"


def _on_distributed_worker() -> bool:
    """Whether this thread runs a Dask ``distributed`` worker's task (never imports
    ``distributed``: a process that has not imported it runs no worker)."""
    distributed = imported("distributed")  # a half-imported one runs no worker yet
    if distributed is None:
        return False
    try:
        distributed.get_worker()
    except (ValueError, AttributeError):  # no worker here; a distributed without get_worker
        return False
    return True


_THREAD = threading.local()  # .holds: LAUNCH_HOLDS_GIL = "auto"'s answer for this thread


def _auto_holds_gil() -> bool:
    """Whether ``LAUNCH_HOLDS_GIL = "auto"`` holds the GIL on this thread (decided once)."""
    try:
        return _THREAD.holds
    except AttributeError:
        _THREAD.holds = holds = not _on_distributed_worker()
        return holds


def launch_holds_gil() -> bool:
    """Whether a :class:`Kernel` launched from this thread now holds the GIL
    (:data:`LAUNCH_HOLDS_GIL`, ``"auto"`` decided for this thread)."""
    setting = LAUNCH_HOLDS_GIL
    return _auto_holds_gil() if setting == "auto" else bool(setting)


# ctypes' stream argument for each stream handle a launch has seen (0, the null stream: NULL).
# Keyed by the handle, never by which stream is current, which a launch asks CuPy each time:
# it changes per thread and with every ``with stream:``.
_STREAMS: dict[int, ctypes.c_void_p | None] = {0: None}


def _stream_argument(ptr: int):
    if len(_STREAMS) > 64:  # streams come and go; their handles are not worth keeping
        _STREAMS.clear()
    arg = _STREAMS[ptr] = ctypes.c_void_p(ptr) if ptr else None
    return arg


_INVALID_VALUE = 1  # CUDA_ERROR_INVALID_VALUE
_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT

# Launch counts. Driver launches: next() on an itertools.count is atomic, and cheap enough for
# every launch; launch_counts() reads it by drawing a number too, and subtracts its draws.
_DRIVER_LAUNCHES = itertools.count()
_COUNT_READS = 0
_CUPY_LAUNCHES: dict[str | None, int] = {}  # by fallback reason; None: LAUNCH_THROUGH_CUPY
_COUNTS_LOCK = threading.Lock()


def launch_counts() -> dict:
    """How many :class:`Kernel` launches this process made, since it started.

    Returns
    -------
    dict
        ``{"driver": n, "cupy": m, "fallback_reasons": {reason: count}}``: launches through
        the driver (chunkernels' own), through CuPy's ``RawKernel`` (fallbacks and
        :data:`LAUNCH_THROUGH_CUPY` alike), and the fallbacks among those by reason.
    """
    global _COUNT_READS
    with _COUNTS_LOCK:
        driver = next(_DRIVER_LAUNCHES) - _COUNT_READS
        _COUNT_READS += 1
        through_cupy = sum(_CUPY_LAUNCHES.values())
        reasons = {reason: n for reason, n in _CUPY_LAUNCHES.items() if reason is not None}
    return {"driver": driver, "cupy": through_cupy, "fallback_reasons": reasons}


def _note_cupy_launch(reason: str | None, name: str) -> None:
    """Count a launch through CuPy; a fallback (``reason``) is warned once per reason, or
    raises where :data:`FALLBACK_ENV` says ``error``."""
    if reason is not None:
        policy = os.environ.get(FALLBACK_ENV, "warn").strip().lower()
        if policy == "error":
            raise LaunchFallbackError(
                f"kernel {name} would launch through CuPy's RawKernel, not chunkernels' driver "
                f"launch: {reason}. {FALLBACK_ENV}=error forbids it (the test suite sets it); "
                f"unset it to launch through CuPy, counted in chunkernels.cuda.launch_counts()")
        if policy not in ("warn", ""):
            raise ValueError(f"{FALLBACK_ENV}={policy!r} is not understood; use warn (the "
                             f"default) or error")
    with _COUNTS_LOCK:
        _CUPY_LAUNCHES[reason] = seen = _CUPY_LAUNCHES.get(reason, 0) + 1
    if reason is not None and seen == 1:
        warnings.warn(f"chunkernels kernels launch through CuPy's RawKernel: {reason}. They run "
                      f"correctly, with CuPy's argument conversion and without holding the GIL; "
                      f"chunkernels.cuda.launch_counts() counts them", LaunchFallbackWarning,
                      stacklevel=4)


@functools.lru_cache(maxsize=64)
def cuda_type(dtype) -> str:
    """The CUDA C++ type name of a NumPy dtype (cached: every launch asks)."""
    import numpy as np

    try:
        return _CUDA_TYPES[np.dtype(dtype).name]
    except KeyError:
        raise TypeError(f"no CUDA type for dtype {np.dtype(dtype).name}") from None


_CUDA_TYPES = {
    "float32": "float", "float64": "double",
    "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
    "uint64": "unsigned long long", "bool": "bool",
}
