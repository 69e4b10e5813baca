"""The GPU lesson's CPU code (seed 002), kept as it is: what ``chunkernels demo`` and the tests
validate chunkernels against.

``ks_clipper_cpu`` is the lesson's κ-σ clipper with ``kappa`` in place of its 3 (NumPy's
``np.median`` and ``np.std``, which accumulates float32 data in float32); :func:`find_sources_cpu`
chains it with the lesson's segmentation (``np.where(data > threshold, 1, 0)``), SciPy's
``label`` and the ``center_of_mass`` / ``sum_labels`` measurements, on a whole NumPy array.
"""

from __future__ import annotations

import contextlib

import numpy as np


def ks_clipper_cpu(data_flat, kappa=3.0):
    """The lesson's κ-σ clipper: the values kept, as a 1-D array."""
    while True:
        med = np.median(data_flat)
        std = np.std(data_flat)
        clipped_below = data_flat.compress(data_flat > med - kappa * std)
        clipped_data = clipped_below.compress(clipped_below < med + kappa * std)
        if len(clipped_data) == len(data_flat):
            break
        data_flat = clipped_data
    return data_flat


def find_sources_cpu(data, kappa=3.0, nsigma=5.0, structure=None, progress=None) -> dict:
    """The lesson's four steps on the CPU, thresholding at ``median + nsigma * std`` of the
    clipped background (the lesson's ``5 * std`` when the median is 0).

    ``progress``, when given, is called with the name of each step and returns a context manager
    that the step runs in (``chunkernels demo`` reports and times the steps with it).

    Returns
    -------
    dict
        ``median``, ``std``, ``count`` (of the clipped background, NumPy's float types),
        ``threshold``, ``labels`` (int32 label image), ``num_features``, ``positions``
        (``(n, ndim)`` centres of mass, ``scipy.ndimage.center_of_mass``) and ``fluxes``
        (``scipy.ndimage.sum_labels``), in label order.
    """
    from scipy.ndimage import center_of_mass, label, sum_labels

    step = progress or (lambda name: contextlib.nullcontext())
    data = np.asarray(data)
    with step("κσ clipping (ks_clipper_cpu)"):
        clipped = ks_clipper_cpu(data.ravel(), kappa)
        median, std = np.median(clipped), np.std(clipped)
    with step("threshold (np.where)"):
        level = median + nsigma * std
        segmented_image = np.where(data > level, 1, 0)
    with step("label (scipy.ndimage.label)"):
        labels, num_features = label(segmented_image, structure)
    with step("measure (center_of_mass, sum_labels)"):
        index = np.arange(1, num_features + 1)
        positions = np.array(center_of_mass(data, labels, index)).reshape(num_features,
                                                                           data.ndim)
        fluxes = np.asarray(sum_labels(data, labels, index), dtype=np.float64)
    return {"median": median, "std": std, "count": clipped.size, "threshold": level,
            "labels": labels, "num_features": num_features, "positions": positions,
            "fluxes": fluxes}
