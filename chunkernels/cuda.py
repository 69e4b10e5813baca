"""Lazy access to CUDA: CuPy is imported on first use and kernels compile on first launch.

Nothing here runs at ``import chunkernels``: no CuPy import, no CUDA context. Compiled kernels are
cached per device, keyed by everything that changes the generated code (kernel name, C++ name
expression); launch geometry and array sizes are runtime arguments, so uneven edge chunks never
trigger a recompile.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
import threading
from pathlib import Path
from typing import Any

from chunkernels._imports import imported

#: NVRTC options every chunkernels kernel is compiled with. They belong to the library: users
#: cannot pass compiler options, so a kernel behaves the same wherever it is compiled.
COMPILE_OPTIONS = ("--std=c++17",)

_FUNCTIONS: dict[tuple[int, str, str], Any] = {}
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
    from chunkernels._registry import get

    if kernel.endswith(".cu"):
        return _inline_includes(source_dir() / kernel)
    spec = get(kernel)
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
    :class:`Kernel` (launched like ``cupy.RawKernel``, holding the GIL).

    Compiles on first use for the current device and caches the result per device, so a Dask
    worker bound to GPU 3 compiles and runs on GPU 3. ``name_expression`` is a kernel entry name
    or a C++ template instantiation such as ``"broadcast_add<float, float, float, int, 2, 4>"``.
    ``kernel`` may also name a library source file (``"halo_gather.cu"``, see :func:`source`).
    """
    cp = cupy()
    key = (cp.cuda.runtime.getDevice(), kernel, name_expression)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        with _COMPILE_LOCK:
            fn = _FUNCTIONS.get(key)
            if fn is None:
                module = cp.RawModule(code=source(kernel), options=COMPILE_OPTIONS,
                                      name_expressions=[name_expression])
                fn = _FUNCTIONS[key] = Kernel(module.get_function(name_expression))
    return fn


def forget(kernel: str) -> None:
    """Drop compiled functions of ``kernel`` on every device (its source may have changed)."""
    with _COMPILE_LOCK:
        for key in [k for k in _FUNCTIONS if k[1] == kernel]:
            del _FUNCTIONS[key]


class Kernel:
    """A compiled CUDA function on one device, launched like ``cupy.RawKernel``:
    ``kernel(grid, block, args, shared_mem=0)`` on the current CuPy stream.

    The launch holds the GIL. CuPy's releases it around ``cuLaunchKernel``, a call of a few
    microseconds that does not block; under Dask's threaded scheduler every such release lets
    another worker thread take the GIL, and the launching thread then waits to be woken to take
    it back: per launch a thread wake-up, tens of microseconds on a busy host, against a launch
    of a few. Holding the GIL for the call keeps a task's launches back to back.

    The arguments are packed into a buffer after the pointers to them that ``cuLaunchKernel``
    takes, in the layout the first launch's arguments give (a compiled function's parameters
    do not change): device arrays as their pointers, NumPy arrays as structs passed by value,
    NumPy scalars, and Python ints and floats, as CuPy passes them. A later scalar of another
    width is packed at the first launch's, the parameter's. Arguments of other kinds (at the
    first launch: from then on; later: for that launch), a driver library not found under its
    Linux name, or :data:`LAUNCH_HOLDS_GIL` set false: CuPy launches.
    """

    __slots__ = ("raw", "_ptr", "_packer", "_stream", "_launch")

    def __init__(self, raw):
        self.raw = raw
        self._ptr = ctypes.c_void_p(raw.kernel.ptr)
        self._stream = _current_stream_ptr()
        self._launch = _driver_launch()
        self._packer = _UNSEEN  # made at the first launch

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.raw.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, nbytes: int) -> None:
        self.raw.max_dynamic_shared_size_bytes = nbytes

    def __call__(self, grid, block, args, shared_mem=0):
        packer = self._packer
        if packer is _UNSEEN:
            packer = self._packer = _Packer.of(args) if self._launch is not None else None
        if packer is None or not LAUNCH_HOLDS_GIL:
            return self.raw(grid, block, args, shared_mem=shared_mem)
        try:
            values = list(args)
            for i in packer.arrays:
                values[i] = values[i].data.ptr
            for i, nbytes in packer.blobs:
                if values[i].nbytes != nbytes:
                    raise ValueError("a struct of another size")
                values[i] = values[i].tobytes()
            try:
                buffer, at = packer.local.slot
            except AttributeError:
                buffer, at = packer.buffer()
            packer.values.pack_into(buffer, packer.start, *values)
        except (AttributeError, TypeError, ValueError, struct.error):
            # not the first launch's kinds of arguments: CuPy passes them as it does
            return self.raw(grid, block, args, shared_mem=shared_mem)
        launch = self._launch
        grid, block = (*grid, 1, 1), (*block, 1, 1)
        stream = self._stream() or None  # None: the null stream (NULL)
        if stream is not None:
            stream = ctypes.c_void_p(stream)
        status = launch(self._ptr, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                        shared_mem, stream, at, None)
        if status == _INVALID_CONTEXT:
            # a thread that has made no CUDA runtime call has no current context yet (CuPy
            # makes one for each launch); cudaFree(0) makes the device's the current one
            cupy().cuda.runtime.free(0)
            status = launch(self._ptr, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                            shared_mem, stream, at, None)
        if status:
            raise cupy().cuda.driver.CUDADriverError(status)


