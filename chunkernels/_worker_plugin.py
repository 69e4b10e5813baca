"""What chunkernels sets up on the workers of the clusters it starts or tunes
(:func:`chunkernels.cluster.client`, :func:`chunkernels.cluster.tune_gpu_workers`).

Imports ``distributed``: imported only where a cluster is set up.
"""

from __future__ import annotations

import functools
import sys

from distributed import WorkerPlugin


class SwitchInterval(WorkerPlugin):
    """Sets the worker process's thread switch interval (:func:`sys.setswitchinterval`) when
    the worker starts, and again on every worker that joins or is restarted later."""

    name = "chunkernels-switch-interval"

    def __init__(self, seconds: float):
        self.seconds = seconds

    def setup(self, worker) -> None:
        sys.setswitchinterval(self.seconds)


class CPUWorkers(WorkerPlugin):
    """Marks the workers of a CPU cluster (``chunkernels.cluster.client(gpus=0)``, or one
    started where no GPU is visible): on a host with GPUs they see them too (a worker of threads
    is this process), but they were asked for as CPU workers, and the library makes and
    describes their data as NumPy. Also on workers that join or restart later."""

    name = "chunkernels-cpu-workers"


class NumbaOnCuPyPool(WorkerPlugin):
    """Has Numba allocate its device memory from CuPy's memory pool on a GPU worker whose CuPy
    allocates from its default pool (:func:`share_cupy_pool_with_numba`), when the worker
    starts and on every worker that joins or is restarted later."""

    name = "chunkernels-numba-on-cupy-pool"

    def setup(self, worker) -> None:
        share_cupy_pool_with_numba()


def share_cupy_pool_with_numba() -> bool:
    """Make Numba, in this process, allocate device memory from CuPy's memory pool; whether it
    now does.

    Without RMM, Dask moves a CuPy array onto a GPU through Numba (a block read back from host
    memory after dask-cuda spilled it, or received from another worker): one ``cuMemAlloc``
    each, outside CuPy's pool. The device memory that spilling frees goes back to CuPy's pool,
    which keeps it, so Numba's allocation fails (``CUDA_ERROR_OUT_OF_MEMORY``) while the pool
    holds gigabytes it no longer uses: a one-GPU run of an array larger than the GPU failed so
    on an H100. Through the pool, such an allocation reuses those bytes, and where the device is
    truly full it fails with :class:`~chunkernels.GPUOutOfMemoryError`, which names the fixes.

    Nothing changes where Numba or CuPy is missing, where CuPy allocates elsewhere (RMM, which
    Dask then uses itself), or for a Numba context made before this call (a memory manager is
    bound to a context when it is made)."""
    import importlib.util

    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("cupy") is None:
        return False
    import cupy

    if cupy.cuda.get_allocator() != cupy.get_default_memory_pool().malloc:
        return False
    from numba import cuda as numba_cuda

    numba_cuda.set_memory_manager(_numba_manager())
    return True


@functools.cache
def _numba_manager():
    """The Numba External Memory Management plugin class that allocates from CuPy's pool (made
    on first use: it derives from Numba's classes)."""
    import ctypes

    import cupy
    from numba import cuda as numba_cuda

    from chunkernels._errors import GPUOutOfMemoryError

    class CuPyPoolMemoryManager(numba_cuda.GetIpcHandleMixin,
                                numba_cuda.HostOnlyCUDAMemoryManager):
        """Device memory from CuPy's current pool, given back to it when Numba drops the
        buffer; host memory as Numba manages it."""

        def initialize(self):
            # the host allocations' deferred frees are flushed against the device's size,
            # as under Numba's own manager
            self.deallocations.memory_capacity = self.get_memory_info().total

        def memalloc(self, size):
            device = self.context.device.id
            with cupy.cuda.Device(device):
                try:
                    memory = cupy.cuda.alloc(size)
                except cupy.cuda.memory.OutOfMemoryError as exc:
                    from dask.utils import format_bytes

                    free, total = cupy.cuda.runtime.memGetInfo()
                    held = cupy.get_default_memory_pool().used_bytes()
                    raise GPUOutOfMemoryError(
                        f"out of device memory on GPU {device} while Dask moved a block of "
                        f"{format_bytes(size)} onto it (read back after dask-cuda spilled it to "
                        f"host memory, or received from another worker): {format_bytes(free)} "
                        f"free of {format_bytes(total)}, {format_bytes(held)} held by CuPy's "
                        f"arrays. Use more GPUs (chunkernels.cluster.client(gpus=N)), smaller "
                        f"chunks, or let dask-cuda spill sooner (client(..., "
                        f"device_memory_limit='60%'))") from exc
            return numba_cuda.MemoryPointer(self.context, ctypes.c_void_p(memory.ptr), size,
                                            finalizer=_holding(memory))

        def get_memory_info(self):
            free, total = cupy.cuda.runtime.memGetInfo()
            return numba_cuda.MemoryInfo(free=free + cupy.get_default_memory_pool().free_bytes(),
                                         total=total)

        @property
        def interface_version(self):
            return 1

    return CuPyPoolMemoryManager


def _holding(memory):
    """A finalizer that keeps CuPy's ``memory`` until Numba calls it, then lets it go back to
    the pool."""
    def release():
        nonlocal memory
        memory = None

    return release
