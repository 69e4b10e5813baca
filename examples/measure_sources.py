"""Measuring sources in an image: the GPU lesson's step 4 (positions and integrated fluxes of every
labelled source) with chunkernels.ndimage, on NumPy, on Dask chunks and, where there is a GPU, on
CuPy. Each result is checked against scipy.ndimage. docs/measuring.md includes this file.

    python examples/measure_sources.py
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda, ndimage

# --8<-- [start:image]
# A sky of faint noise with bright compact sources; sources are what lies 5 sigma above it.
rng = np.random.default_rng(42)
sky = rng.normal(0.0, 0.01, (1024, 1024)).astype(np.float32)
rows, cols = rng.integers(0, 1024, (2, 300))
sky[rows, cols] += rng.uniform(0.5, 5.0, 300).astype(np.float32)
sky = ndi.gaussian_filter(sky, 1.5)
labels, n = ndi.label(sky > 5 * sky.std())
index = np.arange(1, n + 1)
# --8<-- [end:image]

# --8<-- [start:numpy]
positions = ndimage.center_of_mass(sky, labels, index)  # NumPy in: scipy.ndimage itself
fluxes = ndimage.sum_labels(sky, labels, index)
# --8<-- [end:numpy]
assert positions == ndi.center_of_mass(sky, labels, index)
np.testing.assert_array_equal(fluxes, ndi.sum_labels(sky, labels, index))

# --8<-- [start:dask]
dsky = da.from_array(sky, chunks=256)                 # 16 chunks
dlabels = da.from_array(labels, chunks=256)
lazy_positions = ndimage.center_of_mass(dsky, dlabels, index)   # (n, 2), lazy
lazy_fluxes = ndimage.sum_labels(dsky, dlabels, index)          # (n,), lazy
positions_d, fluxes_d = dask.compute(lazy_positions, lazy_fluxes)
# --8<-- [end:dask]
np.testing.assert_allclose(positions_d, np.array(positions), rtol=1e-9)
np.testing.assert_allclose(fluxes_d, fluxes, rtol=1e-9)

# --8<-- [start:measure]
table = ndimage.measure(dsky, dlabels, properties=("label", "area", "sum", "center_of_mass",
                                                   "bbox"))
table = table.compute()   # every column, in one pass over the chunks and one task after it
brightest = np.argsort(table["sum"])[-3:][::-1]
for i in brightest:
    print(f"source {table['label'][i]:4d}: flux {table['sum'][i]:8.3f} at "
          f"({table['center_of_mass-0'][i]:7.2f}, {table['center_of_mass-1'][i]:7.2f}), "
          f"{table['area'][i]} pixels")
# --8<-- [end:measure]
np.testing.assert_array_equal(table["label"], index)
np.testing.assert_allclose(table["sum"], fluxes, rtol=1e-9)
print(f"NumPy and Dask chunks: {n} sources verified against scipy.ndimage")

if cuda.gpu_count():
    import cupy as cp

    # --8<-- [start:cupy]
    gsky, glabels = cp.asarray(sky), cp.asarray(labels)
    gpu_positions = ndimage.center_of_mass(gsky, glabels, index)   # a CuPy array (n, 2)
    gpu_fluxes = ndimage.sum_labels(gsky, glabels, index)           # a CuPy array (n,)
    # --8<-- [end:cupy]
    np.testing.assert_allclose(gpu_positions.get(), np.array(positions), rtol=1e-9)
    np.testing.assert_allclose(gpu_fluxes.get(), fluxes, rtol=1e-9)
    print(f"CuPy: {n} sources verified against scipy.ndimage on the GPU")
else:
    print("CuPy: skipped (no CUDA GPU here)")
