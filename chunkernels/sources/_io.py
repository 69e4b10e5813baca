"""Images from files as lazy Dask arrays: FITS, TIFF, Zarr and ``.npy``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from chunkernels import _graph

#: File name endings :func:`read_image` reads, by format.
FORMATS = {"FITS": (".fits", ".fit", ".fts", ".fits.gz"), "TIFF": (".tif", ".tiff"),
           "Zarr": (".zarr",), "NumPy": (".npy",)}


def read_image(path, chunks=None):
    """Open an image file as a lazy Dask array, read chunk by chunk when computed.

    Parameters
    ----------
    path : str or os.PathLike
        A FITS (``.fits``, ``.fit``, ``.fts``; astropy), TIFF (``.tif``, ``.tiff``; tifffile,
        tiles read on demand), Zarr (``.zarr``) or NumPy (``.npy``, memory-mapped) file.
    chunks : int, tuple or None
        Dask chunks of the result (of its axes after the axes of length one are dropped: a
        ``(1, 1, N, N)`` cube takes ``chunks=(c, c)``); None keeps the file's own chunking (Zarr
        chunks, TIFF tiles) or lets Dask choose.

    Returns
    -------
    dask.array.Array
        The image in native byte order (FITS stores big-endian values: each chunk is converted
        as it is read, as the GPU lesson converts the whole image), with axes of length one
        dropped, the leading ones first, while more than two axes remain (a radio image's
        ``(1, 1, rows, cols)`` cube, Stokes and frequency axes of one plane each, becomes
        ``(rows, cols)``; so does a ``(rows, cols, 1)`` single-channel TIFF).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        Its ending is not one of the formats above.
    ImportError
        The format's reader (astropy, tifffile, zarr) is not installed:
        ``pip install 'chunkernels[demo]'``.
    """
    import dask.array as da

    path = Path(os.fspath(path))
    if not path.exists():
        raise FileNotFoundError(f"no image file at {str(path)!r}")
    kind = image_format(path)
    if kind == "FITS":
        astropy_fits = _require("astropy.io.fits", "astropy")
        source = astropy_fits.getdata(path, memmap=not path.name.lower().endswith(".gz"))
    elif kind == "TIFF":
        tifffile = _require("tifffile", "tifffile")
        zarr = _require("zarr", "zarr")
        source = zarr.open(tifffile.imread(path, aszarr=True), mode="r")
    elif kind == "Zarr":
        zarr = _require("zarr", "zarr")
        source = zarr.open(str(path), mode="r")
    else:
        source = np.load(path, mmap_mode="r")
    dropped = degenerate_axes(source.shape)
    # the chunks the caller gave are those of the axes kept: the dropped ones take chunks of 1
    if isinstance(chunks, (tuple, list)) and len(chunks) == len(source.shape) - len(dropped):
        given = iter(chunks)
        chunks = tuple(1 if axis in dropped else next(given) for axis in range(len(source.shape)))
    if kind in ("TIFF", "Zarr"):
        image = da.from_zarr(source, chunks=chunks)
    else:
        image = da.from_array(source, chunks=chunks or "auto")
    if dropped:
        image = image[tuple(0 if axis in dropped else slice(None) for axis in range(image.ndim))]
    return _graph.native(image)


def degenerate_axes(shape) -> tuple[int, ...]:
    """The axes of length one :func:`read_image` drops from an array of ``shape``: leading ones
    first, then the others, while more than two axes remain."""
    ones = [axis for axis, n in enumerate(shape) if n == 1]
    return tuple(ones[:max(0, len(shape) - 2)])


def image_format(path) -> str:
    """The format name of ``path`` (a key of :data:`FORMATS`) from its ending, else ValueError."""
    name = Path(os.fspath(path)).name.lower()
    for kind, endings in FORMATS.items():
        if name.endswith(endings):
            return kind
    accepted = ", ".join(f"{kind} ({' '.join(endings)})" for kind, endings in FORMATS.items())
    raise ValueError(f"cannot tell the format of {str(path)!r} from its name; chunkernels reads "
                     f"{accepted}")


def _require(module, package):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"reading this image needs {package}, which is not installed: "
                          f"pip install 'chunkernels[demo]' (or pip install {package})") from exc
