"""scipy.ndimage.label on NumPy, CuPy and Dask arrays, PyTorch tensors and xarray DataArrays.

NumPy inputs are labelled by SciPy itself; CuPy inputs by the CUDA kernels of
:mod:`chunkernels.kernels.label`; Dask arrays chunk by chunk with one merge of the chunks' faces
(:func:`chunkernels.kernels.label.plan`). Labels are SciPy's in every case: same count, same
numbering, whatever the chunking.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda
from chunkernels._graph import as_input, is_dask
from chunkernels._shared.filters import check_writable
from chunkernels.interop import array_entry
from chunkernels.kernels import label as label_kernel
from chunkernels.ndimage import _wrap


@array_entry("input", "structure", "output")
def label(kind, input, structure=None, output=None, wrap_axes=None):
    """Label the connected features of an array, as ``scipy.ndimage.label``.

    Parameters
    ----------
    input : array_like, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The array to label: every nonzero value is a feature pixel (any real dtype or bool; 0-d,
        empty and N-D arrays). CuPy arrays (and CUDA tensors) are labelled on their device;
        Dask arrays chunk by chunk, on NumPy or CuPy chunks.
    structure : array_like, optional
        Structuring element of shape ``(3,) * input.ndim`` saying which neighbours connect; it
        must be centrosymmetric. Default ``generate_binary_structure(input.ndim, 1)``
        (neighbours across faces only).
    output : array or dtype, optional
        The array to write the labels into (NumPy or CuPy inputs, same shape, may be the
        input itself), or the dtype of the labels: bool, an integer type, float32 or float64.
        Default int32 (intp from ``2**31 - 2`` elements on).
    wrap_axes : int or sequence of ints, optional
        Axes along which the array is periodic, as ``dask_image.ndmeasure.label`` takes them
        (scipy has no such option): the last position along them neighbours the first (through
        the structure's offsets, corners included), and a feature that crosses the edge is one
        feature. Numbering keeps the rule below. ``None`` (default): no axis wraps.

    Returns
    -------
    labels : numpy.ndarray, cupy.ndarray, dask.array.Array, torch.Tensor or xarray.DataArray
        The features numbered 1, 2, ... in raster (C) order of their first pixel; 0 is the
        background. Not returned when ``output`` is an array (it holds them). A Dask input
        gives a lazy array with the input's chunks and array type; a DataArray a DataArray
        labelled as the input.
    num_features : int or dask.array.Array
        How many features there are; a lazy 0-d Dask array (NumPy-backed) for a Dask input.

    Raises
    ------
    TypeError
        Complex or non-numeric input; an output dtype labels cannot be written in; an output
        array for a Dask input, or on the other device than the input.
    LabelError
        A structure of the wrong rank or size, or not symmetric (``AsymmetricStructureError``);
        ``wrap_axes`` naming an axis the input does not have, or one twice;
        an output array of the wrong shape; an output dtype too small for the labels, as SciPy
        raises it (for Dask inputs, when the number is computed). Bool outputs take any number
        of labels (they become True).

    Notes
    -----
    On the GPU the labels come from a union-find whose roots are each component's first pixel,
    so the numbering needs no sort; the count is read back from the device (one
    synchronisation) to return ``num_features``. For Dask inputs nothing is computed until
    asked; see the kernel page (docs/kernels/label.md) for the chunked algorithm.
    """
    x = as_input(input, "label", chunk_sizes=True)
    if np.iscomplexobj(x):
        raise TypeError(f"Complex type not supported: label takes real or boolean input; got "
                        f"{x.dtype} (label abs(x) or x != 0 instead)")
    if x.dtype.kind not in "biuf":
        raise TypeError(f"label takes boolean, integer or floating-point input; got dtype "
                        f"{x.dtype}")
    structure = label_kernel.check_structure(structure, x.ndim)
    dtype, target = _output(kind, output, x)
    wrap = _wrap.check_wrap_axes(wrap_axes, x.ndim)
    if wrap and x.size:
        return _label_wrapped(kind, x, structure, dtype, target, wrap)
    return _label(kind, x, structure, dtype, target)


def _label(kind, x, structure, dtype, target):
    """:func:`label` of ``x`` (of ``kind``), its arguments checked: into ``target`` when it is
    an array (then the count alone is returned), else as new labels of ``dtype``."""
    if kind.dask:
        return label_kernel.plan(x, structure, dtype)
    if kind.gpu:
        if target is not None:
            # SciPy numbers features in the order it walks the output array: label the views
            # that make that walk the raster order
            order = _walk_order(target.strides)
            x, target, structure = (a.transpose(order) for a in (x, target, structure))
        with x.device:
            if label_kernel.gpu_takes(x, structure, dtype):
                labels, count = label_kernel.label_device(x, structure, dtype, out=target)
                return _returned(labels, int(count), target)
        x = x.get()
        labels, count = ndi.label(label_kernel.scipy_input(x), structure, dtype)
        if target is None:
            return cuda.cupy().asarray(labels), count
        target[...] = cuda.cupy().asarray(labels)
        return count
    return ndi.label(label_kernel.scipy_input(x), structure,
                     target if target is not None else dtype)


def _label_wrapped(kind, x, structure, dtype, target, wrap):
    """:func:`label` with ``wrap_axes``: the labels as scipy finds them, in a dtype that holds
    any number of them, then joined across the wrapped edges (:mod:`._wrap`)."""
    work = label_kernel.default_dtype(x.size)
    if kind.dask:
        return _wrap.wrapped_dask(*label_kernel.plan(x, structure, work), structure, wrap, dtype)
    labels, count = _label(kind, x, structure, work, None)
    labels, count = _wrap.wrapped(labels, count, structure, wrap, dtype)
    if target is None:
        return labels, count
    target[...] = labels
    return count


def _walk_order(strides) -> tuple[int, ...]:
    """Axes in the order SciPy's labelling walks an output array of these strides.

    SciPy labels line by line along one axis, the one NumPy's ``PyArray_IterAllButAxis`` picks:
    the first axis of nonzero stride, unless a later axis has a smaller positive stride. The
    lines follow each other in C order over the other axes; so features are numbered in raster
    order of the array with that axis moved last.
    """
    ndim = len(strides)
    axis, smallest = 0, 0
    for stride in strides:
        if stride:
            smallest = stride
            break
    for i in range(1, ndim):
        if 0 < strides[i] < smallest:
            axis, smallest = i, strides[i]
    return tuple(a for a in range(ndim) if a != axis) + (axis,) if ndim else ()


def _returned(labels, count, target):
    label_kernel.check_bit_depth(count, labels.dtype)
    return count if target is not None else (labels, count)


def _output(kind, output, x):
    """``(dtype, array to fill or None)`` from ``output``, checked before any work."""
    if output is None:
        return label_kernel.default_dtype(x.size), None
    if hasattr(output, "shape") and not isinstance(output, type | np.dtype):
        if kind.dask or is_dask(output):
            raise TypeError("output= cannot be an array for a Dask input (the labels are "
                            "lazy); pass a dtype, e.g. output=numpy.int64, and store the result "
                            "where you want it")
        if not (isinstance(output, np.ndarray) or cuda.is_cupy_array(output)):
            raise TypeError(f"output must be a NumPy or CuPy array or a dtype; got "
                            f"{type(output).__module__}.{type(output).__name__}")
        check_writable(output, label_kernel.LabelError)
        if tuple(output.shape) != tuple(x.shape):
            raise label_kernel.LabelError(f"output shape not correct: output has shape "
                                          f"{output.shape}, the input {x.shape}")
        if cuda.is_cupy_array(output) != kind.gpu:
            raise TypeError(f"output is a {type(output).__module__} array and the input a "
                            f"{type(x).__module__} one; give an output on the input's device")
        return label_kernel.check_output_dtype(output.dtype), output
    return label_kernel.check_output_dtype(output), None
