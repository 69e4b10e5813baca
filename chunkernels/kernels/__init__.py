"""Built-in kernels, one module (or subpackage) each: its spec, stride-aware GPU dispatch and CPU
reference.

Built-ins are found here, not listed: every module or subpackage of this package whose name does
not start with an underscore is a kernel and exposes its :class:`~chunkernels.KernelSpec` as
``SPEC``. To add a kernel, copy the quartet of an existing one (``kernels_cuda/NAME.cu``,
``chunkernels/kernels/NAME.py``, ``tests/kernels/test_NAME.py``, ``docs/kernels/NAME.md``); helpers
that several kernels share go in modules named ``_NAME.py``.

The registry, below the kernels, never imports this package: ``chunkernels/__init__.py`` hands
it :func:`builtin_specs`. Calling the package, ``chunkernels.kernels()``, is the deprecated
spelling of :func:`chunkernels.registered` (a warning says so).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
import warnings
from collections.abc import Iterator

from chunkernels._errors import KernelSpecError
from chunkernels._registry import KernelSpec, registered


def builtin_modules() -> tuple[str, ...]:
    """Names of the built-in kernels' modules in this package, sorted (nothing is imported)."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules(__path__)
                        if not info.name.startswith("_")))


def builtin_specs() -> Iterator[tuple[str, KernelSpec]]:
    """``(module name, SPEC)`` of every built-in kernel, importing each module in turn.

    The registry's provider of built-in kernels (see
    :func:`chunkernels._registry.set_builtin_provider`).

    Raises
    ------
    KernelSpecError
        A public module here without a ``SPEC``.
    """
    for name in builtin_modules():
        module = importlib.import_module(f"{__name__}.{name}")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, KernelSpec):
            raise KernelSpecError(
                f"{module.__name__} has no SPEC (a KernelSpec), yet every module of "
                f"chunkernels/kernels/ whose name does not start with '_' is a built-in kernel: "
                f"give it its spec as SPEC, or rename it _{name}.py if it only helps other kernels")
        yield module.__name__, spec


class _CallablePackage(types.ModuleType):
    """This package, callable as ``chunkernels.kernels()`` was when it named the function now
    called :func:`chunkernels.registered`."""

    def __call__(self) -> list[str]:
        warnings.warn("chunkernels.kernels() is deprecated: call chunkernels.registered() (the "
                      "name chunkernels.kernels is the subpackage of built-in kernels)",
                      DeprecationWarning, stacklevel=2)
        return registered()


sys.modules[__name__].__class__ = _CallablePackage
