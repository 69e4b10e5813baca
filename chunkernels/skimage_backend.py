"""A scikit-image backend: ``skimage.metrics`` calls on Dask and CuPy arrays run on chunkernels.

scikit-image (0.26 and later) looks up installed backends through two entry-point groups, which
chunkernels publishes in its ``pyproject.toml``::

    [project.entry-points.skimage_backends]
    chunkernels = "chunkernels.skimage_backend:backend_interface"

    [project.entry-points.skimage_backend_infos]
    chunkernels = "chunkernels.skimage_backend:info"

When a dispatchable scikit-image function is called, scikit-image asks
``backend_interface.can_has(name, *args, **kwargs)``; on ``True`` it calls the function that
``backend_interface.get_implementation(name)`` returns, instead of its own, and emits a
``skimage.util._backends.DispatchNotification`` naming the backend.

Which functions are served is not listed here: every registered kernel names the scikit-image
functions it implements in its spec (``skimage=("skimage.metrics:mean_squared_error",)``) and
:func:`supported_functions` collects them. The function that runs is the chunkernels function
of the same semantics (:func:`chunkernels.metrics.implementation`): a public function of
:mod:`chunkernels.metrics`, or the kernel through :func:`chunkernels.apply`.

What is taken:

* Dask arrays (NumPy or CuPy chunks) and CuPy arrays, all images of one array type;
* plain NumPy arrays only after an explicit opt-in (:func:`accept_numpy` or the environment
  variable ``CHUNKERNELS_SKIMAGE_NUMPY=1``), only when a GPU is present, and only for images of at
  least ``min_bytes`` each: they are copied to the GPU, and the result comes back as the float
  scikit-image returns.

Everything else (lists, NumPy arrays without the opt-in, mixed array types, complex or non-numeric
dtypes, shapes that differ or are unknown, empty images, parameter values the kernel's
``validate`` refuses) is declined, and scikit-image's own function runs, with its own errors.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import numbers
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chunkernels import cuda, metrics
from chunkernels._kind import NUMPY, ArrayKind

#: Set to ``1`` to let the backend take plain NumPy arrays (copied to the GPU).
NUMPY_ENV = "CHUNKERNELS_SKIMAGE_NUMPY"
#: Smallest NumPy image, in bytes, the backend takes once NumPy arrays are accepted.
MIN_BYTES_ENV = "CHUNKERNELS_SKIMAGE_MIN_BYTES"
#: Default for :data:`MIN_BYTES_ENV`: below about a MiB the copy to the GPU and back costs more than
#: the GPU saves.
DEFAULT_MIN_BYTES = 1 << 20

# (accept, min_bytes) set by accept_numpy() for the current thread / task; None: the environment.
_NUMPY_POLICY: contextvars.ContextVar[tuple[bool, int] | None] = contextvars.ContextVar(
    "chunkernels_skimage_numpy", default=None
)


# -- which functions ------------------------------------------------------------------------------


def supported_functions() -> list[str]:
    """The scikit-image functions the registered kernels implement, sorted.

    Collected from every registered spec's ``skimage`` field (built-in kernels, kernels of
    installed packages and kernels registered in this process), so a new kernel only declares
    its mapping in its spec.
    """
    return metrics.supported()


def info():
    """The ``skimage_backend_infos`` entry point: a ``BackendInformation`` for scikit-image.

    scikit-image calls it once, when the first module with dispatchable functions is imported,
    and keeps the answer: a kernel registered after that is listed by later calls but is not
    dispatched by scikit-image in that process.
    """
    from skimage.util._backends import BackendInformation

    return BackendInformation(supported_functions=supported_functions())


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function)


# -- NumPy opt-in ---------------------------------------------------------------------------------


@contextlib.contextmanager
def accept_numpy(min_bytes: int | None = None, *, enabled: bool = True) -> Iterator[None]:
    """Within the block, let the backend take plain NumPy arrays of at least ``min_bytes`` each.

    The arrays are copied to the GPU, the chunkernels implementation runs there, and the result
    comes back as the float scikit-image returns. Without a GPU NumPy arrays are still declined.
    The setting is per thread (and per asyncio task) and overrides the environment variables.

    Parameters
    ----------
    min_bytes
        Smallest image taken, in bytes (``nbytes`` of every image in the call). Defaults to
        ``CHUNKERNELS_SKIMAGE_MIN_BYTES``, else 1 MiB.
    enabled
        ``False`` declines NumPy arrays within the block, whatever the environment says.

    Examples
    --------
    >>> import numpy as np, skimage.metrics, chunkernels.skimage_backend as ckb
    >>> a = np.zeros((1024, 1024)); b = np.ones((1024, 1024))
    >>> with ckb.accept_numpy(min_bytes=2**20):     # doctest: +SKIP
    ...     skimage.metrics.mean_squared_error(a, b)  # on the GPU when one is present
    np.float64(1.0)
    """
    if min_bytes is None:
        min_bytes = _env_min_bytes()
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, numbers.Integral) or min_bytes < 0:
        raise ValueError(f"min_bytes={min_bytes!r}; expected a whole number of bytes >= 0")
    token = _NUMPY_POLICY.set((bool(enabled), int(min_bytes)))
    try:
        yield
    finally:
        _NUMPY_POLICY.reset(token)


def numpy_policy() -> tuple[bool, int]:
    """``(accepted, min_bytes)``: whether NumPy arrays are taken now, and from what size."""
    policy = _NUMPY_POLICY.get()
    if policy is not None:
        return policy
    accepted = os.environ.get(NUMPY_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return accepted, _env_min_bytes() if accepted else DEFAULT_MIN_BYTES


def _env_min_bytes() -> int:
    text = os.environ.get(MIN_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MIN_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{MIN_BYTES_ENV}={text!r}; expected a whole number of bytes >= 0 (e.g. 1048576)"
        )
    return value


@functools.cache
def _gpu_present() -> bool:
    # asked once: it imports CuPy, which only the NumPy opt-in path may do
    return cuda.gpu_count() > 0


# -- the backend interface ------------------------------------------------------------------------


def _array_kind(a: Any) -> ArrayKind | None:
    """The :class:`~chunkernels._kind.ArrayKind` of ``a``, or ``None`` for anything else, NumPy
    subclasses included (a masked array's mask would be dropped).

    Answered from types alone: no CuPy or Dask import, no computation.
    """
    kind = ArrayKind.of(a)
    if kind is not None and not kind.gpu and type(a._meta if kind.dask else a) is not np.ndarray:
        return None
    return kind


def _known_shape(shape: tuple) -> bool:
    # Dask gives NaN for chunk sizes not yet known (after boolean indexing)
    return all(isinstance(n, numbers.Integral) for n in shape)


def _numeric(dtype: np.dtype) -> bool:
    # bool, integers and floats; not complex (scikit-image refuses it), objects, strings or dates
    return dtype.kind in "biuf"


def can_has(name: str, *args: Any, **kwargs: Any) -> bool:
    """Whether chunkernels takes this call of scikit-image's ``name``.

    An inexpensive check, from types, dtypes and shapes alone: nothing is converted or computed,
    and CuPy is not imported unless a CuPy array is passed (or, after the NumPy opt-in, to ask
    whether a GPU is present). Parameters are checked by the kernel's own ``validate``, so a value
    chunkernels does not implement is left to scikit-image.
    """
    spec = metrics.kernel_for(name)
    if spec is None:
        return False
    signature = _signature(metrics.implementation(name))
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return False  # scikit-image's own function raises its TypeError for the call
    # images: the parameters without a default (and *operands); the rest are the kernel's params
    images, params = [], {}
    for param, value in bound.arguments.items():
        parameter = signature.parameters[param]
        if parameter.kind is parameter.VAR_POSITIONAL:
            images.extend(value)
        elif parameter.kind is parameter.VAR_KEYWORD:
            params.update(value)
        elif parameter.default is parameter.empty:
            images.append(value)
        else:
            params[param] = value
    if len(images) != 1 + len(spec.operands):
        return False

    kinds = {_array_kind(image) for image in images}
    if len(kinds) != 1 or None in kinds:
        return False  # not arrays, arrays of other libraries, or a mix of array types
    shape = images[0].shape
    if not _known_shape(shape) or any(image.shape != shape for image in images[1:]):
        return False  # scikit-image raises its own error for different shapes
    if math.prod(shape) == 0:
        return False  # empty images: scikit-image's own answer (NaN, or its error), cheaply
    if not all(_numeric(image.dtype) for image in images):
        return False
    try:
        spec.params(len(shape), params)
    except (TypeError, ValueError):
        return False

    if kinds == {NUMPY}:
        accepted, min_bytes = numpy_policy()
        gpu_dtypes = {np.dtype(d) for d in spec.dtypes}
        return (accepted and spec.gpu is not None
                and all(image.dtype in gpu_dtypes and image.nbytes >= min_bytes
                        for image in images)
                and _gpu_present())
    return True


def get_implementation(name: str) -> Callable[..., Any]:
    """The function that runs scikit-image's ``name`` once :func:`can_has` has taken the call.

    Dask and CuPy arrays go to the chunkernels implementation as they are (a lazy 0-d Dask array,
    or a 0-d CuPy array, comes back). NumPy arrays, taken only after the opt-in, are copied to the
    GPU and the result comes back to the host: a ``numpy.float64``, as scikit-image returns.

    Raises
    ------
    KeyError
        No registered kernel implements ``name``.
    """
    implementation = metrics.implementation(name)

    @functools.wraps(implementation)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not any(type(a) is np.ndarray for a in (*args, *kwargs.values())):
            return implementation(*args, **kwargs)
        cp = cuda.cupy()
        on_gpu = lambda a: cp.asarray(a) if type(a) is np.ndarray else a  # noqa: E731
        result = implementation(*map(on_gpu, args), **{k: on_gpu(v) for k, v in kwargs.items()})
        return _to_host(result)

    return run


def _to_host(result: Any) -> Any:
    """A CuPy result on the host: 0-d arrays as NumPy scalars (``numpy.float64``), as skimage."""
    if isinstance(result, tuple):
        return tuple(_to_host(r) for r in result)
    if cuda.is_cupy_array(result):
        host = result.get()
        return host[()] if host.ndim == 0 else host
    return result


class _BackendInterface:
    """The ``skimage_backends`` entry point: :func:`can_has` and :func:`get_implementation`."""

    name = "chunkernels"

    @staticmethod
    def can_has(name: str, *args: Any, **kwargs: Any) -> bool:
        return can_has(name, *args, **kwargs)

    @staticmethod
    def get_implementation(name: str) -> Callable[..., Any]:
        return get_implementation(name)

    def __repr__(self):
        return "chunkernels.skimage_backend.backend_interface"


#: The object scikit-image loads from the ``skimage_backends`` entry point.
backend_interface = _BackendInterface()

__all__ = [
    "DEFAULT_MIN_BYTES",
    "MIN_BYTES_ENV",
    "NUMPY_ENV",
    "accept_numpy",
    "backend_interface",
    "can_has",
    "get_implementation",
    "info",
    "numpy_policy",
    "supported_functions",
]