#: Whether :class:`Kernel` launches hold the GIL (see there); false launches through CuPy.
#: The environment variable ``CHUNKERNELS_LAUNCH_HOLDS_GIL=0`` sets it false in every process
#: that imports chunkernels (Dask workers included).
LAUNCH_HOLDS_GIL = os.environ.get("CHUNKERNELS_LAUNCH_HOLDS_GIL", "1").lower() not in (
    "0", "false", "no", "off")


class _Packer:
    """How :class:`Kernel` passes arguments of struct ``codes``: a buffer per thread holding
    ``cuLaunchKernel``'s ``kernelParams`` (a pointer to each argument, written once) followed by
    the arguments, each at its C alignment and size (``values``, from ``start``; the driver
    copies each from its pointer to where the kernel's parameters lie). Device arrays (at
    positions ``arrays``) are passed as their pointers, NumPy arrays (``blobs``: positions and
    sizes) by value as their bytes, as CuPy passes a struct argument."""

    __slots__ = ("values", "arrays", "blobs", "start", "offsets", "local")

    @classmethod
    def of(cls, args):
        """The packer of arguments of the types of ``args``, or None if one is of a type it does
        not pack (anything but CuPy arrays, NumPy arrays passed by value, NumPy integer, float
        and bool scalars, ints and floats)."""
        import numpy as np

        cp = cupy()
        codes, arrays, blobs = [], [], []
        for i, (a, t) in enumerate(zip(args, map(type, args))):
            if issubclass(t, cp.ndarray):
                codes.append("P")
                arrays.append(i)
            elif t is np.ndarray:  # a struct passed by value, as its bytes
                codes.append(f"{a.nbytes}s")
                blobs.append((i, a.nbytes))
            elif t in _SCALAR_CODES:
                codes.append(_SCALAR_CODES[t])
            elif issubclass(t, np.generic) and np.dtype(t).char in "bBhHiIlLqQfd?":
                codes.append(np.dtype(t).char)
            else:
                return None
        return cls(codes, arrays, blobs)

    def __init__(self, codes, arrays, blobs):
        self.values = struct.Struct("@" + "".join(codes))
        self.arrays = tuple(arrays)
        self.blobs = tuple(blobs)
        self.start = 8 * len(codes)  # the pointers; 8-aligned, so every argument stays aligned
        # where argument i lies: struct aligns each field as C does
        self.offsets = tuple(self.start + struct.calcsize("@" + "".join(codes[:i + 1])) -
                             struct.calcsize("@" + codes[i]) for i in range(len(codes)))
        self.local = threading.local()  # .slot: this thread's (buffer, its address)

    def buffer(self) -> tuple:
        """A new buffer for this thread, its pointers written, and its address (a
        ``ctypes.c_void_p``); kept as ``local.slot``."""
        buffer = ctypes.create_string_buffer(self.start + self.values.size)
        at = ctypes.addressof(buffer)
        for i, offset in enumerate(self.offsets):
            ctypes.c_void_p.from_address(at + 8 * i).value = at + offset
        self.local.slot = buffer, ctypes.c_void_p(at)
        return self.local.slot


_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT

# as CuPy passes Python scalars: int as long long, float as double
_SCALAR_CODES = {int: "q", float: "d"}
_UNSEEN = object()


def _current_stream_ptr():
    """A function giving the current CuPy stream's handle: CuPy's own (what its launches call),
    else one through ``get_current_stream``."""
    cp = cupy()
    ptr = getattr(getattr(cp.cuda, "stream", None), "get_current_stream_ptr", None)
    if ptr is not None:
        return ptr
    current = cp.cuda.get_current_stream
    return lambda: current().ptr


@functools.cache
def _driver_launch():
    """``cuLaunchKernel`` called through ``ctypes.PyDLL`` (which keeps the GIL), or None where
    the driver library is not found under its Linux name.

    No ``argtypes``: converting eleven arguments through them costs more than the rest of a
    launch. The pointers (function, stream, parameters) are passed as ``ctypes.c_void_p`` or
    None, the unsigned grid, block and shared-memory sizes as Python ints, which ctypes passes
    as C ints: the same bits for values below 2**31."""
    try:
        driver = ctypes.PyDLL("libcuda.so.1")
    except OSError:
        return None
    launch = driver.cuLaunchKernel
    launch.restype = ctypes.c_int
    return launch


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
