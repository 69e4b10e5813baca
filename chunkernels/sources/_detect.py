"""Segmentation and source finding: the GPU lesson's steps 2-4 after κ-σ clipping."""

from __future__ import annotations

import math
import numbers

import numpy as np

from chunkernels._apply import apply_kernel
from chunkernels._graph import as_input
from chunkernels.interop import array_entry
from chunkernels.kernels import kappa_sigma_clip as ksc
from chunkernels.sources._clip import ClipResult, _check_arguments, clip


@array_entry("x")
def threshold(kind, x, value):
    """Segment ``x``: True where ``x > value`` (strictly), as the lesson's
    ``np.where(data > threshold, 1, 0)`` (as booleans).

    Parameters
    ----------
    x : array_like, cupy.ndarray, dask.array.Array or xarray.DataArray
        The image (any shape, real numbers).
    value : float
        The threshold: a Python number, a NumPy scalar or a 0-d array. It is compared as NumPy
        compares it: a Python float next to float32 data is rounded to float32 first, a
        ``numpy.float64`` compares in float64.

    Returns
    -------
    numpy.ndarray, cupy.ndarray, dask.array.Array or xarray.DataArray of bool
        ``x > value``, of ``x``'s array type (lazy for Dask; CuPy chunks run the GPU kernel).

    Raises
    ------
    TypeError
        ``value`` is not a real number.
    ValueError
        ``value`` is an array with dimensions.
    """
    return apply_kernel(kind, x, "threshold", params={"value": value})


#: The columns of a source catalogue: chunkernels.ndimage.measure's defaults and the
#: value-weighted centre of mass (the lesson's ``center_of_mass``).
CATALOGUE = ("label", "area", "sum", "mean", "min", "max", "centroid", "center_of_mass", "bbox")


class Sources(tuple):
    """What :func:`find_sources` returns: the pair ``(catalogue, labels)``, which unpacks as such,
    plus the background statistics and the threshold that made it.

    Attributes
    ----------
    catalogue : dict
        One row per source, columns as :func:`chunkernels.ndimage.measure` names them.
    labels
        The label image (0: background, 1..n: the sources), of the image's array type.
    background : ClipResult
        The κ-σ clipping statistics of the image.
    threshold : float
        The level the image was segmented at, ``median + nsigma * std``.
    """

    def __new__(cls, catalogue, labels, background: ClipResult, threshold: float):
        self = super().__new__(cls, (catalogue, labels))
        self.background = background
        self.threshold = threshold
        return self

    @property
    def catalogue(self):
        return self[0]

    @property
    def labels(self):
        return self[1]

    def __repr__(self):
        column = self.catalogue.get("label") if isinstance(self.catalogue, dict) else None
        shape = getattr(column, "shape", None)
        # a lazy catalogue (Dask input) does not know its length before it is computed
        n = ("?" if shape is None or len(shape) != 1 or math.isnan(shape[0])
             else int(shape[0]))
        return (f"Sources({n} sources above {self.threshold:.6g}; background median "
                f"{float(self.background.median):.6g}, std {self.background.std:.6g})")


def _labels_on_grid(found, wrap):
    """The :class:`Sources` of a tensor or DataArray image: its labels of the image's type."""
    return Sources(found.catalogue, wrap(found.labels), found.background, found.threshold)


@array_entry("image", returns=_labels_on_grid)
def find_sources(kind, image, kappa=3.0, nsigma=5.0, structure=None):
    """Find the sources of an image: the GPU lesson's four steps.

    1. κ-σ clip the background (:func:`kappa_sigma_clip` with ``kappa``);
    2. segment at ``median + nsigma * std`` of the clipped background (:func:`threshold`);
    3. label the connected components (:func:`chunkernels.ndimage.label` with ``structure``);
    4. measure each of them (:func:`chunkernels.ndimage.measure`), the value-weighted centre
       of mass and the sum (the flux) among the columns.

    Parameters
    ----------
    image : array_like, cupy.ndarray, dask.array.Array or xarray.DataArray
        The image (real integers, float32 or float64; 2-D usually, any dimensionality works).
        Dask arrays are persisted once and every step reads the persisted chunks.
    kappa : float
        κ of the background clipping.
    nsigma : float
        Threshold in standard deviations of the clipped background, above its median.
    structure : array_like, optional
        Connectivity of the labelling, as :func:`scipy.ndimage.label` takes it (default: the
        cross, edge neighbours only).

    Returns
    -------
    Sources
        Unpacks as ``catalogue, labels``. ``catalogue`` is
        :func:`chunkernels.ndimage.measure`'s table (a dict of 1-D arrays), one row per source in
        label order: columns ``label``, ``area`` (pixels), ``sum`` (the source's flux: the sum of
        its pixel values, as the lesson's ``sum_labels``), ``mean``, ``min``, ``max`` (the peak),
        ``centroid-0`` and ``centroid-1`` (the mean coordinates, row and column),
        ``center_of_mass-0`` and ``center_of_mass-1`` (the value-weighted centre, as the lesson's
        ``center_of_mass``), ``bbox-0`` .. ``bbox-3`` (first row, first column, last row + 1,
        last column + 1). The columns are of the image's array type; for Dask they are lazy and
        share one graph: ``catalogue.compute()`` computes them all in one task.
        ``labels`` is the label image, of the image's array type (lazy for Dask; a DataArray
        labelled as the image). The result also carries ``background`` (:class:`ClipResult`)
        and ``threshold``.

    Raises
    ------
    ValueError
        ``kappa`` or ``nsigma`` is not a finite number (``kappa`` positive).

    Notes
    -----
    The lesson thresholds at ``5 * std``, leaving out the median: the same level when the
    background's median is 0, as in its radio image (1.6e-05 Jy/beam against a std of 0.013).
    Adding the median keeps the threshold right for images whose background is not centred on 0.
    """
    kappa, _ = _check_arguments(kappa, None)
    if isinstance(nsigma, bool) or not isinstance(nsigma, numbers.Real) or not math.isfinite(nsigma):
        raise ValueError(f"nsigma={nsigma!r}; expected a finite number of standard deviations "
                         f"(the lesson uses 5)")
    from chunkernels.ndimage import label, measure

    # the labels need the chunks' sizes: refused here, before the background is computed
    image = as_input(image, "find_sources", "image", chunk_sizes=True)
    ksc.check_dtype(image.dtype)
    if kind.dask:
        image = image.persist()
    background = clip(kind, image, kappa)
    level = float(background.median) + nsigma * background.std
    mask = apply_kernel(kind, image, "threshold", params={"value": np.float64(level)})
    labels, _ = label(mask, structure)
    catalogue = measure(image, labels, properties=CATALOGUE, as_frame=False)
    return Sources(catalogue, labels, background, level)
