"""A synthetic radio sky with a known source list, made chunk by chunk where the chunks live.

The image is Gaussian noise, a faint diffuse gradient, point sources (Gaussian PSF) and extended
elliptical Gaussian sources. It is a pure function of the pixel coordinates, the source list and
the seed: every chunk computes its own pixels, and the image is the same whatever the chunking.
The noise comes from a counter-based generator (SplitMix64's mixing function of the seed and the
pixel index, through the Box-Muller transform), so it needs no state shared between chunks and
gives the same integers on the CPU and the GPU.

NumPy chunks run the reference (:func:`render_reference`), which defines the result: noise and
gradient on the whole chunk, then each source that reaches it added over its box, in list order.
CuPy chunks are one launch of ``kernels_cuda/synthetic_sky.cu`` each (:func:`_render_cuda`): every
pixel computed as the reference computes it, its sources (listed per tile of 32 x 32 pixels by
the host) added in the same order; CUDA's exp, log and cos may differ from NumPy's in the last
bit of a float64, which float32 pixels rarely show. Each chunk's task carries only the rows of
the source list that reach its chunk (:func:`chunk_sources`, when the graph is built).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from chunkernels import cuda
from chunkernels._graph import Tasks, tokenize

#: Standard deviation of the noise, in the image's units (a radio image's Jy/beam: the GPU
#: lesson's Galactic Centre image has a clipped background std of 0.013 Jy/beam).
NOISE = 0.01
#: Standard deviation of the point-spread function, in pixels.
PSF_SIGMA = 1.5
#: Point sources per pixel (one per 100 x 100 pixels) and extended ones per point source.
DENSITY = 1e-4
EXTENDED_PER_POINT = 0.125
#: Peak signal-to-noise ranges, drawn log-uniformly: many sources too faint to detect.
POINT_SNR = (1.0, 3000.0)
EXTENDED_SNR = (1.0, 300.0)
#: Standard deviation of extended sources along their major axis, in pixels.
EXTENDED_SIGMA = (2.5, 10.0)
#: A source is drawn out to where it falls to this fraction of the noise.
TRUNCATE = 0.01
#: Peak-to-peak amplitude of the diffuse gradient, in units of the noise.
GRADIENT = 0.3

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def synthetic_sky(shape=8192, *, chunks=2048, seed=0, noise=NOISE, gpu=False):
    """A synthetic radio image and the list of the sources in it.

    Each chunk is one task computing only its pixels. With ``gpu=True`` a chunk is one launch
    of ``kernels_cuda/synthetic_sky.cu`` on the GPU of the worker that computes it (noise,
    gradient and sources together); NumPy chunks run the reference code, which defines the
    result. Each task carries only the rows of the source list that reach its chunk, picked when
    the graph is built.

    Parameters
    ----------
    shape : int or (int, int)
        Image size in pixels (an int: a square image).
    chunks : int or tuple
        Dask chunks of the image (any chunking Dask accepts).
    seed : int
        Seed of the source list and the noise (a non-negative integer).
    noise : float
        Standard deviation of the Gaussian noise.
    gpu : bool
        Make CuPy chunks, each computed on the GPU of the worker that computes it.

    Returns
    -------
    image : dask.array.Array
        The lazy float32 image; computing a chunk computes only its pixels.
    truth : dict of numpy.ndarray
        One row per source: ``id`` (from 1), ``x`` and ``y`` (the centre: column and row, in
        pixels), ``flux`` (the integral of its profile), ``peak``, ``snr`` (peak over noise),
        ``sigma_major``, ``sigma_minor`` (pixels), ``angle`` (radians, of the major axis from
        the x axis towards y) and ``extended`` (bool; point sources have the PSF's shape).

    Raises
    ------
    ValueError
        A size is not a positive integer, ``seed`` is negative, or ``noise`` is not positive.

    Notes
    -----
    On the GPU a pixel is computed with the reference's operations in the reference's order
    (its sources added in list order), in float64, and rounded to float32 once; only ``exp``,
    ``log`` and ``cos`` are CUDA's implementations, within an ulp or two of NumPy's float64
    values. A float32 pixel moves only when its float64 value lies that close to a float32
    rounding boundary: with every ``exp``, ``log`` and ``cos`` result moved by one or two ulps,
    none of the 67 million pixels of the 8192² sky moved (the kernel's code run on the CPU);
    ``tests/test_sky.py`` and ``chunkernels bench sky`` count the pixels that differ on a GPU,
    each at most one float32 ulp away.
    """
    shape = _image_shape(shape)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= _M64:
        raise ValueError(f"seed={seed!r}; expected an integer from 0 to 2**64 - 1")
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not (
            math.isfinite(noise) and noise > 0):
        raise ValueError(f"noise={noise!r}; expected a positive finite standard deviation")
    chunks = _image_chunks(chunks, shape)
    truth = sky_sources(shape, seed=seed, noise=noise)
    if gpu:
        render, meta = _render_cuda, cuda.cupy().empty((0, 0), dtype=np.float32)
    else:
        render, meta = render_reference, np.empty((0, 0), dtype=np.float32)
    return _image(render, meta, shape, chunks, int(seed), float(noise), truth), truth


def _image(render, meta, shape, chunks, seed, noise, truth):
    """The Dask array of the sky: a task per chunk, ``render(location, table, shape=, seed=,
    noise=)`` on the rows of :func:`render_table` that reach the chunk."""
    table = render_table(truth, shape, noise)
    name = f"synthetic-sky-{tokenize(render, shape, chunks, seed, noise)}"
    starts = [np.cumsum((0, *c)) for c in chunks]
    tasks = Tasks()
    for index, rows in chunk_sources(table["box"], chunks).items():
        location = tuple((int(s[i]), int(s[i + 1])) for s, i in zip(starts, index))
        tasks.add((name, *index), render, location, table[rows], shape=shape, seed=seed,
                  noise=noise)
    return tasks.array(name, chunks, np.float32, meta)


def _image_chunks(chunks, shape) -> tuple[tuple[int, ...], ...]:
    """``chunks`` as Dask normalises them for an image of ``shape``; a ValueError, before any
    work, for chunks that are not positive sizes covering the image."""
    import dask.array as da

    expected = ("expected a positive chunk side (e.g. 2048), a pair of them, or chunks Dask "
                "accepts that cover the image")
    try:
        normal = da.core.normalize_chunks(chunks, shape, dtype=np.float32)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"chunks={chunks!r} for an image of shape {shape}: {exc}; "
                         f"{expected}") from None
    if any(not c > 0 for axis in normal for c in axis) or tuple(map(sum, normal)) != shape:
        raise ValueError(f"chunks={chunks!r} for an image of shape {shape} give chunks "
                         f"{normal}; {expected}")
    return normal


def _image_shape(shape) -> tuple[int, int]:
    try:
        sizes = (shape, shape) if isinstance(shape, numbers.Integral) else tuple(shape)
    except TypeError:
        sizes = ()
    if len(sizes) != 2 or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1
                              for n in sizes):
        raise ValueError(f"shape={shape!r}; expected a positive number of pixels or a pair "
                         f"(rows, columns) of them")
    return int(sizes[0]), int(sizes[1])


def sky_sources(shape, *, seed=0, noise=NOISE) -> dict:
    """The source list of :func:`synthetic_sky` for an image of ``shape`` (drawn from ``seed``)."""
    rows, cols = _image_shape(shape)
    rng = np.random.default_rng(seed)
    area = rows * cols
    n_point = int(rng.poisson(area * DENSITY))
    n_extended = int(rng.poisson(area * DENSITY * EXTENDED_PER_POINT))
    n = n_point + n_extended
    extended = np.arange(n) >= n_point
    y = rng.uniform(-0.5, rows - 0.5, n)
    x = rng.uniform(-0.5, cols - 0.5, n)
    low = np.where(extended, EXTENDED_SNR[0], POINT_SNR[0])
    high = np.where(extended, EXTENDED_SNR[1], POINT_SNR[1])
    snr = np.exp(rng.uniform(np.log(low), np.log(high)))
    sigma_major = np.where(extended, rng.uniform(*EXTENDED_SIGMA, n), PSF_SIGMA)
    sigma_minor = sigma_major * np.where(extended, rng.uniform(0.3, 1.0, n), 1.0)
    angle = np.where(extended, rng.uniform(0.0, np.pi, n), 0.0)
    peak = snr * noise
    return {"id": np.arange(1, n + 1), "x": x, "y": y, "flux": 2 * np.pi * peak * sigma_major * sigma_minor,
            "peak": peak, "snr": snr, "sigma_major": sigma_major, "sigma_minor": sigma_minor,
            "angle": angle, "extended": extended}


#: What a chunk's task needs of a source: its centre, the cosine and sine of its angle
#: (``math.cos``, ``math.sin``), its widths and peak, and the box of the pixels it is drawn on:
#: ``[first row, end row, first column, end column)``, clipped to the image.
TABLE = np.dtype([("y", "f8"), ("x", "f8"), ("cos", "f8"), ("sin", "f8"), ("sigma_major", "f8"),
                  ("sigma_minor", "f8"), ("peak", "f8"), ("box", "i8", (4,))])


def render_table(truth, shape, noise) -> np.ndarray:
    """The sources of ``truth`` as the chunks' tasks draw them (a :data:`TABLE` array, in list
    order). A source is drawn out to where it falls to ``TRUNCATE`` times the noise."""
    n = len(truth["id"])
    table = np.empty(n, dtype=TABLE)
    for field in ("y", "x", "sigma_major", "sigma_minor", "peak"):
        table[field] = truth[field]
    table["cos"] = np.fromiter(map(math.cos, truth["angle"]), np.float64, n)
    table["sin"] = np.fromiter(map(math.sin, truth["angle"]), np.float64, n)
    radius = truth["sigma_major"] * np.sqrt(2 * np.log(truth["peak"] / (TRUNCATE * noise)))
    for axis, centre in enumerate((truth["y"], truth["x"])):
        first = np.maximum(0, np.ceil(centre - radius))
        end = np.minimum(shape[axis], np.floor(centre + radius) + 1)
        table["box"][:, 2 * axis] = np.where(first < end, first, 0)
        table["box"][:, 2 * axis + 1] = np.where(first < end, end, 0)  # empty (or NaN): 0, 0
    return table


def chunk_sources(box, chunks) -> dict[tuple, np.ndarray]:
    """Per chunk index of a grid of ``chunks``, the rows of ``box`` (boxes ``[first row, end row,
    first column, end column)``, as in :data:`TABLE`) that meet the chunk, in ascending order."""
    box = np.asarray(box, dtype=np.int64).reshape(-1, 4)
    nonempty = np.flatnonzero((box[:, 0] < box[:, 1]) & (box[:, 2] < box[:, 3]))
    offsets, members = _cells(box[nonempty], *(np.cumsum((0, *c[:-1])) for c in chunks))
    members = nonempty[members]
    sizes = [np.asarray(c) for c in chunks]
    result = {}
    for k, index in enumerate(np.ndindex(*(len(c) for c in chunks))):
        empty = any(s[i] == 0 for s, i in zip(sizes, index))
        result[index] = members[offsets[k]:offsets[k] if empty else offsets[k + 1]]
    return result


def _cells(box, row_starts, col_starts):
    """For non-empty boxes ``[first row, end row, first column, end column)`` inside a grid whose
    cells start at ``row_starts`` x ``col_starts``: ``(offsets, members)`` with
    ``members[offsets[k]:offsets[k + 1]]`` the boxes meeting cell ``k`` (row-major), ascending.

    A box covers a rectangle of cells (a zero-size cell inside it too); its cells are listed box
    by box and sorted stably by cell, so each cell keeps the boxes' order.
    """
    def span(first, end, starts):
        return (np.searchsorted(starts, first, "right") - 1,
                np.searchsorted(starts, end - 1, "right") - 1)

    i0, i1 = span(box[:, 0], box[:, 1], row_starts)
    j0, j1 = span(box[:, 2], box[:, 3], col_starts)
    wide = j1 - j0 + 1
    count = (i1 - i0 + 1) * wide
    member = np.repeat(np.arange(len(box)), count)
    k = np.arange(member.size) - np.repeat(np.cumsum(count) - count, count)
    cell = (i0[member] + k // wide[member]) * len(col_starts) + j0[member] + k % wide[member]
    ncells = len(row_starts) * len(col_starts)
    offsets = np.zeros(ncells + 1, dtype=np.int64)
    np.cumsum(np.bincount(cell, minlength=ncells), out=offsets[1:])
    return offsets, member[np.argsort(cell, kind="stable")]


def _clipped_boxes(box, location):
    """``box`` clipped to the chunk at ``location`` (``((first row, end row), (first column, end
    column))``): first row, end row, first column, end column, each an array."""
    (r0, r1), (c0, c1) = location
    return (np.maximum(box[:, 0], r0), np.minimum(box[:, 1], r1),
            np.maximum(box[:, 2], c0), np.minimum(box[:, 3], c1))


def render_reference(location, table, *, shape, seed, noise, xp=np):
    """One chunk of the sky: noise, gradient, then the sources of ``table`` that reach it, in
    table order. The reference: it defines the result. ``xp`` is ``numpy`` (CPU chunks) or
    ``cupy`` (each source a few CuPy operations: the GPU path before the kernel)."""
    (r0, r1), (c0, c1) = location
    image = noise * gaussian_noise(xp, (r0, r1), (c0, c1), shape[1], seed)
    y = xp.arange(r0, r1, dtype=np.float64)[:, None]
    x = xp.arange(c0, c1, dtype=np.float64)[None, :]
    # a faint plane across the image, 0.6 of it along x and 0.8 along y
    image += GRADIENT * noise * (0.6 * (x / max(shape[1] - 1, 1) - 0.5)
                                 + 0.8 * (y / max(shape[0] - 1, 1) - 0.5))
    first_row, end_row, first_col, end_col = _clipped_boxes(table["box"], location)
    for s in np.flatnonzero((first_row < end_row) & (first_col < end_col)):
        rows = slice(first_row[s] - r0, end_row[s] - r0)
        cols = slice(first_col[s] - c0, end_col[s] - c0)
        dy = y[rows] - table["y"][s]
        dx = x[:, cols] - table["x"][s]
        cos, sin = table["cos"][s], table["sin"][s]
        u, v = dx * cos + dy * sin, dy * cos - dx * sin
        image[rows, cols] += table["peak"][s] * xp.exp(
            -0.5 * ((u / table["sigma_major"][s]) ** 2 + (v / table["sigma_minor"][s]) ** 2))
    return image.astype(np.float32)


#: The CUDA source that renders a chunk (a library source, not a registered kernel) and its
#: entries: the chunk, and the noise's integers (for the tests).
CUDA_SOURCE = "synthetic_sky.cu"
CUDA_ENTRIES = ("synthetic_sky", "synthetic_sky_draws")
#: The kernel's tile (SKY_TILE) and its thread block (SKY_TILE x SKY_BLOCK_ROWS threads).
TILE = 32
BLOCK = (TILE, 8)
#: The doubles of a source row in the kernel's table, in its order (SKY_Y ... SKY_PEAK).
KERNEL_FIELDS = ("y", "x", "cos", "sin", "sigma_major", "sigma_minor", "peak")
#: The kernel's SkyChunk, field by field (all 8 bytes: no padding), passed by value.
CHUNK = np.dtype([("key", "<u8"), ("width", "<i8"), ("row0", "<i8"), ("col0", "<i8"),
                  ("rows", "<i8"), ("cols", "<i8"), ("noise", "<f8"), ("gradient", "<f8"),
                  ("x_span", "<f8"), ("y_span", "<f8"), ("sources", "<i8"), ("entries", "<i8"),
                  ("tiles_x", "<i8"), ("tiles_y", "<i8")])
_CHUNK_PARAM = np.dtype((np.void, CHUNK.itemsize))


def kernel_arguments(location, table, *, shape, seed, noise) -> tuple[np.ndarray, np.ndarray]:
    """What ``kernels_cuda/synthetic_sky.cu`` takes for the chunk at ``location``: the bytes of
    its tables (``data``: the rows of ``table`` that reach the chunk, their boxes relative to it,
    and per tile the sources meeting it, in table order) and its ``SkyChunk`` (a :data:`CHUNK`
    array of one element)."""
    (r0, r1), (c0, c1) = location
    rows, cols = r1 - r0, c1 - c0
    first_row, end_row, first_col, end_col = _clipped_boxes(table["box"], location)
    reach = np.flatnonzero((first_row < end_row) & (first_col < end_col))
    box = np.column_stack([first_row[reach] - r0, end_row[reach] - r0,
                           first_col[reach] - c0, end_col[reach] - c0])
    tiles_y, tiles_x = -(-rows // TILE), -(-cols // TILE)
    offsets, members = _cells(box, np.arange(0, rows, TILE), np.arange(0, cols, TILE))
    fields = np.column_stack([table[f][reach] for f in KERNEL_FIELDS]) if reach.size else ()
    data = np.concatenate([np.ascontiguousarray(fields, dtype=np.float64).view(np.uint8).ravel(),
                           *(np.ascontiguousarray(a, dtype=np.int32).view(np.uint8).ravel()
                             for a in (box, offsets, members))])
    chunk = np.zeros(1, dtype=CHUNK)
    chunk[0] = (_mix_int(seed * _GOLDEN + 1), shape[1], r0, c0, rows, cols, noise,
                GRADIENT * noise, max(shape[1] - 1, 1), max(shape[0] - 1, 1), reach.size,
                members.size, tiles_x, tiles_y)
    return data, chunk


def _render_cuda(location, table, *, shape, seed, noise):
    """One chunk of the sky on the current GPU: one launch of ``kernels_cuda/synthetic_sky.cu``
    after one upload of its tables (:func:`kernel_arguments`)."""
    cp = cuda.cupy()
    (r0, r1), (c0, c1) = location
    out = cp.empty((r1 - r0, c1 - c0), dtype=np.float32)
    if out.size == 0:
        return out
    data, chunk = kernel_arguments(location, table, shape=shape, seed=seed, noise=noise)
    tiles = int(chunk["tiles_x"][0] * chunk["tiles_y"][0])
    kernel = cuda.function(CUDA_SOURCE, "synthetic_sky")
    kernel((tiles,), BLOCK, (out, cp.asarray(data), chunk.view(_CHUNK_PARAM)))
    return out


def gaussian_noise(xp, rows, cols, width, seed):
    """Standard normal float64 values for the pixels ``rows[0]:rows[1]`` x ``cols[0]:cols[1]`` of
    an image ``width`` pixels wide: a function of the pixel index and ``seed`` only.

    Each pixel takes two outputs of SplitMix64 at counters ``2 i + 1`` and ``2 i + 2`` of the
    stream keyed by ``seed`` (``i``: the pixel's row-major index) and turns them into a normal
    value by the Box-Muller transform. ``xp`` is ``numpy`` or ``cupy``: the integers are the same.
    """
    u64 = np.uint64
    key = u64(_mix_int(seed * _GOLDEN + 1))
    index = (xp.arange(rows[0], rows[1], dtype=u64)[:, None] * u64(width)
             + xp.arange(cols[0], cols[1], dtype=u64)[None, :])
    first = _mix(key + (index * u64(2) + u64(1)) * u64(_GOLDEN))
    second = _mix(key + (index * u64(2) + u64(2)) * u64(_GOLDEN))
    scale = 2.0 ** -53
    u1 = ((first >> u64(11)) + u64(1)).astype(np.float64) * scale  # (0, 1]: log(u1) is finite
    u2 = (second >> u64(11)).astype(np.float64) * scale
    return xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(2.0 * np.pi * u2)


def _mix(z):
    """SplitMix64's mixing function on uint64 arrays (arithmetic wraps modulo 2**64)."""
    u64 = np.uint64
    z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
    return z ^ (z >> u64(31))


def _mix_int(z: int) -> int:
    """:func:`_mix` on one Python integer."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)
