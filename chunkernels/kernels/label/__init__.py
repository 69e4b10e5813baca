"""label: connected components of the nonzero pixels, numbered exactly as scipy.ndimage.label.

The kernel behind :func:`chunkernels.ndimage.label`. Components are sets of nonzero pixels
joined under a symmetric ``3**ndim`` structuring element; they are numbered 1..N in raster (C)
order of each component's first pixel, as SciPy numbers them. CUDA source:
``kernels_cuda/label.cu`` (union-find whose roots are first pixels, see its header).

A label is not blockwise, so a Dask array gets its own graph (:func:`plan`), of
``2 * chunks + 2`` tasks whatever the number of labels (``3 * chunks + 2`` where it runs on a
distributed cluster, so that only the summaries travel to the merge's worker; for CuPy chunks
under a local scheduler, one task does all three steps below and each chunk's task picks its
labels, ``chunks + 2``; see :func:`_graph._tasks` and :func:`local_shape`):

1. per chunk, a local labelling (SciPy on NumPy chunks, the CUDA kernels on CuPy chunks) and a
   small summary: the chunk's faces (first and last slice along every axis) and, for every line
   along the last axis, how many local labels start on it (:func:`summary_layout`);
2. one merge over all summaries: on their device when they all are on one
   (:func:`merge_device`), else on the host (:func:`merge`). The faces of neighbouring chunks
   give the pairs of local labels the structure connects; joined, with the per-line counts
   they give every local label its global one;
3. per chunk, from the merge, a lookup table from local to global labels, built and applied on
   the chunk's device (``label_renumber`` and ``label_lookup``, or ``label_table`` and a
   ``take`` after a host merge).

The package's modules, bottom up (each imports only those above it in this list):

* ``_reference``: the arguments (dtypes, the checks of the structure and the output dtype, with
  SciPy's errors) and the CPU reference, ``scipy.ndimage.label``;
* ``_forest``: the single-block GPU path (the union-find forest of a block, its scans, its
  labels) and a block's summary, step 1;
* ``_host_merge``: the merge on the host, step 2, and each block's lookup table from it;
* ``_device_merge``: the merge on the device, step 2, and the relabelling on the device, step 3;
* ``_graph``: the Dask graph and the tasks it runs, and :data:`SPEC`, which names the graph and
  whose check of a block the tasks ask (the two need each other, so they live together).

This module exposes :data:`SPEC` and the names the front end (:mod:`chunkernels.ndimage`) uses;
the private names live in the module that defines them, and a test patches them there.
"""

from __future__ import annotations

from chunkernels.kernels.label._device_merge import merge_device
from chunkernels.kernels.label._forest import dispatch, label_device, structure_mask, summary_layout
from chunkernels.kernels.label._graph import SPEC, dask_graph, gpu_takes, local_shape, plan
from chunkernels.kernels.label._host_merge import merge, most_labels
from chunkernels.kernels.label._reference import (
    GPU_DTYPES,
    MAX_NDIM,
    OUTPUT_DTYPES,
    SCIPY_INPUT_DTYPES,
    AsymmetricStructureError,
    LabelError,
    check_bit_depth,
    check_output_dtype,
    check_structure,
    default_dtype,
    holds,
    reference,
    scipy_input,
)

__all__ = [
    "GPU_DTYPES",
    "MAX_NDIM",
    "OUTPUT_DTYPES",
    "SCIPY_INPUT_DTYPES",
    "SPEC",
    "AsymmetricStructureError",
    "LabelError",
    "check_bit_depth",
    "check_output_dtype",
    "check_structure",
    "dask_graph",
    "default_dtype",
    "dispatch",
    "gpu_takes",
    "holds",
    "label_device",
    "local_shape",
    "merge",
    "merge_device",
    "most_labels",
    "plan",
    "reference",
    "scipy_input",
    "structure_mask",
    "summary_layout",
]
