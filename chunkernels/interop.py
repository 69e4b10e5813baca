"""PyTorch tensors in, PyTorch tensors out: chunkernels functions on tensors without copies.

A function wrapped with :func:`accepts_tensors` takes ``torch.Tensor`` arguments where it takes
arrays. For the call, a CUDA tensor becomes a CuPy array on the same memory (DLPack), a CPU
tensor a NumPy array on the same memory (``Tensor.numpy()``); the result comes back as a tensor
on the device of the first array argument, again without a copy. The caller gets back the
array type it passed.

========================================  =========================================
conversion                                copies?
========================================  =========================================
CUDA tensor -> CuPy (``cupy.from_dlpack``)  no: same device memory, same strides
CuPy -> CUDA tensor (``torch.from_dlpack``) no: the tensor keeps the CuPy memory alive
CPU tensor -> NumPy (``Tensor.numpy()``)    no: same host memory
NumPy -> CPU tensor (``torch.from_numpy``)  no, except for negative strides and read-only
                                          arrays (torch has neither): then one copy
========================================  =========================================

Streams: while a function runs on CUDA tensors, CuPy launches its kernels on PyTorch's current
stream of the tensor's device (a CuPy stream wrapping it), so the work is ordered after
whatever PyTorch queued before the call and before whatever it queues after: no
synchronisation is needed on either side.

PyTorch is never imported here: a tensor can only exist once the caller has imported torch, so
the module is looked up in ``sys.modules`` (once its import has finished).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

import numpy as np

from chunkernels import cuda
from chunkernels._imports import imported


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
    """``a`` (CuPy or NumPy array, or a tuple/list of them) as tensors; other values unchanged.

    CuPy arrays come back through DLPack (no copy), NumPy arrays through ``torch.from_numpy``
    (no copy unless the array has negative strides or is read-only). ``device`` moves a result
    onto it, which copies only when the result is elsewhere.
    """
    torch = _torch()
    if isinstance(a, tuple | list):
        return type(a)(to_tensor(v, device) for v in a)
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


def accepts_tensors(*names: str):
    """Decorator: the named array arguments may be torch tensors; the result type follows.

    Tensors among the named arguments (a ``*args`` name covers each of them) are converted with
    :func:`to_array` for the call, which runs on PyTorch's current stream (:func:`torch_stream`).
    When the first named argument was a tensor, array results come back as tensors on its
    device (:func:`to_tensor`); an argument that the function returns as is (an ``output``
    array it filled) comes back as the very tensor that was passed.
    """
    def decorate(fn):
        signature = inspect.signature(fn)
        variadic = {n for n in names
                    if signature.parameters[n].kind is inspect.Parameter.VAR_POSITIONAL}

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _torch() is None:  # no torch imported: no tensor can be among the arguments
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            values = {name: (tuple(bound.arguments[name]) if name in variadic
                             else (bound.arguments[name],))
                      for name in names if name in bound.arguments}
            tensors = [v for vs in values.values() for v in vs if is_tensor(v)]
            if not tensors:
                return fn(*args, **kwargs)
            cuda_devices = {t.device for t in tensors if t.device.type == "cuda"}
            if len(cuda_devices) > 1:
                raise ValueError(f"tensors on several CUDA devices ({sorted(map(str, cuda_devices))});"
                                 f" move them to one device first")
            first = values.get(names[0], (None,))
            primary = first[0] if first and is_tensor(first[0]) else None
            device = (primary if primary is not None else tensors[0]).device
            passed = {}  # id(array made for the call) -> the tensor it came from

            def convert(value):
                if not is_tensor(value):
                    return value
                array = to_array(value)
                passed[id(array)] = value
                return array

            # conversions inside the stream context: DLPack then orders nothing extra
            with torch_stream(device):
                for name, vs in values.items():
                    converted = tuple(convert(v) for v in vs)
                    bound.arguments[name] = converted if name in variadic else converted[0]
                result = fn(*bound.args, **bound.kwargs)
                if primary is None:
                    return result
                if id(result) in passed:  # an output argument, filled in place
                    return passed[id(result)]
                return to_tensor(result, primary.device)

        return wrapper

    return decorate
