"""The passes of κ-σ clipping and the loop that drives them, for CuPy arrays and Dask arrays.

Each round of the lesson's loop is one pass of the ``kappa_sigma_clip`` reduction kernel
(``chunkernels/kernels/kappa_sigma_clip.py``) that counts and sums the values still kept and
histograms their keys, then one (float32) to three (float64) passes that refine the histogram bin
holding the median until it is exact. :func:`clip_steps` is that loop as a generator of passes;
whatever runs the passes drives it: :class:`DevicePasses` (CuPy blocks in this process),
:class:`HostPasses` (NumPy blocks in this process: a cluster worker's share),
:class:`GraphPasses` (a Dask graph per pass) and, on a distributed cluster, the workers' actors
(``chunkernels/sources/_clip_cluster.py``). Only a few numbers come back to the host per pass.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from chunkernels import cluster, cuda
from chunkernels._apply import apply
from chunkernels.kernels import kappa_sigma_clip as ksc


class ClipResult(NamedTuple):
    """Statistics of the values κ-σ clipping keeps.

    Attributes
    ----------
    median
        Exact median of the kept values, as :func:`numpy.median` gives it (a NumPy scalar of the
        input's float type, float64 for integers; NaN when nothing is kept).
    std
        Population standard deviation of the kept values (``ddof=0``), computed in float64.
    count
        Number of kept values.
    iterations
        Clipping rounds performed: the number of times the lesson's loop computes a median and a
        standard deviation. When ``converged``, the last round clipped nothing.
    lower, upper
        The kept values are exactly those strictly inside ``(lower, upper)`` (float64): the
        intersection of every round's window ``median ± kappa * std``.
    mean
        Mean of the kept values (float64).
    converged
        Whether clipping stopped because a round clipped nothing (else ``max_iters`` stopped it).
    """

    median: np.floating
    std: float
    count: int
    iterations: int
    lower: float
    upper: float
    mean: float
    converged: bool


def median_type(dtype) -> np.dtype:
    """The type :func:`numpy.median` returns for data of ``dtype``."""
    return np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)


def window_of(median, std, kappa):
    centre = float(median)
    return centre - kappa * std, centre + kappa * std


def intersect(lower, upper, lo, hi):
    if math.isnan(lo) or math.isnan(lower):
        return math.nan, math.nan
    return max(lower, lo), min(upper, hi)


# -- the loop ----------------------------------------------------------------------------------------

def clip_with_passes(run, dtype, kappa, max_iters, first=None) -> ClipResult:
    """The lesson's loop with each round's statistics from passes of the kappa_sigma_clip kernel.

    ``run(**params)`` performs one pass over all the data and returns its result (a NumPy
    vector of ``ksc.HEAD`` values), ``run.many(passes)`` a batch of them (see :func:`drive`);
    ``run.fuse`` says whether the loop batches passes (:func:`clip_steps`); ``first`` is the
    first value of the data (default: ``run.first_value()``), the shift of the first round's
    sums.
    """
    first = run.first_value() if first is None else first
    return drive(clip_steps(dtype, kappa, max_iters, run.nbins, first, run.fuse), run)


def drive(steps, run):
    """Run the passes a :func:`clip_steps` generator asks for; its result. A pass is a dict of
    parameters, run by ``run(**params)``; a batch a list of them, run by ``run.many(batch)``,
    whose results come back as a list: ``(head, histogram)`` for a pass that asks for its
    ``histogram``, the head row otherwise."""
    try:
        params = next(steps)
        while True:
            result = run.many(params) if isinstance(params, list) else run(**params)
            params = steps.send(result)
    except StopIteration as stop:
        return stop.value


def split(params):
    """``(the kernel's parameters, whether the pass returns its histogram)``."""
    if "histogram" not in params:
        return params, False
    params = dict(params)
    return params, bool(params.pop("histogram"))


def clip_steps(dtype, kappa, max_iters, nbins, first, fuse=False):
    """The lesson's loop as a generator of passes: it yields the parameters of each pass and is
    sent the pass's result back; it returns the :class:`ClipResult`.

    The first pass sees every value; each later one only the values whose keys lie in the window
    kept so far, so NaNs are counted once, in the first. Where the float64 sums of a round
    overflow (values beyond about 1e154), an extremes pass finds the largest magnitude and the
    round is passed again with its sums scaled by a power of two (kept for the later rounds),
    which makes them exact multiples of the unscaled ones: the statistics are those of the
    definition (:func:`chunkernels.sources.clip_reference`), finite wherever the values are.

    With ``fuse`` (or where ``fuse()``, asked at each round, says so), a round's last median
    pass goes out with the next round's passes in one batch (a list of parameters, sent back a
    list of results; see :func:`_next_round`): where each pass costs a round trip (a cluster, a
    graph per pass) a round then costs one trip instead of two. The kept values, counts and medians are the same; the float64 sums of those rounds are
    added in another order, so their std may differ in the last bits from the unfused loop's.
    Every runner of NumPy blocks fuses, so they all give the same bits.
    """
    dtype = ksc.check_dtype(dtype)
    window = ksc.all_keys(dtype)
    lower, upper = -math.inf, math.inf
    center, scale = float(first), 1.0
    size_before, iterations, before = None, 0, None
    known = None  # this round's statistics, from the previous round's batch
    tiles = None  # the batch's tail (_Tiles): later rounds' statistics without a pass
    medians = []  # keys near the rounds' medians, whose steps judge whether a tail is worth it
    while True:
        resolved = None if tiles is None else tiles.statistics(window, dtype)
        if resolved is not None:
            count, mean, std, median = resolved
            nans = 0
        elif known is None:
            tiles = None
            head = yield first_pass(window, nbins, center, scale)
            count = int(head[ksc.COUNT])
            nans = int(head[ksc.NANS]) if size_before is None else 0
            bins, ranks = ksc.fit_bins(*window, nbins), None
        else:
            tiles = None
            count, nans, head, bins, ranks, mean, std = known
        size = count + nans
        if size_before == size:
            median, std, mean = before
            return ClipResult(median, std, size, iterations, lower, upper, mean, True)
        ahead = None
        if resolved is not None:
            pass  # the tail gave the median too
        elif nans or count == 0:
            median, std, mean = median_type(dtype).type(np.nan), math.nan, math.nan
        else:
            if known is None:
                mean, std, finite = _moments(head, count, center, scale)
                if not finite:
                    rescaled = yield from _rescale_steps(window, center)
                    if rescaled is not None:  # else: infinite values, a NaN std as np.std gives
                        scale = rescaled
                        head = yield first_pass(window, nbins, center, scale)
                        mean, std, _ = _moments(head, count, center, scale)
            last = max_iters is not None and iterations == max_iters
            plan = None
            fused = fuse() if callable(fuse) else fuse
            if fused and not last and scale == 1.0 and math.isfinite(std):
                plan = functools.partial(_next_round, window, std, kappa, dtype, nbins, medians)
            median, ahead = yield from _median_steps(head, bins, ranks, window, count, dtype,
                                                     nbins, plan)
        if max_iters is not None and iterations == max_iters:
            return ClipResult(median, std, size, iterations, lower, upper, mean, False)
        iterations += 1
        lo, hi = window_of(median, std, kappa)
        lower, upper = intersect(lower, upper, lo, hi)
        new = ksc.window_keys(lo, hi, dtype)
        window = (max(window[0], new[0]), min(window[1], new[1]))
        if math.isfinite(median):
            center = float(median)
            medians.append(_key_near(median, dtype))
        size_before, before = size, (median, std, mean)
        known = None if ahead is None else _round_from(ahead, window, dtype)
        if ahead is not None:
            tiles = _Tiles.of(ahead, dtype)


def first_pass(window, nbins, center, scale=1.0):
    """The parameters of a round's first pass: the moments and histogram of ``window``."""
    return {"window": window, "bins": ksc.fit_bins(*window, nbins), "center": center,
            "scale": scale}


def _next_round(window, std, kappa, dtype, nbins, medians, bounds):
    """The next round's passes, to go out with this round's last median pass, whose median lies
    in ``bounds`` (its smallest and largest possible value); None where they cannot be planned.

    The next window, this one cut to ``median ± kappa * std``, lies between an inner window (its
    smallest possible) and two edge zones of keys that it may or may not keep. The passes: the
    moments and histogram of the inner window (shifted by the lowest possible median), and a
    histogram of single keys over each zone (at most ``nbins`` keys), whose values are known
    from their keys. :func:`_round_from` turns their results into the round's statistics once
    the median is known. Zones wider than the histogram (far from any usual data) are not
    planned.

    Where the loop is converging (``medians``, the keys near the earlier rounds' medians, say
    the median is about to stay within a histogram's width of keys), the passes of a *tail*
    follow (:func:`_tail`): enough to find the later rounds' statistics too, each round on the
    host, without another trip (:class:`_Tiles`)."""
    lo_key, hi_key = window
    low, high = (float(v) for v in bounds)
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    edges = [ksc.window_keys(*window_of(v, std, kappa), dtype) for v in (low, high)]
    if any(a > b for a, b in edges):
        return None
    (first_lo, first_hi), (last_lo, last_hi) = edges
    inner = (max(lo_key, last_lo), min(hi_key, first_hi))
    zones = ((max(lo_key, first_lo), inner[0] - 1), (inner[1] + 1, min(hi_key, last_hi)))
    if inner[0] > inner[1] or any(b - a + 1 > nbins for a, b in zones):
        return None
    passes = [{"window": inner, "bins": ksc.fit_bins(*inner, nbins), "center": low,
               "scale": 1.0, "histogram": True}]
    for a, b in zones:
        if a <= b:
            passes.append(_keys_pass((a, b)))
    tail = _tail(zones, bounds, dtype, nbins, medians)
    if tail is not None:
        tail = (tail, len(passes))
        passes += [_keys_pass(piece) if zone else _moments_pass(piece, low)
                   for zone, piece in tail[0]]
    return passes, inner, zones, low, tail


def _keys_pass(keys):
    """A pass counting the values of each key of the range ``keys`` (a histogram of single
    keys, whose values are known from the keys)."""
    return {"window": keys, "bins": (*keys, 0), "moments": False, "ranks": (0, 0),
            "histogram": True}


def _moments_pass(keys, center):
    """A pass counting and summing the values of the range ``keys`` (no histogram)."""
    return {"window": keys, "max_in": (1, 0), "center": center, "scale": 1.0}


def _tail(zones, bounds, dtype, nbins, medians):
    """The pieces of a tail, or None where the loop is not yet converging: ``[(is_zone, keys),
    ...]``, consecutive key ranges that tile the keys from the lowest possible lower edge of the
    next window (``zones[0][0]``) to the highest possible upper one (``zones[1][1]``).

    Zones of single keys, ``nbins`` keys a pass: one from each of those edges inwards (where
    the later rounds' edges go, as the windows only shrink) and up to :data:`TAIL_PASSES`
    around this round's median (``bounds``); between them, ranges whose values are only
    counted and summed. Any later window whose edges lie in the edge zones, and whose median
    lies in a zone, then has its statistics on the host. Worth its passes only where the median
    is settling (a step shorter than the one before): the zones reach as far again as its last
    step, or three times that step extrapolated as a geometric series, whichever is longer.
    A tail that misses costs passes, not trips: the batch's own passes still give the next
    round, as they do without a tail."""
    if len(medians) < 2:
        return None
    low, high = (_key_near(v, dtype) for v in bounds)
    mid = (low + high) // 2
    step, before = abs(mid - medians[-1]), abs(medians[-1] - medians[-2])
    if step >= before:
        return None
    reach = max(step, 3 * (step * step // (before - step))) + (high - low) // 2 + 1
    if 2 * reach + 1 > TAIL_PASSES * nbins:
        return None
    first, last = zones[0][0], zones[1][1]
    wanted = [(first, first + nbins - 1), (mid - reach, mid + reach),
              (last - nbins + 1, last)]
    merged = []
    for a, b in sorted((max(a, first), min(b, last)) for a, b in wanted):
        if a > b:
            continue
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    pieces = []
    for a, b in merged:
        if pieces:
            pieces.append((False, (pieces[-1][1][1] + 1, a - 1)))
        for start in range(a, b + 1, nbins):
            pieces.append((True, (start, min(b, start + nbins - 1))))
    return pieces


#: Most passes of single keys a tail spends around the median.
TAIL_PASSES = 8


def _key_near(value, dtype):
    """The key of the value of ``dtype`` nearest ``value`` (a median: the mean of two values)."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        info = np.iinfo(dtype)
        value = min(max(round(float(value)), info.min), info.max)
    return ksc.key_of(value, dtype)


def _round_from(ahead, window, dtype):
    """The round's ``(count, nans, head, bins, ranks, mean, std)`` from the passes
    :func:`_next_round` planned (``ahead``: the plan and their results) now that its window is
    known; None where its median's ranks fall outside the inner window or its sums overflow
    (the round then takes a pass of its own)."""
    (passes, inner, zones, center, _), results = ahead
    head, histogram = results[0]
    if not (zones[0][0] <= window[0] <= inner[0] and inner[1] <= window[1] <= zones[1][1]):
        return None  # not what the plan allowed for: no shortcut
    count, total, squares = (float(head[f]) for f in (ksc.COUNT, ksc.SUM, ksc.SUMSQ))
    below = 0
    kept = iter(results[1:])
    for (a, b), keep in zip(zones, ((window[0], zones[0][1]), (zones[1][0], window[1]))):
        if a > b:
            continue
        counts = next(kept)[1]
        part = counts[keep[0] - a:keep[1] - a + 1]
        at = np.flatnonzero(part)
        if at.size:
            n = part[at]
            t, q = _weighted_sums(n, _deviations(keep[0], at, dtype, center))
            total += t
            squares += q
            count += float(n.sum())
            if a < inner[0]:
                below = int(n.sum())
    count = int(count)
    inside = int(head[ksc.COUNT])
    ranks = ((count - 1) // 2 - below, count // 2 - below)
    if count == 0 or ranks[0] < 0 or ranks[1] >= inside:
        return None
    row = np.zeros(ksc.HEAD)
    row[ksc.COUNT], row[ksc.SUM], row[ksc.SUMSQ] = count, total, squares
    mean, std, finite = _moments(row, count, center, 1.0)
    if not finite:
        return None
    head = ksc.select_bins(head.copy(), histogram, ranks)
    return count, 0, head, passes[0]["bins"], ranks, mean, std


class _Tiles:
    """The results of a tail's passes (:func:`_tail`): the counts of single keys over its
    zones and the counts and sums between them, from which :meth:`statistics` gives a round's
    statistics on the host, for any window whose edges and median they resolve."""

    def __init__(self, pieces, center):
        # (is_zone, data, lo, hi) in key order: a zone's data is (offsets of its filled keys
        # from lo, their counts, their values less center), a counted range's its head row
        self.pieces = pieces
        self.center = center
        self.start, self.end = pieces[0][2], pieces[-1][3]

    @classmethod
    def of(cls, ahead, dtype):
        """The tiles of a batch's tail (None where the batch had none)."""
        (_, _, _, center, tail), results = ahead
        if tail is None:
            return None
        spec, start = tail
        pieces = []
        for (zone, (a, b)), result in zip(spec, results[start:]):
            if zone:
                counts = result[1]
                at = np.flatnonzero(counts)
                data = at, counts[at].astype(np.int64), _deviations(a, at, dtype, center)
                pieces.append((True, data, a, b))
            else:
                pieces.append((False, result, a, b))
        return cls(pieces, center)

    def statistics(self, window, dtype):
        """``(count, mean, std, median)`` of the values in ``window``, or None where its edges
        or its median lie in a range that was only counted (or outside the tiles), or where it
        keeps nothing (the loop's own passes say what that means)."""
        a, b = window
        if a > b or a < self.start or b > self.end:
            return None
        n, total, squares = 0, 0.0, 0.0
        parts = []  # (count, zone start, offsets, counts) in key order; no offsets: counted
        for zone, data, lo, hi in self.pieces:
            if hi < a or lo > b:
                continue
            if not zone:
                inside = int(data[ksc.COUNT])
                if inside and (lo < a or hi > b):
                    return None  # an edge among values only counted
                if inside:
                    n += inside
                    total += float(data[ksc.SUM])
                    squares += float(data[ksc.SUMSQ])
                    parts.append((inside, lo, None, None))
                continue
            # offsets from the zone's start, small integers: searching 64-bit keys themselves
            # would compare them as float64 where NumPy mixes int64 and uint64
            at, counts, d = data
            i = np.searchsorted(at, max(a, lo) - lo)
            j = np.searchsorted(at, min(b, hi) - lo, "right")
            if i == j:
                continue
            c, dd = counts[i:j], d[i:j]
            inside = int(c.sum())
            n += inside
            t, q = _weighted_sums(c, dd)
            total += t
            squares += q
            parts.append((inside, lo, at[i:j], c))
        if n == 0:
            return None
        middle = []
        for rank in ((n - 1) // 2, n // 2):
            below = 0
            for inside, lo, at, counts in parts:
                if rank < below + inside:
                    if at is None:
                        return None  # the median among values only counted
                    k = np.searchsorted(np.cumsum(counts), rank - below, "right")
                    middle.append(lo + int(at[k]))
                    break
                below += inside
        row = np.zeros(ksc.HEAD)
        row[ksc.COUNT], row[ksc.SUM], row[ksc.SUMSQ] = n, total, squares
        mean, std, finite = _moments(row, n, self.center, 1.0)
        if not finite:
            return None
        median = _middle(ksc.values(np.asarray(middle, dtype=np.uint64), dtype), n)
        return n, mean, std, median


def _deviations(first, offsets, dtype, center):
    """The values of the keys ``first + offsets`` (``offsets`` small non-negative integers),
    less ``center``, in float64."""
    keys = np.uint64(first) + np.asarray(offsets).astype(np.uint64)
    return ksc.values(keys, dtype).astype(np.float64) - center


def _weighted_sums(counts, deviations) -> tuple[float, float]:
    """``(Σ c·d, Σ c·d²)`` of the keys' ``counts`` and ``deviations`` (float64). NumPy's own
    loops, not ``np.dot``: a dot product of this length goes to the BLAS, whose threads (one
    per core) wait for cores that GPU workers keep busy; on a four-H100 host a κσ call's tail,
    a few dozen of them, took 0.2-0.4 s instead of milliseconds."""
    weighted = counts * deviations
    return float(weighted.sum()), float((weighted * deviations).sum())


def _moments(head, count, center, scale):
    """``(mean, std, finite)`` of the ``count`` values a pass summed (``(x - center) * scale``);
    ``finite`` is False where a float64 sum or square overflowed."""
    total, squares = float(head[ksc.SUM]), float(head[ksc.SUMSQ])
    var = (squares - total * total / count) / count
    std = math.sqrt(var) if var > 0 else (0.0 if var <= 0 else math.nan)
    finite = math.isfinite(total) and math.isfinite(squares) and math.isfinite(total * total)
    return center + total / count / scale, std / scale, finite


def _rescale_steps(window, center):
    """A power of two that keeps every ``(x - center) * scale`` of the window below 2 in
    magnitude, from a pass finding its largest and smallest values; None when one is infinite."""
    extremes = yield {"window": window, "max_in": window, "min_in": window, "moments": False}
    largest, smallest = float(extremes[ksc.AMAX]), float(extremes[ksc.BMIN])
    if not (math.isfinite(largest) and math.isfinite(smallest)):
        return None
    return math.ldexp(1.0, -max(math.frexp(v)[1] for v in (largest, smallest, center)))


def _median_steps(head, bins, ranks, window, count, dtype, nbins, plan=None):
    """The exact median of the ``count`` values in ``window``, from a pass's ``head`` (its
    histogram ``bins`` covered the values, its ``sel`` fields hold ``ranks``, by default the
    middle ones of ``count``) and refinement passes (a generator, as :func:`clip_steps`).

    ``plan(bounds)`` gives passes to go out with the last of them (:func:`_next_round`). Returns
    ``(median, ahead)``: ``ahead`` is that plan and its passes' results (None without)."""
    ranks = ((count - 1) // 2, count // 2) if ranks is None else ranks
    lo, hi, shift = bins
    while True:
        (b1, before1), (b2, _) = ((int(head[ksc.SEL + 3 * j]), int(head[ksc.SEL + 3 * j + 1]))
                                  for j in (0, 1))
        if shift == 0:  # single-key bins: the keys themselves
            middle = ksc.values([lo + b1, lo + b2], dtype)
            return _middle(middle, count), None
        if b1 != b2:  # the lower middle value ends bin b1, the upper one starts bin b2
            low, high = _bin_keys(lo, hi, shift, b1), _bin_keys(lo, hi, shift, b2)
            last = {"window": window, "max_in": low, "min_in": high, "moments": False}
            extremes, ahead = yield from _last_pass(last, (low[0], high[1]), dtype, plan)
            middle = np.array([extremes[ksc.AMAX], extremes[ksc.BMIN]]).astype(dtype)
            return _middle(middle, count), ahead
        ranks = (ranks[0] - before1, ranks[1] - before1)
        keys = _bin_keys(lo, hi, shift, b1)
        lo, hi, shift = ksc.fit_bins(*keys, nbins)
        refine = {"window": window, "bins": (lo, hi, shift), "ranks": ranks, "moments": False}
        if shift == 0:  # this pass finds the middle keys: the last one
            head, ahead = yield from _last_pass(refine, keys, dtype, plan)
            (b1, _), (b2, _) = ((int(head[ksc.SEL + 3 * j]), int(head[ksc.SEL + 3 * j + 1]))
                                for j in (0, 1))
            return _middle(ksc.values([lo + b1, lo + b2], dtype), count), ahead
        head = yield refine


def _last_pass(params, keys, dtype, plan):
    """The median's last pass, batched with ``plan``'s passes where it gives some (the median
    lies between the values of ``keys``): ``(its result, ahead)``."""
    planned = None if plan is None else plan(ksc.values(list(keys), dtype))
    if planned is None:
        result = yield params
        return result, None
    results = yield [params, *planned[0]]
    return results[0], (planned, results[1:])


def _middle(middle, count):
    """np.median's value: the mean of the middle one or two, in the data's float type."""
    return np.mean(middle[:1] if count % 2 else middle)


def _bin_keys(lo, hi, shift, b):
    first = lo + (b << shift)
    return first, min(hi, first + (1 << shift) - 1)


# -- the passes --------------------------------------------------------------------------------------

class DevicePasses:
    """Passes over CuPy blocks held in this process, one device row per GPU: every block's
    kernel accumulates into its device's row, so a pass costs one launch per block, the rank
    selection and one small copy to the host."""

    def __init__(self, blocks):
        cp = cuda.cupy()
        self.blocks = [b for b in blocks if b.size]
        self.dtype = blocks[0].dtype
        self.passes = 0
        devices = sorted({b.device.id for b in self.blocks}) or [cp.cuda.runtime.getDevice()]
        self.walks = []  # per device, the launches of a pass: its contiguous blocks in one
        by_device = {}
        for b in self.blocks:
            by_device.setdefault(b.device.id, []).append(b)
        for d, on_device in by_device.items():
            with cp.cuda.Device(d):
                self.walks.append((d, ksc.run_of(on_device)))
        self.nbins = min(ksc.bins_cap(d) for d in devices)
        self.rows = {}
        for d in devices:
            with cp.cuda.Device(d):
                self.rows[d] = (cp.empty(ksc.HEAD + self.nbins, dtype=np.float64), ksc.Scratch(cp))
        self._slots = {}  # rows of the later passes of a batch, by (device, slot): made on use
        self._pinned = {}  # pinned host rows by (device, slot), made on the first pass reading one

    def first_value(self) -> float:
        return float(self.blocks[0][(0,) * self.blocks[0].ndim]) if self.blocks else 0.0

    #: One call runs the whole loop in this process: a pass costs launches, not a round trip.
    fuse = False

    def __call__(self, **params):
        params, histogram = split(params)
        if histogram:
            heads, counts = self.host_rows(**params)
            return ksc.combine(heads), counts
        p, length = self._launch(params)
        if len(self.rows) == 1:
            cp = cuda.cupy()
            (d, (row, _)), = self.rows.items()
            with cp.cuda.Device(d):
                if not p["extremes"]:
                    ksc.select(row[:length], p["ranks"])
                return row[:ksc.HEAD].get()
        return finish(*self._host_rows(length), params)

    def many(self, passes):
        return [self(**params) for params in passes]

    def host_rows(self, **params):
        """One pass, its result left uncombined: ``(heads, histogram)``, each device's head row
        and the devices' histograms added up, NumPy arrays (what a cluster worker sends)."""
        _, length = self._launch(split(params)[0])
        return self._host_rows(length)

    def host_rows_many(self, batch):
        """:meth:`host_rows` of each pass of a batch: every pass launched into a row of its
        own, then the rows read back (one wait for the device, not one a pass)."""
        lengths = [self._launch(split(params)[0], slot)[1] for slot, params in enumerate(batch)]
        return [self._host_rows(length, slot) for slot, length in enumerate(lengths)]

    def _row(self, device, slot):
        if slot == 0:
            return self.rows[device][0]
        row = self._slots.get((device, slot))
        if row is None:
            row = self._slots[device, slot] = cuda.cupy().empty_like(self.rows[device][0])
        return row

    def _launch(self, params, slot=0):
        cp = cuda.cupy()
        p = ksc.resolve(self.dtype, **ksc.validate(0, **params))
        length = ksc.HEAD + (0 if p["extremes"] else ksc.bin_count(p["bins"]))
        for d in self.rows:
            with cp.cuda.Device(d):
                cp.cuda.runtime.memsetAsync(self._row(d, slot).data.ptr, 0, length * 8,
                                            cp.cuda.get_current_stream().ptr)
        self.passes += 1
        for device, block_walks in self.walks:
            with cp.cuda.Device(device):
                ksc.launch(block_walks, self._row(device, slot), self.rows[device][1], p)
        return p, length

    def _host_rows(self, length, slot=0):
        """The devices' rows copied into pinned host buffers (one copy each, no staging): the
        head rows stacked and the histograms added up, new NumPy arrays."""
        cp = cuda.cupy()
        copies = []
        for d in self.rows:
            row = self._row(d, slot)
            with cp.cuda.Device(d):
                host = self._pinned.get((d, slot))
                if host is None:
                    import cupyx  # with CuPy, as this class is

                    host = self._pinned[d, slot] = cupyx.empty_pinned(row.size, np.float64)
                row[:length].get(out=host[:length], blocking=True)
                copies.append(host[:length])
        heads = np.stack([c[:ksc.HEAD] for c in copies])
        histogram = copies[0][ksc.HEAD:].copy()
        for c in copies[1:]:
            histogram += c[ksc.HEAD:]
        return heads, histogram


class HostPasses:
    """Passes over NumPy blocks held in this process (a cluster worker's share of them): each
    block's statistics as the graph's partial tasks compute them (:func:`kappa_sigma_clip.partial
    <chunkernels.kernels.kappa_sigma_clip.partial>`), combined in block order."""

    def __init__(self, blocks):
        self.blocks = [np.asarray(b) for b in blocks]
        self.nbins = ksc.NBINS
        self.passes = 0

    def first_value(self) -> float:
        return next((float(b.reshape(-1)[0]) for b in self.blocks if b.size), 0.0)

    #: Each pass may be a round trip (a cluster's client drives them): passes are batched, and
    #: every runner of NumPy blocks batches them alike (the same sums, to the last bit).
    fuse = True

    def __call__(self, **params):
        params, histogram = split(params)
        heads, counts = self.host_rows(**params)
        return (ksc.combine(heads), counts) if histogram else finish(heads, counts, params)

    def many(self, passes):
        return [self(**params) for params in passes]

    def host_rows_many(self, batch):
        return [self.host_rows(**params) for params in batch]

    def host_rows(self, **params):
        """One pass, its result left uncombined: ``(heads, histogram)``, each block's head row
        (in block order) and the blocks' histograms added up."""
        params = ksc.validate(0, **split(params)[0])
        self.passes += 1
        heads, histogram = [], None
        for block in self.blocks:
            row = ksc.partial(block, **params)[0]
            heads.append(row[:ksc.HEAD])
            if histogram is None:
                histogram = row[ksc.HEAD:]
            else:
                histogram += row[ksc.HEAD:]
        return np.stack(heads), histogram


def finish(heads, histogram, params):
    """A pass's result from its rows left uncombined: the head rows (counts and sums added in
    their order, as a graph's combining task adds its blocks' rows) and the summed histogram
    (what :func:`kappa_sigma_clip.finalize <chunkernels.kernels.kappa_sigma_clip.finalize>`
    gives for the rows joined, without joining them: this runs once per pass on the client)."""
    head = ksc.combine(heads)
    if split(params)[1]:
        return head, histogram
    if params.get("max_in") is None and params.get("min_in") is None:
        return ksc.select_bins(head, histogram, params.get("ranks"))
    head[ksc.SEL:ksc.SEL + 6] = (-1, 0, 0, -1, 0, 0)
    return head


class GraphPasses:
    """Passes as Dask graphs (one task per block and one to combine them), for chunks that are
    not in this process: on a distributed cluster's workers, or NumPy chunks run by Dask's
    threads."""

    def __init__(self, x):
        self.x = x
        self.nbins = graph_bins_cap(x)
        self.passes = 0

    def first_value(self) -> float:
        if self.x.size == 0:
            return 0.0
        value = self.x[(0,) * self.x.ndim].compute()
        return float(value.get() if cuda.is_cupy_array(value) else value)

    #: A pass is a graph: a batch is one ``dask.compute`` of its graphs, one trip instead of one
    #: each.
    fuse = True

    def __call__(self, **params):
        return self.many([params])[0]

    def many(self, passes):
        import dask

        self.passes += len(passes)
        graphs = [self._graph(params) for params in passes]
        results = []
        for params, row in zip(passes, dask.compute(*graphs)):
            row = row.get() if cuda.is_cupy_array(row) else np.asarray(row)
            results.append((row[:ksc.HEAD], row[ksc.HEAD:]) if split(params)[1] else row)
        return results

    def _graph(self, params):
        params, histogram = split(params)
        if histogram:  # apply's result is the head alone
            return ksc.rows_graph(self.x, **params)
        return apply(self.x, "kappa_sigma_clip", **params)


def graph_bins_cap(x) -> int:
    """Histogram bins every GPU that may run a block of ``x`` holds (all, for NumPy chunks)."""
    if not cuda.is_cupy_array(x._meta):
        return ksc.NBINS
    client = cluster.current()
    if client is None:  # no cluster: the blocks run on this process's GPU
        return _local_bins_cap()
    return min(client.run(_local_bins_cap).values(), default=ksc.NBINS)


def _local_bins_cap() -> int:
    """Runs where the blocks run: the bins the current GPU holds (all, without a GPU)."""
    if cuda.gpu_count() == 0:
        return ksc.NBINS
    return ksc.bins_cap(cuda.cupy().cuda.runtime.getDevice())
