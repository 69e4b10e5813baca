"""Arrays of every kind in, the same kind out: the public entry of chunkernels' functions.

Every public function that takes arrays is wrapped by :func:`array_entry`. It decides, once, the
:class:`~chunkernels._kind.ArrayKind` of the call (NumPy, CuPy, or Dask of either) and passes it
down, and it takes two kinds of arrays that chunkernels does not compute on itself:

* **PyTorch tensors**, used without copies. For the call, a CUDA tensor becomes a CuPy array
  on the same memory (DLPack), a CPU tensor a NumPy array on the same memory
  (``Tensor.numpy()``); the result comes back as a tensor on the device of the first array
  argument, again without a copy.
* **xarray DataArrays**, used through their data (NumPy, CuPy or Dask: a Dask-backed DataArray
  stays lazy); results on the input's grid come back as DataArrays with its dims, coordinates,
  attributes and name (the rules: :mod:`chunkernels._xarray`).

========================================  =========================================
conversion                                copies?
========================================  =========================================
CUDA tensor -> CuPy (``cupy.from_dlpack``)  no: same device memory, same strides
CuPy -> CUDA tensor (``torch.from_dlpack``) no: the tensor keeps the CuPy memory alive
CPU tensor -> NumPy (``Tensor.numpy()``)    no: same host memory
NumPy -> CPU tensor (``torch.from_numpy``)  no, except for negative strides and read-only
                                          arrays (torch has neither): then one copy
DataArray -> its data (``DataArray.data``)  no
result -> DataArray                         no: the DataArray wraps the result
========================================  =========================================

Streams: while a function runs on CUDA tensors, CuPy launches its kernels on PyTorch's current
stream of the tensor's device (a CuPy stream wrapping it), so the work is ordered after
whatever PyTorch queued before the call and before whatever it queues after: no
synchronisation is needed on either side.

Neither PyTorch nor xarray is imported here: a tensor or a DataArray can only exist once the
caller has imported its library, so the module is looked up in ``sys.modules`` (once its import
has finished).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from typing import Any

import numpy as np

from chunkernels import _xarray, cuda
from chunkernels._imports import imported
from chunkernels._kind import NUMPY, ArrayKind


def _torch():
    return imported("torch")


def is_tensor(a: Any) -> bool:
    """Whether ``a`` is a ``torch.Tensor`` (answered without importing torch)."""
    torch = _torch()
    return torch is not None and isinstance(a, torch.Tensor)


def to_array(t):
    """The CuPy (CUDA tensor) or NumPy (CPU tensor) array on ``t``'s memory; never a copy.

    Raises
    ------
    TypeError
        ``t`` requires grad (chunkernels functions are not differentiable), or lives on a device
        that is neither the CPU nor CUDA.
    """
    if t.requires_grad:
        raise TypeError(
            "this tensor requires grad, but chunkernels functions are not differentiable: "
            "pass t.detach() (gradients will not flow through the call)")
    if t.device.type == "cuda":
        return cuda.cupy().from_dlpack(t)
    if t.device.type == "cpu":
        return t.resolve_conj().resolve_neg().numpy()
    raise TypeError(f"tensors on device {t.device} are not supported: chunkernels takes CPU "
                    f"and CUDA tensors (move it with t.to('cuda') or t.cpu())")


def to_tensor(a, device=None):
    """``a`` (CuPy or NumPy array or NumPy scalar, or a tuple/list of them) as tensors; other
    values unchanged.

    CuPy arrays come back through DLPack (no copy), NumPy arrays through ``torch.from_numpy``
    (no copy unless the array has negative strides or is read-only), NumPy scalars as 0-d
    tensors. ``device`` moves a result onto it, which copies only when the result is elsewhere.
    """
    torch = _torch()
    if isinstance(a, tuple | list):
        return type(a)(to_tensor(v, device) for v in a)
    if isinstance(a, np.generic):
        a = np.asarray(a)
    if cuda.is_cupy_array(a):
        out = torch.from_dlpack(a)
    elif isinstance(a, np.ndarray):
        if a.flags.writeable and all(s >= 0 for s in a.strides):
            out = torch.from_numpy(a)
        else:  # torch tensors have neither negative strides nor a read-only flag
            out = torch.from_numpy(np.array(a))
    else:
        return a
    return out if device is None or out.device == device else out.to(device)


@contextlib.contextmanager
def torch_stream(device):
    """Run CuPy work on PyTorch's current stream of CUDA ``device`` (nothing for the CPU)."""
    if device.type != "cuda":
        yield
        return
    cp = cuda.cupy()
    torch = _torch()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cp.cuda.Device(index):
        with _cupy_stream(cp, torch.cuda.current_stream(index).cuda_stream, index):
            yield


def _cupy_stream(cp, handle: int, device: int):
    """A CuPy stream for the CUDA stream ``handle`` of ``device``, which another library owns.

    CuPy 14 takes such streams through ``Stream.from_external`` and the CUDA stream protocol
    (an object whose ``__cuda_stream__()`` gives ``(0, handle)``) and deprecates
    ``ExternalStream``, which older CuPy releases need.
    """
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is None:
        return cp.cuda.ExternalStream(handle, device)
    return from_external(_StreamHandle(handle))


