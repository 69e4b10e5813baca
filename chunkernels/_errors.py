"""Exceptions and warnings raised by chunkernels.

Every message states what went wrong, the values seen, what would be accepted and how to fix it.
"""


class UnknownKernelError(KeyError):
    """A kernel name that is not in the registry."""

    def __str__(self):  # KeyError quotes its argument; show the message as written
        return str(self.args[0]) if self.args else ""


class DuplicateKernelError(ValueError):
    """A kernel registered under a name that is already taken."""


class KernelSpecError(ValueError):
    """A kernel description that is incomplete or contradicts itself."""


class KernelResultError(KernelSpecError):
    """A kernel's result on a block that is not what its spec declares (shape or dtype).

    Raised by :func:`chunkernels.run_block` for each block, so that a Dask array declared with
    one shape and dtype never computes to another. The message names the kernel, the path that
    returned the result (CPU reference or GPU dispatch) and both shapes and dtypes.
    """


class AlignmentError(ValueError):
    """Extra array operands whose shape or chunks do not line up with ``x``."""


class HaloError(ValueError):
    """A halo (overlap depth) that the chunks or the array cannot provide."""


class UnknownChunkSizesError(HaloError):
    """A Dask array whose chunk sizes are unknown (NaN, as boolean indexing such as ``x[x > 0]``
    leaves them) given to work that needs them: a halo, a block's position in the array
    (labels, measurements), output chunks planned from the input's (zoom).

    Raised before any graph is built, by every entry point that needs the sizes
    (:func:`chunkernels._graph.check_chunk_sizes`); the message says to call
    ``x.compute_chunk_sizes()`` first. A ``ValueError``, as Dask raises for unknown chunk sizes,
    and a :class:`HaloError`, which is what the filters raised for them before.
    """


class UnsupportedBlockError(TypeError):
    """A block the kernel's GPU path refuses (dtype, ndim, layout), raised under ``strict=True``."""


class CPUFallbackWarning(UserWarning):
    """A GPU block was computed by the CPU reference because the GPU path refused it."""


class GPUOutOfMemoryError(MemoryError):
    """A block whose GPU computation ran out of device memory.

    The message names the kernel, the block's shape, dtype and bytes (halo included), the device
    and its free and total memory, and a smaller chunking to try. The process that raised it
    keeps working: the block's buffers are freed as the error unwinds.
    """


class KernelArgumentError(TypeError):
    """A kernel launch argument that does not match the compiled function's parameter.

    The message names the kernel entry, the parameter's index and size, and the value's type.
    """


class LaunchFallbackWarning(RuntimeWarning):
    """Kernels launch through CuPy's ``RawKernel``, not chunkernels' driver launch (warned once
    per reason; :func:`chunkernels.cuda.launch_counts` counts them)."""


class LaunchFallbackError(RuntimeError):
    """A launch would have fallen back to CuPy's, and ``CHUNKERNELS_LAUNCH_FALLBACK=error``
    (set by the test suite) forbids it."""
