"""chunkernels: custom GPU kernels over chunked arrays, with CPU references that define the result.

>>> import numpy as np, dask.array as da, chunkernels
>>> x = da.ones((4, 6), chunks=(2, 3))
>>> chunkernels.apply(x, "broadcast_add", np.arange(6.0)).compute()[0]
array([1., 2., 3., 4., 5., 6.])

Importing chunkernels imports neither CuPy nor CUDA; kernels compile on first use, per device.
``chunkernels.registered()`` lists the kernels (``chunkernels.kernels()``, its former name, still
works and warns that it is deprecated).
"""

from chunkernels._apply import BlockFunction, apply, blockwise
from chunkernels._dispatch import run_block
from chunkernels._errors import (
    AlignmentError,
    CPUFallbackWarning,
    DuplicateKernelError,
    GPUOutOfMemoryError,
    HaloError,
    KernelArgumentError,
    KernelResultError,
    KernelSpecError,
    LaunchFallbackError,
    LaunchFallbackWarning,
    UnknownChunkSizesError,
    UnknownKernelError,
    UnsupportedBlockError,
)
from chunkernels._pipeline import Pipeline, pipeline
from chunkernels._registry import (
    KernelSpec,
    always,
    describe,
    get,
    register,
    registered,
    unregister,
)
from chunkernels import cluster  # noqa: E402 - imports nothing heavy until client() is called
from chunkernels import _registry, kernels  # the built-ins' package; it imports no kernel yet

# The registry sits below the kernels and must not import them: the face tells it where they are.
# A Dask worker imports this module before any submodule, so its registry knows them too.
_registry.set_builtin_provider(kernels.builtin_specs)

__version__ = "0.1.0"

__all__ = [
    "AlignmentError",
    "BlockFunction",
    "CPUFallbackWarning",
    "DuplicateKernelError",
    "GPUOutOfMemoryError",
    "HaloError",
    "KernelArgumentError",
    "KernelResultError",
    "KernelSpec",
    "KernelSpecError",
    "LaunchFallbackError",
    "LaunchFallbackWarning",
    "Pipeline",
    "UnknownChunkSizesError",
    "UnknownKernelError",
    "UnsupportedBlockError",
    "always",
    "apply",
    "blockwise",
    "describe",
    "get",
    "pipeline",
    "register",
    "registered",
    "run_block",
    "unregister",
]

#: Public submodules that ``chunkernels.NAME`` imports on first access, as SciPy does for its
#: subpackages, so ``import chunkernels; chunkernels.ndimage.label(...)`` works (on a Dask worker
#: too, which imports only ``chunkernels``) while ``import chunkernels`` stays light.
_SUBMODULES = ("ndimage", "signal", "sources", "metrics", "interop", "testing", "layout", "cuda")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"chunkernels.{name}")
    raise AttributeError(f"module 'chunkernels' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
