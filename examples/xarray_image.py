"""Smooth, zoom and label a Dask-backed xarray image: every result keeps the image's labels.

A synthetic radio image on a regular sky grid (declination and right ascension in degrees, the
observing frequency as a scalar coordinate) is held as a Dask-backed DataArray, as
``xarray.open_dataset(..., chunks=...)`` gives it. chunkernels smooths it, zooms it by 2 and
labels its sources: results on the image's grid come back as DataArrays with its dims,
coordinates, attributes and name, the zoomed one with its coordinates resampled onto the new
grid, and the count of sources as a plain (lazy) value. Nothing is computed until asked; the
results are then checked against SciPy. docs/interop.md includes part of this file.

    python examples/xarray_image.py
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import scipy.ndimage as ndi
import xarray as xr

from chunkernels import ndimage


def sky(n: int = 256, seed: int = 0) -> xr.DataArray:
    """Noise and a dozen bright sources on a 0.01-degree grid."""
    rng = np.random.default_rng(seed)
    data = rng.normal(0.0, 1.0, (n, n))
    for y, x in rng.integers(10, n - 10, (12, 2)):
        data[y - 2:y + 3, x - 2:x + 3] += 20.0
    return xr.DataArray(
        data.astype(np.float32), dims=("dec", "ra"), name="flux", attrs={"units": "Jy/beam"},
        coords={"dec": 52.0 + 0.01 * np.arange(n), "ra": 120.0 + 0.01 * np.arange(n),
                "freq_mhz": 144.0})


def main() -> None:
    image = sky().chunk(64)  # Dask-backed, as open_dataset(..., chunks=64) gives it
    # --8<-- [start:xarray]
    smooth = ndimage.gaussian_filter(image, 1.5)  # a lazy DataArray, labelled as image
    fine = ndimage.zoom(smooth, 2, order=1)  # dec and ra resampled onto the 512 x 512 grid
    labels, count = ndimage.label(smooth > 5)  # labels on the image's grid, count a plain value
    # --8<-- [end:xarray]
    for result in (smooth, fine, labels):
        assert isinstance(result, xr.DataArray) and isinstance(result.data, da.Array)
        assert result.dims == image.dims and result.attrs == image.attrs
    assert smooth.coords.equals(image.coords) and labels.coords.equals(image.coords)
    np.testing.assert_allclose(fine.ra.values, np.linspace(120.0, 122.55, 512))
    assert fine.freq_mhz.item() == 144.0
    print(f"smooth: {smooth.dims} {smooth.shape}, lazy, coordinates {list(smooth.coords)}")
    print(f"fine: {fine.shape}, ra {float(fine.ra[0]):.4f} .. {float(fine.ra[-1]):.4f} "
          f"in steps of {float(fine.ra[1] - fine.ra[0]):.5f}")

    host = image.values
    expected_smooth = ndi.gaussian_filter(host, 1.5)
    expected_labels, expected_count = ndi.label(expected_smooth > 5)
    np.testing.assert_allclose(smooth.values, expected_smooth, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fine.values, ndi.zoom(expected_smooth, 2, order=1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(labels.values, expected_labels)
    assert int(count) == expected_count
    print(f"labels: {int(count)} sources; verified against scipy.ndimage")


if __name__ == "__main__":
    main()