class _StreamHandle:
    """A raw CUDA stream handle, offered through the CUDA stream protocol."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


# -- the public entry ------------------------------------------------------------------------------


class _Tensors:
    """PyTorch tensors: the arrays on their memory for the call, array results back as tensors
    (on the grid or not: a tensor has no labels to lose)."""

    @staticmethod
    def type():
        """``torch.Tensor`` once the caller imported torch, else ``None``."""
        torch = _torch()
        return None if torch is None else torch.Tensor

    unwrap = staticmethod(to_array)

    @staticmethod
    def enter(found, first):
        """The context the call runs in: PyTorch's current stream of the tensors' device."""
        cuda_devices = {t.device for _, t in found if t.device.type == "cuda"}
        if len(cuda_devices) > 1:
            raise ValueError(f"tensors on several CUDA devices ({sorted(map(str, cuda_devices))});"
                             f" move them to one device first")
        return torch_stream((found[0][1] if first is None else first).device)

    @staticmethod
    def wrap(a, first, positions=None):
        return to_tensor(a, first.device)

    value = wrap


class _DataArrays:
    """xarray DataArrays: their data for the call, results on the input's grid labelled as
    :mod:`chunkernels._xarray` says, other results plain."""

    @staticmethod
    def type():
        """``xarray.DataArray`` once the caller imported xarray, else ``None``."""
        xarray = _xarray.module()
        return None if xarray is None else xarray.DataArray

    @staticmethod
    def unwrap(value):
        return value.data

    @staticmethod
    def enter(found, first):
        if first is not None:
            for name, value in found:
                if value is not first:
                    _xarray.check_dims(first, value, name)
        return contextlib.nullcontext()

    @staticmethod
    def wrap(a, first, positions=None):
        return _xarray.on_grid(a, first, positions)

    @staticmethod
    def value(a, first):
        return a


_ADAPTERS = (_Tensors, _DataArrays)


def array_entry(*names: str, coerce: bool = True, returns="grid", positions=None):
    """Decorator of chunkernels' public functions: it decides the call's array kind and gives
    the caller back the type of array it passed.

    Parameters
    ----------
    *names
        The function's array arguments (a ``*args`` name covers each of its values). The first
        is *the input*: the call has its kind, and the results follow its type.
    coerce
        Make an input that is no array (a list, a scalar) a NumPy array, as SciPy does. With
        ``False`` it is passed as it is, with the kind ``None``, for the function to refuse.
    returns
        Which results lie on the input's grid: ``"grid"``, the result itself or the arrays of a
        tuple or list result; ``"values"``, none (reductions, measurements); or a function
        ``returns(result, wrap)`` that applies ``wrap`` to those that do.
    positions
        For a function whose result resamples the input: ``positions(arguments, axis, n_in,
        n_out)``, where the ``n_out`` samples of the result along ``axis`` stand in the input's
        ``n_in`` (fractional indices), or ``None`` where unknown; ``arguments`` are the call's,
        by name, as the function received them (defaults included).

    Notes
    -----
    For each call:

    * a function whose first parameter (after ``self``) is named ``kind`` is given there the
      input's :class:`~chunkernels._kind.ArrayKind`, after the conversions below; the layers
      under it take the kind from it instead of asking the array again. That parameter is no
      part of the public signature (:func:`inspect.signature`, the API reference);
    * PyTorch tensors among the named arguments become arrays on their memory
      (:func:`to_array`), and the call runs on PyTorch's current stream (:func:`torch_stream`).
      When the input was a tensor, array results come back as tensors on its device
      (:func:`to_tensor`);
    * xarray DataArrays among them become their data (NumPy, CuPy or Dask). When the input was a
      DataArray, the results on its grid come back as DataArrays labelled as it is, the others
      as plain values (the rules: :mod:`chunkernels._xarray`);
    * an argument that the function returns as is (an ``output`` array it filled) comes back as
      the very tensor or DataArray that was passed.

    Neither PyTorch nor xarray is imported: their objects can only exist once the caller has
    imported them, so they are looked up in ``sys.modules``; with neither there, the call costs
    one type check of the input more than the function itself.
    """
    def decorate(fn):
        signature = inspect.signature(fn)
        parameters = list(signature.parameters.values())
        slot = next((i for i, p in enumerate(parameters[:2]) if p.name == "kind"), None)
        public = signature.replace(parameters=[p for i, p in enumerate(parameters) if i != slot])
        variadic = {n for n in names
                    if public.parameters[n].kind is inspect.Parameter.VAR_POSITIONAL}
        positional = [n for n, p in public.parameters.items()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        first = names[0]
        at = positional.index(first) if first in positional else None

        def decide(value):
            """``(kind, value)`` of the input, made a NumPy array where ``coerce`` says so."""
            kind = ArrayKind.of(value)
            if kind is None and coerce:
                return NUMPY, np.asarray(value)
            return kind, value

        def call(args, kwargs, kind):
            if slot is None:
                return fn(*args, **kwargs)
            return fn(*args[:slot], kind, *args[slot:], **kwargs)

        def plain(args, kwargs):
            """The call with no tensor nor DataArray among the arguments (kept short: it is
            the common case, a few hundred nanoseconds)."""
            if slot is None:
                return fn(*args, **kwargs)
            if at is not None and len(args) > at:
                kind = ArrayKind.of(args[at])
                if kind is None and coerce:
                    kind, value = decide(args[at])
                    args = (*args[:at], value, *args[at + 1:])
            elif first in kwargs:
                kind = ArrayKind.of(kwargs[first])
                if kind is None and coerce:
                    kind, value = decide(kwargs[first])
                    kwargs = {**kwargs, first: value}
            else:
                raise TypeError(f"{fn.__qualname__}() missing 1 required argument: {first!r}")
            if slot == 0:
                return fn(kind, *args, **kwargs)
            return fn(*args[:slot], kind, *args[slot:], **kwargs)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            pairs, types = _imported_types()
            if not types or not _any_instance(types, args, kwargs):
                return plain(args, kwargs)  # the common case: nothing to convert, no binding
            bound = public.bind(*args, **kwargs)
            found = []  # (name, index among a *args name's values, value, adapter)
            for name in (n for n in names if n in bound.arguments):
                values = bound.arguments[name]
                for i, value in enumerate(values if name in variadic else (values,)):
                    adapter = next((a for a, t in pairs if isinstance(value, t)), None)
                    if adapter is not None:
                        found.append((name, i, value, adapter))
            if not found:
                return plain(args, kwargs)
            given = bound.arguments[first]
            owner = next((adapter for _, _, value, adapter in found if value is given), None)
            passed = {}  # id(array made for the call) -> the argument it came from
            with contextlib.ExitStack() as stack:
                for adapter in dict.fromkeys(adapter for *_, adapter in found):
                    stack.enter_context(adapter.enter(
                        [(n, v) for n, _, v, a in found if a is adapter],
                        given if owner is adapter else None))
                # conversions inside the contexts: DLPack then orders nothing extra
                for name, i, value, adapter in found:
                    array = adapter.unwrap(value)
                    passed[id(array)] = value
                    if name in variadic:
                        values = bound.arguments[name]
                        bound.arguments[name] = (*values[:i], array, *values[i + 1:])
                    else:
                        bound.arguments[name] = array
                kind = None
                if slot is not None:
                    kind, bound.arguments[first] = decide(bound.arguments[first])
                result = call(bound.args, bound.kwargs, kind)
                if id(result) in passed:  # an output argument, filled in place
                    return passed[id(result)]
                if owner is None:
                    return result
                return _returned(result, owner, given, returns, positions, bound)

        wrapper.__signature__ = public
        return wrapper

    return decorate


def _imported_types() -> tuple[tuple, tuple]:
    """``(pairs, types)``: ``(adapter, the type it converts)`` of each library the caller has
    imported, and those types. Asked at every call: the modules are looked up, the answer for
    them is cached."""
    torch, xarray = _torch(), _xarray.module()
    if torch is None and xarray is None:
        return (), ()
    return _types_of(torch, xarray)


@functools.lru_cache(maxsize=4)  # one answer per set of modules imported: at most four
def _types_of(torch, xarray) -> tuple[tuple, tuple]:
    pairs = tuple((adapter, t) for adapter in _ADAPTERS if (t := adapter.type()) is not None)
    return pairs, tuple(t for _, t in pairs)


def _any_instance(types: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether an argument is an instance of one of ``types`` (a loop: cheaper than ``any``)."""
    for value in args:
        if isinstance(value, types):
            return True
    for value in kwargs.values():
        if isinstance(value, types):
            return True
    return False


