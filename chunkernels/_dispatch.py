"""Run one kernel on one block: NumPy blocks take the CPU reference, CuPy blocks the GPU path."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkernels import cuda
from chunkernels._errors import (
    CPUFallbackWarning,
    GPUOutOfMemoryError,
    KernelResultError,
    UnsupportedBlockError,
)
from chunkernels._registry import KernelSpec, get


def run_block(spec: KernelSpec | str, x, operands: Sequence[Any] = (),
              params: Mapping[str, Any] | None = None, *, strict: bool = False,
              out_dtype=None):
    """Compute kernel ``spec`` on block ``x`` (and its operand blocks); same array type out.

    A 0-size block (Dask's meta inference passes them, with the original strides) returns an
    empty result without launching anything. For a reduction kernel the result is the block's
    partial statistics (``spec.partial`` on the CPU, ``spec.gpu`` on the device). A block the
    GPU path refuses (``spec.check_block``) is computed by the CPU reference with a
    :class:`CPUFallbackWarning`, or raises :class:`UnsupportedBlockError` under
    ``strict=True``. A GPU path that runs out of device memory raises
    :class:`GPUOutOfMemoryError`, which says how much the block needed and how to chunk smaller.

    Every result but a reduction's partials is checked against what the spec declares: the
    shape ``spec.out_shape(x.shape, params)`` and the dtype ``out_dtype`` (the dtype the caller
    declared for the result, ``spec.out_dtype`` of the inputs by default; callers that run many
    blocks pass it, worked out once). A result that differs raises :class:`KernelResultError`.
    ``spec`` may be a registered kernel's name.
    """
    if isinstance(spec, str):
        spec = get(spec)
    elif not isinstance(spec, KernelSpec):
        raise TypeError(f"run_block takes a KernelSpec or a registered kernel's name; got "
                        f"{type(spec).__name__} {spec!r}")
    if not isinstance(operands, (tuple, list)):
        raise TypeError(f"run_block: operands must be a tuple of the operand blocks, e.g. (y,); "
                        f"got {type(operands).__name__}")
    if not (hasattr(x, "dtype") and hasattr(x, "shape")):
        raise TypeError(f"run_block takes a NumPy or CuPy block; got {type(x).__name__}: "
                        f"convert it first, e.g. numpy.asarray(x)")
    params = params or {}
    gpu = cuda.is_cupy_array(x)
    xp = cuda.cupy() if gpu else np
    reduction = spec.kind == "reduction"
    cpu = spec.partial if reduction else spec.cpu
    if x.size == 0 and not reduction:
        dtype = spec.out_dtype(x.dtype, [o.dtype for o in operands], params)
        return xp.empty(x.shape, dtype=dtype)
    if not gpu:
        result = np.asarray(cpu(x, *(cuda.to_host(o) for o in operands), **params))
        if reduction:
            return result
        return _checked(spec, "CPU reference", result, x, operands, params, out_dtype)

    with x.device:
        operands = tuple(o if cuda.is_cupy_array(o) else xp.asarray(o) for o in operands)
        ok, reason = spec.check_block(x, *operands, **params)
        if not ok:
            if strict:
                raise UnsupportedBlockError(
                    f"{spec.name}: the GPU path refuses this block of shape {x.shape}: {reason}. "
                    f"Convert the input to what it takes, or pass strict=False to compute such "
                    f"blocks with the CPU reference (a host round trip per block)"
                )
            warnings.warn(
                f"{spec.name}: {reason}; computing this block of shape {x.shape} with the CPU "
                f"reference (copies it to the host and back)",
                CPUFallbackWarning,
                stacklevel=3,
            )
            host = cpu(xp.asnumpy(x), *(xp.asnumpy(o) for o in operands), **params)
            if reduction:
                return xp.asarray(host)
            return _checked(spec, "CPU reference", xp.asarray(host), x, operands, params,
                            out_dtype)
        try:
            if spec.contiguous:  # the spec says its kernel needs C order: the copy is deliberate
                x = xp.ascontiguousarray(x)
                operands = tuple(xp.ascontiguousarray(o) for o in operands)
            result = spec.gpu(x, *operands, **params)
        except MemoryError as exc:  # CuPy's OutOfMemoryError and RMM's bad_alloc both are
            failure = f"{type(exc).__name__}: {exc}"
        else:
            if reduction:
                return result
            return _checked(spec, "GPU dispatch", result, x, operands, params, out_dtype)
        # raised outside the except block, so that no frame of the failed launch (and none of
        # its device buffers) stays referenced from the error while it travels to the client
        raise out_of_memory_error(spec.name, x.shape, x.dtype, x.device,
                                  spec.depth(x.ndim, params), failure)


def finalize(spec: KernelSpec, params: Mapping[str, Any], dtypes, partials):
    """A reduction kernel's result from its blocks' partial statistics: the rows stacked (on
    their device) and combined by ``spec.finalize``."""
    xp = cuda.array_module(partials[0])
    stats = xp.concatenate([xp.asarray(p).reshape(-1, p.shape[-1]) for p in partials])
    return xp.asarray(spec.finalize(stats, dtypes, **params))


def _checked(spec: KernelSpec, path: str, result, x, operands, params, out_dtype):
    """``result`` of ``spec`` on block ``x`` when it has the declared shape and dtype; else a
    :class:`KernelResultError` naming both. Cheap: attribute reads and two comparisons, the
    expected shape worked out only for kernels that declare ``result_shape``."""
    shape = getattr(result, "shape", None)
    dtype = getattr(result, "dtype", None)
    want_shape = x.shape if spec.result_shape is None else spec.out_shape(x.shape, params)
    if out_dtype is None:
        out_dtype = spec.out_dtype(x.dtype, [o.dtype for o in operands], params)
    if shape == want_shape and dtype == out_dtype:
        return result
    if shape is None or dtype is None:
        got = f"a {type(result).__module__}.{type(result).__qualname__}, not an array"
    else:
        got = f"shape {tuple(shape)} {dtype}"
    raise KernelResultError(
        f"kernel {spec.name!r}: its {path} returned {got} for a block of shape {x.shape} "
        f"{x.dtype}, where the kernel's spec declares shape {tuple(want_shape)} "
        f"{np.dtype(out_dtype)} (the Dask array is built with what the spec declares, so its "
        f"chunks would not match it). Make the {path} return that, or declare what it returns: "
        f"KernelSpec(result_dtype=..., result_shape=...)")


def out_of_memory_error(kernel: str, shape: tuple[int, ...], dtype, device, depth: Sequence,
                        failure: str) -> GPUOutOfMemoryError:
    """The error for a block of ``shape`` and ``dtype`` (its halo of ``depth`` included: per
    axis, an int for both sides or ``(before, after)``) that did not fit on CuPy device
    ``device``; ``failure`` is the allocator's ``"Type: message"``. Raise it outside the
    ``except`` block that caught the allocator's error, so that no frame of the failed work (and
    none of its device buffers) stays referenced from it."""
    error = GPUOutOfMemoryError(out_of_memory_message(
        kernel, shape, dtype, depth, device_memory(device), failure))
    error.failure = failure  # the allocator's words, for a caller that knows the halo better
    return error


def device_memory(device) -> dict[str, Any]:
    """What :func:`out_of_memory_message` says about CuPy device ``device``: its id, name, free
    and total bytes, the limit set on the CuPy memory pool in use (0: none) and whether that
    pool is CuPy's default one."""
    cp = cuda.cupy()
    with device:
        free, total = cp.cuda.runtime.memGetInfo()
        name = cp.cuda.runtime.getDeviceProperties(device.id)["name"].decode()
    pool = pool_in_use()
    return {"id": device.id, "name": name, "free": free, "total": total,
            "pool_limit": pool.get_limit(), "default_pool": pool is cp.get_default_memory_pool()}


