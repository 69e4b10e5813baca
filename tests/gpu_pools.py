"""Capping CuPy's memory pool on a GPU worker or in this process, for the out-of-memory tests
(``tests/test_out_of_memory.py``, ``tests/test_gpu_faults.py``)."""

from __future__ import annotations

import gc


def limited_pool(extra: int) -> int:
    """Send CuPy's allocations to a new memory pool capped at ``extra`` bytes (until
    :func:`unlimited_pool`); returns the bytes it holds (none).

    A new pool, not the default one capped at what it holds: free parts of the default pool's
    chunks that something still lives in cannot be given back, and an allocation that fits one
    of them would not meet the cap (other tests in the process leave such parts)."""
    import cupy as cp

    cp.cuda.Device().synchronize()
    gc.collect()
    pool = cp.cuda.MemoryPool()
    pool.set_limit(size=extra)
    cp.cuda.set_allocator(pool.malloc)
    return pool.used_bytes()


def pool_used() -> int:
    from chunkernels._dispatch import pool_in_use

    gc.collect()  # an error's traceback holds the frames of the failed call until collected
    return pool_in_use().used_bytes()


def unlimited_pool() -> None:
    import cupy as cp

    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