def _returned(result, adapter, given, returns, positions, bound):
    """``result`` as the caller of input ``given`` (owned by ``adapter``) gets it back."""
    if returns == "values":
        return _each_array(result, lambda a: adapter.value(a, given))
    where = None
    if positions is not None:
        bound.apply_defaults()
        where = functools.partial(positions, dict(bound.arguments))

    def wrap(a):
        return adapter.wrap(a, given, where)

    if returns == "grid":
        return _each_array(result, wrap)
    return returns(result, wrap)


def _each_array(result, fn):
    """``fn`` applied to ``result`` if it is an array (or a NumPy scalar: a reduction's value),
    else to the arrays of a tuple or list result."""
    if type(result) in (tuple, list):
        return type(result)(fn(v) if _is_array(v) else v for v in result)
    return fn(result) if _is_array(result) else result


def _is_array(a) -> bool:
    return ArrayKind.of(a) is not None or isinstance(a, np.generic)


def accepts_tensors(*names: str):
    """Deprecated: the former name of :func:`array_entry`, which now also takes xarray
    DataArrays and decides the array kind."""
    warnings.warn("chunkernels.interop.accepts_tensors is deprecated: use array_entry, which "
                  "takes the same names (and xarray DataArrays too)", DeprecationWarning,
                  stacklevel=2)
    return array_entry(*names)