def pool_in_use():
    """The CuPy memory pool allocations go to: the current allocator's when it is a pool's
    (``cupy.cuda.set_allocator(pool.malloc)``), else CuPy's default pool."""
    cp = cuda.cupy()
    pool = getattr(cp.cuda.get_allocator(), "__self__", None)
    return pool if isinstance(pool, cp.cuda.MemoryPool) else cp.get_default_memory_pool()


def out_of_memory_message(kernel: str, shape: tuple[int, ...], dtype, depth: Sequence,
                          device: Mapping[str, Any], failure: str) -> str:
    """The text of :class:`GPUOutOfMemoryError` for a block of ``shape`` and ``dtype``.

    ``depth`` is the halo the block includes per axis: an int for the same on both sides, or
    ``(before, after)`` where they differ (a block at the array's edge has neighbours on one
    side only). ``device`` is what :func:`device_memory` returns, ``failure`` the allocator's
    own message. The suggested chunking halves the block's core (its shape less the halo) along
    every axis longer than one element.
    """
    from dask.utils import format_bytes

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    sides = [(int(d), int(d)) if isinstance(d, int | np.integer) else tuple(map(int, d))
             for d in depth]
    halo = {a: s for a, s in enumerate(sides) if any(s)}
    with_halo = ("a Dask block includes the kernel's halo, " + " and ".join(
        f"{_halo_words(*s)} along axis {a}" for a, s in halo.items()) if halo
        else "the kernel has no halo")
    core = [max(1, n - sum(halo.get(a, (0, 0)))) for a, n in enumerate(shape)]
    smaller = tuple(c // 2 if c > 1 else c for c in core)
    halved = sum(c > 1 for c in core)
    setter = ("cupy.get_default_memory_pool().set_limit" if device.get("default_pool", True)
              else "the set_limit of the pool given to cupy.cuda.set_allocator")
    limit = (f"; CuPy's memory pool is limited to {format_bytes(device['pool_limit'])} "
             f"({setter})" if device.get("pool_limit") else "")
    advice = (f"Use chunks about half as long along each axis, e.g. x = x.rechunk({smaller}) "
              f"(1/{2 ** halved} of the memory per block), or " if halved else "")
    return (f"{kernel}: the GPU ran out of memory on a block of shape {tuple(shape)} "
            f"{dtype.name} ({format_bytes(nbytes)}; {with_halo}): {failure.rstrip('.')}. Device "
            f"{device['id']} ({device['name']}) has {format_bytes(device['free'])} free of "
            f"{format_bytes(device['total'])}{limit}. {advice}leave the kernel more device "
            f"memory: fewer tasks per GPU at once (one thread per GPU worker), an earlier spill "
            f"to host memory (dask-cuda's device_memory_limit), fewer arrays persisted on the GPU")


def _halo_words(before: int, after: int) -> str:
    if before == after:
        return f"{before} per side"
    if not before or not after:
        return f"{before or after} on one side"
    return f"{before} before and {after} after"

