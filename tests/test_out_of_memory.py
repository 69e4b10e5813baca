"""A block that runs out of GPU memory: an error naming the block, its device and a smaller
chunking; the process (a Dask worker, say) goes on computing.

The message is built by a function of plain values, tested here without a GPU; the GPU tests
exhaust a small limit set on CuPy's memory pool, in this process and on a GPU worker.
"""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from distributed import wait

import chunkernels
from chunkernels import GPUOutOfMemoryError, cluster
from chunkernels._dispatch import out_of_memory_message
from chunkernels.testing import assert_close, random_array
from gpu_pools import limited_pool, pool_used, unlimited_pool

MiB = 2**20
H200 = {"id": 1, "name": "NVIDIA H200", "free": 3 * 2**30, "total": 140 * 2**30, "pool_limit": 0}
CUPY_FAILURE = ("OutOfMemoryError: Out of memory allocating 270,536,704 bytes (allocated so far: "
                "1,082,146,816 bytes).")


def test_message_names_kernel_block_device_and_a_smaller_chunking():
    msg = out_of_memory_message("gaussian_filter", (8224, 8224), "float32", (16, 16), H200,
                                CUPY_FAILURE)
    assert msg == (
        "gaussian_filter: the GPU ran out of memory on a block of shape (8224, 8224) float32 "
        "(258.00 MiB; a Dask block includes the kernel's halo, 16 per side along axis 0 and 16 "
        "per side along axis 1): OutOfMemoryError: Out of memory allocating 270,536,704 bytes "
        "(allocated so far: 1,082,146,816 bytes). Device 1 (NVIDIA H200) has 3.00 GiB free of "
        "140.00 GiB. Use chunks about half as long along each axis, e.g. x = x.rechunk((4096, "
        "4096)) (1/4 of the memory per block), or leave the kernel more device memory: fewer "
        "tasks per GPU at once (one thread per GPU worker), an earlier spill to host memory "
        "(dask-cuda's device_memory_limit), fewer arrays persisted on the GPU")


def test_message_for_a_pointwise_kernel_a_pool_limit_and_thin_axes():
    msg = out_of_memory_message("broadcast_add", (1, 6000, 5), np.float64, (0, 0, 0),
                                {**H200, "pool_limit": 64 * MiB}, "MemoryError: std::bad_alloc")
    assert "shape (1, 6000, 5) float64 (234.38 kiB; the kernel has no halo): MemoryError: " \
           "std::bad_alloc. Device 1" in msg
    assert "free of 140.00 GiB; CuPy's memory pool is limited to 64.00 MiB " \
           "(cupy.get_default_memory_pool().set_limit). " in msg
    assert "e.g. x = x.rechunk((1, 3000, 2)) (1/4 of the memory per block)" in msg
    own = out_of_memory_message("broadcast_add", (1, 6000, 5), np.float64, (0, 0, 0),
                                {**H200, "pool_limit": 64 * MiB, "default_pool": False}, "E")
    assert "limited to 64.00 MiB (the set_limit of the pool given to " \
           "cupy.cuda.set_allocator). " in own
    one = out_of_memory_message("k", (1, 1), "int8", (0, 0), H200, "MemoryError")
    assert "rechunk" not in one and ". Leave" not in one and "leave the kernel more" in one


def test_message_for_a_block_with_a_halo_on_one_side():
    """A block at the array's edge has neighbours on one side: its core is its shape less that
    side's halo alone, and the halo is described as it is."""
    msg = out_of_memory_message("gaussian_filter", (1040, 1040, 1060), "float32",
                                ((0, 16), (16, 0), (16, 20)), H200, "MemoryError")
    assert ("a Dask block includes the kernel's halo, 16 on one side along axis 0 and 16 on one "
            "side along axis 1 and 16 before and 20 after along axis 2)") in msg
    assert "e.g. x = x.rechunk((512, 512, 512))" in msg


def test_the_error_is_a_memory_error():
    assert issubclass(GPUOutOfMemoryError, MemoryError)
    assert chunkernels.GPUOutOfMemoryError is GPUOutOfMemoryError


def _warm_up() -> None:
    """Compile the filter and cache its weights on the device before any limit is measured."""
    import cupy as cp

    chunkernels.ndimage.gaussian_filter(cp.ones((64, 64), cp.float32), 4)
    cp.cuda.Device().synchronize()


