"""The kind of array a call works on, decided once at its public entry and passed down.

Every public function is wrapped by :func:`chunkernels.interop.array_entry`, which unwraps
PyTorch tensors and xarray DataArrays and decides the :class:`ArrayKind` of the array inside:
NumPy, CuPy, or Dask of either. The layers below take that kind as an argument (``kind.dask``,
``kind.gpu``, ``kind.xp``, ``kind.meta(...)``) instead of asking the array again at every
step. Code that runs on one block inside a task still looks at its block: a task may meet a
block of another kind than its graph was built for (a CPU fallback, a worker without a GPU).

Nothing here imports CuPy or Dask: their arrays can only exist once the caller imported them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from chunkernels import cuda


def is_dask(a) -> bool:
    """Whether ``a`` is a Dask array (answered without importing Dask)."""
    return type(a).__module__.startswith("dask.") and hasattr(a, "chunks") and hasattr(a, "dask")


@dataclass(frozen=True)
class ArrayKind:
    """NumPy, CuPy, or a Dask array of NumPy or CuPy chunks: equal to one of :data:`NUMPY`,
    :data:`CUPY`, :data:`DASK_NUMPY`, :data:`DASK_CUPY`.

    Attributes
    ----------
    dask : bool
        A lazy, chunked Dask array.
    gpu : bool
        CuPy memory: the array, or each of its chunks.
    """

    dask: bool
    gpu: bool

    @staticmethod
    def of(a: Any) -> ArrayKind | None:
        """The kind of ``a``, or ``None`` when it is none of these arrays (a list, a scalar,
        another library's array)."""
        if isinstance(a, np.ndarray):
            return NUMPY
        if is_dask(a):
            return DASK_CUPY if cuda.is_cupy_array(a._meta) else DASK_NUMPY
        if cuda.is_cupy_array(a):
            return CUPY
        return None

    @property
    def xp(self):
        """The array module of the array, or of its chunks: ``numpy`` or ``cupy``."""
        return cuda.cupy() if self.gpu else np

    @property
    def chunks(self) -> ArrayKind:
        """The kind of the array's blocks: the in-memory kind (itself when not Dask)."""
        return CUPY if self.gpu else NUMPY

    def meta(self, dtype, ndim: int):
        """An empty array of the chunks' type: a Dask ``meta`` of ``dtype`` and ``ndim``."""
        return self.xp.empty((0,) * ndim, dtype=dtype)

    def to_host(self, a) -> np.ndarray:
        """``a``, of this kind, as one NumPy array: computed (Dask), copied from the device."""
        if self.dask:
            a = a.compute()
        return a.get() if self.gpu else np.asarray(a)

    def from_host(self, a):
        """NumPy ``a`` as an array of this kind: on the device (CuPy), one chunk (Dask)."""
        a = self.xp.asarray(a)
        if not self.dask:
            return a
        import dask.array as da

        return da.from_array(a, chunks=a.shape or (), asarray=False)

    def __repr__(self) -> str:
        chunks = "cupy" if self.gpu else "numpy"
        return f"ArrayKind(dask of {chunks})" if self.dask else f"ArrayKind({chunks})"


NUMPY = ArrayKind(dask=False, gpu=False)
CUPY = ArrayKind(dask=False, gpu=True)
DASK_NUMPY = ArrayKind(dask=True, gpu=False)
DASK_CUPY = ArrayKind(dask=True, gpu=True)
