"""Run one kernel on one block: NumPy blocks take the CPU reference, CuPy blocks the GPU path."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkernels import cuda
from chunkernels._errors import CPUFallbackWarning, UnsupportedBlockError
from chunkernels._registry import KernelSpec


def run_block(spec: KernelSpec, x, operands: Sequence[Any] = (),
              params: Mapping[str, Any] | None = None, *, strict: bool = False):
    """Compute kernel ``spec`` on block ``x`` (and its operand blocks); same array type out.

    A 0-size block (Dask's meta inference passes them, with the original strides) returns an
    empty result without launching anything. For a reduction kernel the result is the block's
    partial statistics (``spec.partial`` on the CPU, ``spec.gpu`` on the device). A block the GPU path refuses (``spec.check_block``)
    is computed by the CPU reference with a :class:`CPUFallbackWarning`, or raises
    :class:`UnsupportedBlockError` under ``strict=True``.
    """
    params = params or {}
    gpu = cuda.is_cupy_array(x)
    xp = cuda.cupy() if gpu else np
    reduction = spec.kind == "reduction"
    cpu = spec.partial if reduction else spec.cpu
    if x.size == 0 and not reduction:
        dtype = spec.out_dtype(x.dtype, [o.dtype for o in operands], params)
        return xp.empty(x.shape, dtype=dtype)
    if not gpu:
        return np.asarray(cpu(x, *(_to_host(o) for o in operands), **params))

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
            return xp.asarray(host)
        if spec.contiguous:  # the spec says its kernel needs C order: the copy is deliberate
            x = xp.ascontiguousarray(x)
            operands = tuple(xp.ascontiguousarray(o) for o in operands)
        return spec.gpu(x, *operands, **params)


def _to_host(a):
    return a.get() if cuda.is_cupy_array(a) else np.asarray(a)
