"""label's arguments and CPU reference: the dtypes it reads and writes, the checks of its
structure and output dtype (SciPy's, with SciPy's errors), and ``scipy.ndimage.label`` itself,
which defines every result.

The bottom of :mod:`chunkernels.kernels.label`: its other modules import from here.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda

#: Dims the CUDA kernels take (blocks are seen as 4-D); more dims use the CPU reference.
MAX_NDIM = 4
#: Dtypes scipy.ndimage.label reads as they are; others (float16, longdouble) are read as
#: ``x != 0``, which labels the same.
SCIPY_INPUT_DTYPES = frozenset(np.dtype(d) for d in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64"))
#: Dtypes labels can be written in: SciPy's choice (its fused output types, and bool).
OUTPUT_DTYPES = SCIPY_INPUT_DTYPES
#: Input dtypes of the GPU path; float16 is read as ``x != 0`` first (CUDA has no C++ name
#: for it here).
GPU_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64")


class LabelError(ValueError, RuntimeError):
    """A ``label`` argument or result SciPy refuses: a structure of the wrong rank, size or
    symmetry, an output of the wrong shape, or an output dtype too small for the labels.

    A ``ValueError`` by chunkernels' rules and a ``RuntimeError`` as SciPy raises several of
    these (``AssertionError`` too, for an asymmetric structure), so code written against SciPy
    catches it unchanged.
    """


class AsymmetricStructureError(LabelError, AssertionError):
    """A structuring element that is not centrosymmetric (SciPy raises ``AssertionError``)."""


# -- arguments --------------------------------------------------------------------------------


def default_dtype(size: int) -> np.dtype:
    """SciPy's label dtype: int32, or intp from ``2**31 - 2`` elements on."""
    return np.dtype(np.intp if size >= 2**31 - 2 else np.int32)


def check_structure(structure, ndim: int) -> np.ndarray:
    """``structure`` as a read-only boolean array, checked as SciPy checks it.

    ``None`` gives ``generate_binary_structure(ndim, 1)`` (faces only).

    Raises
    ------
    LabelError
        A structure whose rank is not the input's, or whose sides are not 3.
    AsymmetricStructureError
        A structure that is not centrosymmetric.
    """
    if structure is None:
        s = ndi.generate_binary_structure(ndim, 1)
    else:
        if cuda.is_cupy_array(structure):
            structure = structure.get()
        s = np.asarray(structure, dtype=bool)
    if s.ndim != ndim:
        raise LabelError(
            f"structure and input must have equal rank: the structure has {s.ndim} dim(s) "
            f"(shape {s.shape}), the input {ndim}; pass a structure of shape {(3,) * ndim}, "
            f"e.g. scipy.ndimage.generate_binary_structure({ndim}, connectivity)")
    if any(n != 3 for n in s.shape):
        raise LabelError(f"structure dimensions must be equal to 3: got shape {s.shape}; "
                         f"pass a structure of shape {(3,) * ndim}")
    if not np.array_equal(s, s[(slice(None, None, -1),) * ndim]):
        raise AsymmetricStructureError(
            f"Structuring element is not symmetric: structure == structure[::-1, ...] fails "
            f"for {s.astype(np.uint8).tolist()}; connections must go both ways (see "
            f"scipy.ndimage.label's notes), e.g. structure | structure[::-1, ...]")
    s = np.array(s, order="C")  # a copy the caller cannot change (ascontiguousarray makes 0-d 1-d)
    s.setflags(write=False)
    return s


def check_output_dtype(dtype) -> np.dtype:
    """``dtype`` if labels can be written in it, else a ``TypeError`` naming those that can."""
    dtype = np.dtype(dtype)
    if dtype not in OUTPUT_DTYPES:
        accepted = ", ".join(sorted(d.name for d in OUTPUT_DTYPES))
        raise TypeError(f"label cannot write labels as {dtype}: the output dtype must be one "
                        f"of {accepted} (scipy.ndimage.label's output types)")
    return dtype


def holds(dtype, count: int) -> bool:
    """Whether every label up to ``count`` is exact in ``dtype`` (bool: labels become True)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return True
    if dtype.kind == "f":
        return count <= 2 ** (np.finfo(dtype).nmant + 1)
    return count <= np.iinfo(dtype).max


def check_bit_depth(count: int, dtype) -> None:
    """Raise SciPy's error when ``count`` labels do not fit in ``dtype``."""
    if not holds(dtype, count):
        raise LabelError(f"insufficient bit-depth in requested output type: {count} labels do "
                         f"not fit in {np.dtype(dtype)}; pass a wider output dtype (int32, "
                         f"int64)")


def _validate(ndim, *, structure=None, dtype=None):
    return {"structure": check_structure(structure, ndim),
            "dtype": None if dtype is None else check_output_dtype(dtype)}


def _result_dtype(x_dtype, *operand_dtypes, structure=None, dtype=None):
    return np.dtype(np.int32 if dtype is None else dtype)


# -- CPU reference ----------------------------------------------------------------------------


def scipy_input(x):
    """``x`` in a dtype scipy.ndimage.label reads (others as ``x != 0``)."""
    return x if x.dtype in SCIPY_INPUT_DTYPES else x != 0


def reference(x, *, structure, dtype=None):
    """CPU reference: ``scipy.ndimage.label(x, structure, output=dtype)[0]``."""
    x = np.asarray(x)
    return ndi.label(scipy_input(x), structure, default_dtype(x.size) if dtype is None else dtype)[0]