OOM_2048 = (r"gaussian_filter: the GPU ran out of memory on a block of shape \(2048, 2048\) "
            r"float32 \(16\.00 MiB; a Dask block includes the kernel's halo, 16 per side along "
            r"axis 0 and 16 per side along axis 1\): OutOfMemoryError: Out of memory allocating "
            r".* CuPy's memory pool is limited to .* e\.g\. x = x\.rechunk\(\(1008, 1008\)\) "
            r"\(1/4 of the memory per block\)")


@pytest.mark.gpu
def test_out_of_memory_on_a_gpu_then_the_next_call_runs():
    import cupy as cp

    x_np = random_array(np.random.default_rng(0), (2048, 2048), "float32", nonnegative=True)
    x = cp.asarray(x_np)  # 16 MiB; each of gaussian_filter's two passes writes 16 MiB more
    _warm_up()
    used = limited_pool(24 * MiB)
    try:
        with pytest.raises(GPUOutOfMemoryError, match="^" + OOM_2048):
            chunkernels.ndimage.gaussian_filter(x, 4)
        assert pool_used() == used  # nothing of the failed call is left on the device
        # the same process under the same limit: a quarter of the array fits, and is right
        got = chunkernels.ndimage.gaussian_filter(x[:1024, :1024], 4)
        assert_close(got, ndi.gaussian_filter(x_np[:1024, :1024], 4), rtol=1e-5, atol=1e-5)
    finally:
        unlimited_pool()


@pytest.mark.gpu
def test_out_of_memory_on_a_gpu_worker_which_keeps_serving():
    pytest.importorskip("dask_cuda")
    import cupy as cp

    x_np = random_array(np.random.default_rng(1), (2048, 2048), "float32", nonnegative=True)
    small_np = x_np[:256, :256]
    meta = cp.empty((0, 0), np.float32)
    # CuPy's own memory pool on the worker (not RMM's, where RMM is installed): its limit applies
    with cluster.client(gpus=1, dashboard_address=None, rmm_async=False,
                        rmm_allocator_external_lib_list=None) as c:
        (worker, pid), = c.run(os.getpid).items()
        x = c.persist(da.from_array(x_np, chunks=2048).map_blocks(cp.asarray, meta=meta))
        wait(x)  # on the device before the pool's use is measured
        c.run(_warm_up)
        (used,) = c.run(limited_pool, 24 * MiB).values()
        with pytest.raises(GPUOutOfMemoryError, match=OOM_2048):
            chunkernels.ndimage.gaussian_filter(x, 4).compute()
        assert c.run(pool_used) == {worker: used}  # the failed task left nothing behind
        small = da.from_array(small_np, chunks=128).map_blocks(cp.asarray, meta=meta)
        got = chunkernels.ndimage.gaussian_filter(small, 4).compute()
        assert_close(got, ndi.gaussian_filter(small_np, 4), rtol=1e-5, atol=1e-5)
        assert c.run(os.getpid) == {worker: pid}  # the same worker process served both
        c.run(unlimited_pool)


@pytest.mark.gpu
def test_out_of_memory_assembling_a_halo_buffer_names_the_kernel_and_a_rechunk():
    """Blocks in memory are extended with their halo into a new buffer before the kernel runs:
    when that buffer does not fit, the same error as from the kernel, for the extended block."""
    import cupy as cp

    x_np = random_array(np.random.default_rng(2), (2048, 2048), "float32", nonnegative=True)
    x = da.from_array(cp.asarray(x_np), chunks=1024, asarray=False).persist()  # 4 MiB blocks
    _warm_up()
    used = limited_pool(2 * MiB)  # less than one block with its halo, 1040 x 1040 float32
    try:
        with pytest.raises(GPUOutOfMemoryError, match=(
                r"^gaussian_filter: the GPU ran out of memory on a block of shape \(1040, 1040\) "
                r"float32 \(4\.13 MiB; a Dask block includes the kernel's halo, 16 on one side "
                r"along axis 0 and 16 on one side along axis 1\): OutOfMemoryError: .* e\.g\. x "
                r"= x\.rechunk\(\(512, 512\)\)")):
            chunkernels.ndimage.gaussian_filter(x, 4).compute(scheduler="sync")
        assert pool_used() == used  # nothing of the failed task is left (as above)
    finally:
        unlimited_pool()
    got = chunkernels.ndimage.gaussian_filter(x, 4).compute(scheduler="sync")
    assert_close(got, ndi.gaussian_filter(x_np, 4), rtol=1e-5, atol=1e-5)
