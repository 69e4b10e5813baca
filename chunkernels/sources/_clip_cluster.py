"""κ-σ clipping of a Dask array persisted on a distributed cluster: the workers pass over their own
blocks, and at most one round trip per round of the loop carries only the small rows.

A Dask graph per pass (:class:`~chunkernels.sources._passes.GraphPasses`) costs a trip through the
scheduler and the graph machinery for each of the loop's passes (21 of them for the demo's sky:
seconds on a ``LocalCUDACluster``). Here every worker that holds blocks of the array has one
:class:`ClipService` actor, and

* where one worker holds every block, it runs the whole loop on them in one call;
* otherwise the client drives the loop (:func:`~chunkernels.sources._passes.clip_steps`, fused:
  a round's last median pass goes out in one batch with the next round's passes, and once the
  median settles, with the passes of a tail that give every later round on the host) and, for
  each pass or batch, calls every worker's actor at once, directly (the client's connection to
  the worker, no scheduler hop). Each actor runs the pass on its blocks (one launch per CuPy
  block into its device's row, or the NumPy partials) and returns its head rows and its
  histogram cut to the non-empty bins; the client adds them up and selects the median's bins,
  as the graph's combining task does.

The call's first trip finds the blocks and opens the call: where the client already has actors,
each is asked which of the array's blocks its worker holds (the scheduler is asked only where
the answer is not each block exactly once), and GPU workers run the loop's first pass in the
same trip, each centring its sums on its own first value (the client moves them to the
array's). The demo's 8192² sky on two GPU workers takes 6 trips: that one and 5 batches,
against a question to the scheduler, an opening trip and 11 trips before.

The result is the one the other paths give: counts and histograms are exact, NumPy blocks' sums are
added in block order (the graph's order, so the statistics are the same to the last bit), CuPy
blocks' sums in each device's launch order.

The actors are made on first use, one per worker, and kept while the client lives (the next call
needs no scheduler round trip to make them: that round trip costs more than all of a call's
passes); closing the client, or :func:`release`, releases them. They hold no blocks between
calls: each call names the keys of the blocks, which the actor reads from its worker's memory,
and drops them when the call ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sys
import threading
import time
import uuid

import numpy as np

from chunkernels import cuda
from chunkernels.kernels import kappa_sigma_clip as ksc
from chunkernels.sources._passes import (
    ClipResult,
    DevicePasses,
    HostPasses,
    _moments,
    clip_steps,
    clip_with_passes,
    first_pass,
    finish,
    split,
)


class ClipService:
    """The actor on one worker: passes of κ-σ clipping over blocks in that worker's memory.

    Every method is a coroutine, so the worker runs it as soon as the call arrives: passes over
    CuPy blocks (launches and a small copy) run on the worker's event loop, passes over NumPy
    blocks (CPU work) in a thread.
    """

    def __init__(self):
        from distributed import get_worker

        self.worker = get_worker()
        self.calls = {}

    async def execute(self, blob):
        """The method named in ``blob`` (pickled with its arguments by the client's
        ``_execute``) called, its result pickled."""
        method, args = pickle.loads(blob)
        if method not in _METHODS:
            raise ValueError(f"ClipService has no method {method!r}; it has {sorted(_METHODS)}")
        result = await getattr(self, method)(*args)
        return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)

    async def clip(self, keys, first_key, dtype, kappa, max_iters):
        """The whole loop over the blocks ``keys`` (every block of the array); ClipResult."""
        passes, first = self._passes(keys, first_key)
        return await _run(passes, clip_with_passes, passes, dtype, kappa, max_iters, first)

    async def locate(self, call, keys, first_key, dtype, kappa, max_iters):
        """Which of the blocks ``keys`` (every block of the array, in block order) this worker
        holds: where it holds them all, the whole loop's :class:`ClipResult`; otherwise
        ``(indices, bins, first, per_block, ahead)``, the positions in ``keys`` of those it
        holds (none: nothing more) and what :meth:`open` returns for them, call ``call``
        opened."""
        data = self.worker.data
        indices = [i for i, key in enumerate(keys) if key in data]
        if len(indices) == len(keys):
            return await self.clip(keys, first_key, dtype, kappa, max_iters)
        if not indices:
            return indices, None, None, None, None
        return (indices, *await self.open(call, [keys[i] for i in indices], first_key, dtype))

    async def open(self, call, keys, first_key, dtype=None):
        """Get ready for the passes of call ``call`` over the blocks ``keys``: ``(bins, first,
        per_block, ahead)``, the most histogram bins a pass here holds, the first value of
        block ``first_key`` (None when it is not among ``keys``), whether the head rows of a
        pass are the blocks' own (NumPy) or the devices' (CuPy), and, given the ``dtype`` of
        CuPy blocks, the loop's first pass over them: ``(center, what run returns)``, its sums
        centred on the first value here (the client moves them to the array's first value),
        which saves the loop a trip (None otherwise: NumPy blocks' sums are centred as every
        runner of them centres them, to the last bit)."""
        passes, first = self._passes(keys, first_key)
        self.calls[call] = passes
        ahead = None
        if dtype is not None and isinstance(passes, DevicePasses) and passes.nbins >= ksc.NBINS:
            center = passes.first_value() if first is None else first
            window = ksc.all_keys(dtype)
            ahead = center, await self.run(call, first_pass(window, ksc.NBINS, center))
        return passes.nbins, first, isinstance(passes, HostPasses), ahead

    async def run(self, call, params):
        """One pass of call ``call``: ``(heads, offset, histogram, seconds)``, the head rows,
        the histogram's non-empty bins from bin ``offset`` on, and the pass's time here."""
        passes = self.calls[call]
        start = time.perf_counter()
        heads, histogram = await _run(passes, passes.host_rows, **params)
        return (heads, *_trim(histogram), time.perf_counter() - start)

    async def run_many(self, call, batch):
        """A batch of passes of call ``call``: a list of what :meth:`run` returns for each (the
        batch's time shared out)."""
        passes = self.calls[call]
        start = time.perf_counter()
        rows = await _run(passes, passes.host_rows_many, batch)
        seconds = (time.perf_counter() - start) / max(1, len(batch))
        return [(heads, *_trim(histogram), seconds) for heads, histogram in rows]

    async def close(self, call):
        """Forget call ``call`` (and the blocks it read)."""
        self.calls.pop(call, None)

    def _passes(self, keys, first_key):
        data = self.worker.data
        missing = [k for k in keys if k not in data]
        if missing:
            raise KeyError(f"κ-σ clipping: {len(missing)} block(s) are no longer in the memory of "
                           f"worker {self.worker.address} (first: {missing[0]!r})")
        blocks = [data[k] for k in keys]
        on_gpu = [cuda.is_cupy_array(b) for b in blocks]
        passes = DevicePasses(blocks) if all(on_gpu) else HostPasses(blocks)
        first = None
        if first_key in keys:
            block = blocks[keys.index(first_key)]
            first = float(block[(0,) * block.ndim])
        return passes, first


#: The methods a client calls through :meth:`ClipService.execute`.
_METHODS = frozenset({"clip", "locate", "open", "run", "run_many", "close"})


async def _run(passes, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the event loop for CuPy passes, in a thread for NumPy ones."""
    if isinstance(passes, DevicePasses):
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def _trim(histogram):
    """``(offset, bins)``: the histogram's bins from its first non-empty one to its last, as
    uint16 or uint32 counts where they fit (a pass's reply stays small: a trip carries up to
    a dozen histograms of 65536 bins from each worker, whose counts often fit 16 bits). Where
    fewer than a quarter of those bins hold values (a histogram of single keys: a few values
    spread over many keys), ``bins`` is the pair ``(positions, counts)`` of those alone."""
    filled = histogram != 0
    if not filled.any():
        return 0, np.zeros(0, np.uint32)
    # the first and last non-empty bins (argmax of booleans stops at the first True): a
    # quarter of the time np.flatnonzero takes over 65536 bins, once a pass on every worker
    first = int(filled.argmax())
    last = histogram.size - 1 - int(filled[::-1].argmax())
    part = histogram[first:last + 1]
    at = None
    if part.size >= 64 and 4 * np.count_nonzero(filled[first:last + 1]) < part.size:
        at = np.flatnonzero(filled[first:last + 1])
        part = part[at]
    most = part.max()
    for counts in (np.uint16, np.uint32):
        if most <= np.iinfo(counts).max:
            part = part.astype(counts)
            break
    if at is None:
        return first, part
    return first, (at.astype(np.uint16 if at[-1] < 2**16 else np.uint32), part)


def _add(histogram, offset, part):
    """Add a reply's histogram (:func:`_trim`) into ``histogram``."""
    if isinstance(part, tuple):
        at, counts = part
        histogram[offset + at.astype(np.intp)] += counts  # positions differ: no np.add.at
    else:
        histogram[offset:offset + part.size] += part


# -- the client side ------------------------------------------------------------------------------

def clip(x, kappa, max_iters):
    """κ-σ clip the Dask array ``x`` on the cluster that holds its blocks, or None when its blocks
    are not all held by a running cluster's workers (the caller then builds a graph per pass).

    Where the client already has actors, they are asked first which blocks their workers hold
    (the call's first trip, which also opens it): one trip to the workers instead of one to the
    scheduler (``who_has``) and one to open the call. Only where they do not hold every block
    exactly once (a worker joined, a block was copied) is the scheduler asked."""
    found = _blocks(x)
    if found is None:
        return None
    client, keys, first_key, futures = found
    known = _known_services(client)
    if known:
        try:
            result = client.sync(_clip_async, client, None, known, keys, first_key, x.dtype,
                                 kappa, max_iters)
            if result is not None:
                return result
        except (OSError, KeyError):
            release(client)  # an actor's worker left or restarted: the scheduler says
    try:
        holders = _holders(client, keys, futures)
        if holders is None:
            return None
        services = _services(client, list(holders))
        if len(holders) == 1:
            (address, held), = holders.items()
            return _call(client, address, services[address], "clip", held, first_key, x.dtype,
                         kappa, max_iters)
        return client.sync(_clip_async, client, holders, services, keys, first_key, x.dtype,
                           kappa, max_iters)
    except (OSError, KeyError):
        # a worker left, or a block moved: forget the actors, and let a graph do it
        release(client)
        return None


def held(x) -> bool:
    """Whether every block of the Dask array ``x`` is already in a cluster's memory (persisting
    it again would cost a round trip through the scheduler, and change nothing)."""
    if "distributed" not in sys.modules:  # no cluster without it; asking would import it
        return False
    import dask
    from distributed import futures_of

    futures = futures_of(x)
    keys = set(dask.core.flatten(x.__dask_keys__()))
    return (len(futures) == len(keys) and {f.key for f in futures} == keys
            and all(f.status == "finished" for f in futures))


def _blocks(x):
    """``(client, keys in block order, key of the first block, futures)`` for an array whose
    blocks are all in the memory of a running cluster's workers (None otherwise)."""
    import dask
    from distributed import futures_of, wait

    if x.size == 0:
        return None
    futures = futures_of(x)
    keys = list(dask.core.flatten(x.__dask_keys__()))
    if not futures or len(futures) != len(keys) or {f.key for f in futures} != set(keys):
        return None
    client = futures[0].client
    if client.status != "running" or any(f.client is not client for f in futures):
        return None
    if any(f.status != "finished" for f in futures):
        wait(futures)
        if any(f.status != "finished" for f in futures):
            return None
    first = tuple(next(i for i, c in enumerate(chunks) if c) for chunks in x.chunks)
    return client, keys, (x.name, *first), futures


def _holders(client, keys, futures):
    """``{worker: its keys in block order}`` by the scheduler's word (None where a block is
    held by no worker); a block held by several workers goes to the first of them."""
    who_has = client.who_has(futures)
    holders = {}
    for key in keys:
        held_by = sorted(who_has.get(key, ()))
        if not held_by:
            return None
        holders.setdefault(held_by[0], []).append(key)
    return dict(sorted(holders.items()))


async def _clip_async(client, holders, services, keys, first_key, dtype, kappa, max_iters):
    """The loop driven from the client over the workers ``holders`` (``{worker: its keys}``),
    or, with ``holders=None``, over the workers of ``services`` that hold blocks, found by
    asking each (None where they do not hold each block once: the caller asks the
    scheduler)."""
    call = uuid.uuid4().hex
    addresses = list(holders or services)
    try:
        start = time.perf_counter()
        if holders is None:
            located = await _locate(client, services, call, keys, first_key, dtype, kappa,
                                    max_iters)
            if located is None or isinstance(located, ClipResult):
                return located
            holders, opened = located
            addresses = list(holders)
        else:
            opened = await asyncio.gather(*(
                _execute(client, a, services[a], "open", call, holders[a], first_key, dtype)
                for a in addresses))
        trip = time.perf_counter() - start
        rank = {key: i for i, key in enumerate(keys)}
        order = np.argsort([rank[key] for held in holders.values() for key in held])
        nbins = min(bins for bins, _, _, _ in opened)
        first = next(f for _, f, _, _ in opened if f is not None)
        # NumPy blocks' head rows go back into block order, so that their sums add up as the
        # graph adds them; CuPy workers send one row per device, taken in worker order
        if not all(per_block for _, _, per_block, _ in opened):
            order = None
        # A round trip per pass: the loop batches a round's passes into one (fuse). NumPy
        # blocks always do, as the other runners of NumPy blocks (the same sums to the last
        # bit); CuPy blocks where a trip costs more than the passes a batch adds (first trip).
        first_trip = {}

        def fuse():
            if order is not None:
                return True
            if FUSE is not None:
                return FUSE
            return worth_fusing(first_trip.get("trip"), first_trip.get("pass"))

        steps = clip_steps(dtype, kappa, max_iters, nbins, first, fuse=fuse)
        params = next(steps)
        ahead = [a for _, _, _, a in opened]
        if (order is None and None not in ahead
                and params == first_pass(ksc.all_keys(dtype), nbins, first)):
            # the workers ran the first pass as they opened the call: its result, where their
            # sums move to the array's first value without losing digits
            replies = [_recentred(reply, center, first) for center, reply in ahead]
            result = _combine(replies, None, dtype, params)
            if _kept_digits(result, [center for center, _ in ahead], first):
                first_trip.update(trip=trip, **{"pass": max(r[3] for r in replies)})
                try:
                    params = steps.send(result)
                except StopIteration as stop:
                    return stop.value
        while True:
            if isinstance(params, list):
                replies = await asyncio.gather(*(
                    _execute(client, a, services[a], "run_many", call, params)
                    for a in addresses))
                result = [_combine([r[i] for r in replies], order, dtype, p)
                          for i, p in enumerate(params)]
            else:
                start = time.perf_counter()
                replies = await asyncio.gather(*(
                    _execute(client, a, services[a], "run", call, params) for a in addresses))
                if not first_trip:
                    first_trip.update(trip=time.perf_counter() - start,
                                      **{"pass": max(r[3] for r in replies)})
                result = _combine(replies, order, dtype, params)
            try:
                params = steps.send(result)
            except StopIteration as stop:
                return stop.value
    finally:
        for a in addresses:  # no need to wait for it
            _background(client, _execute(client, a, services[a], "close", call))


async def _locate(client, services, call, keys, first_key, dtype, kappa, max_iters):
    """Ask every worker of ``services`` which blocks it holds, opening call ``call`` on those
    that hold some: ``(holders, opened)`` (:meth:`ClipService.open`'s replies, in the order of
    ``holders``), the result where one worker held them all, or None where the workers do not
    hold each block exactly once."""
    addresses = sorted(services)
    replies = await asyncio.gather(*(
        _execute(client, a, services[a], "locate", call, keys, first_key, dtype, kappa,
                 max_iters) for a in addresses))
    for reply in replies:
        if isinstance(reply, ClipResult):
            return reply
    if sorted(i for reply in replies for i in reply[0]) != list(range(len(keys))):
        return None
    holding = [(a, reply) for a, reply in zip(addresses, replies) if reply[0]]
    holders = {a: [keys[i] for i in reply[0]] for a, reply in holding}
    return holders, [reply[1:] for _, reply in holding]


def _recentred(reply, center, first):
    """A first pass's reply (:meth:`ClipService.run`) with its sums of ``x - center`` made sums
    of ``x - first``: the count ``n``, ``Σd`` and ``Σd²`` of each head row give
    ``Σ(d + δ) = Σd + nδ`` and ``Σ(d + δ)² = Σd² + 2δΣd + nδ²`` with ``δ = center - first``."""
    delta = float(center) - float(first)
    if delta == 0.0:
        return reply
    heads = np.array(reply[0], dtype=np.float64)
    n, total = heads[:, ksc.COUNT], heads[:, ksc.SUM].copy()
    with np.errstate(over="ignore", invalid="ignore"):  # overflowed sums: the loop rescales
        heads[:, ksc.SUM] = total + n * delta
        heads[:, ksc.SUMSQ] += 2 * delta * total + n * delta * delta
    return (heads, *reply[1:])


def _kept_digits(head, centers, first) -> bool:
    """Whether sums moved from the ``centers`` to ``first`` (:func:`_recentred`) kept their
    digits: each move adds ``nδ²`` and ``2δΣd`` to the sum of squares, which the variance then
    takes back, so a worker whose first value lies many standard deviations from the values
    (a bright pixel) would cost the std digits that a pass centred on ``first`` keeps. Within
    32 standard deviations the loss is under 1024 rounding steps of the sums, invisible in
    the std's float64 digits that any other order of the sums changes too."""
    count = float(head[ksc.COUNT])
    if not count:
        return True
    _, std, finite = _moments(head, count, 0.0, 1.0)
    if not finite:
        return True  # the loop rescales overflowed sums with passes of its own
    return all((float(c) - float(first)) ** 2 <= 1024 * std * std for c in centers)


#: Whether the loop driven from the client batches a round's passes over CuPy blocks: None
#: decides per call (:func:`worth_fusing`, from its first trip); True or False forces it
#: (:func:`fusing`).
FUSE: bool | None = None


@contextlib.contextmanager
def fusing(fuse: bool | None):
    """Calls in this block batch passes (True), never do (False), or decide (None): for the
    whole process, not per thread (a warm-up's setting, not a per-call option). The two
    paths launch different passes (a batch's later passes, the tail's zones), and which one a
    call takes depends on how long its first trip took: the demo's warm-up runs both, so that
    neither compiles in a timed run (after a warm-up of one call, on two H100s, a first call
    took 466 ms against 49 later in one of two fresh clusters; after one of both paths, 38–50
    ms in three)."""
    global FUSE
    before, FUSE = FUSE, fuse
    try:
        yield
    finally:
        FUSE = before


def worth_fusing(trip, pass_time) -> bool:
    """Whether batching a round's passes saves time, from one round trip's time and the longest
    time a worker took for its pass in it (None: not known yet, batch). A batch saves a round
    its second trip and costs it two passes more (the next window's inner part and its two edge
    zones, against one pass): worth it while a trip's overhead exceeds two passes. Measured on
    two H100s (2026-11-26): a 32768² sky in 4096² chunks took 174 ms batched and 131 ms not
    (a pass of 3.5 ms in a first trip of 4.8); an 8192² one in 2048² chunks 62 and 64 ms (a
    pass of 1.0 ms in a trip of 2.3), where a slower host's trips made batching worth more.
    (The 174 ms included the tail's sums through the BLAS, since replaced: on two H200s on
    2026-11-27, 98.4 ms a 32768² call batched, against 101.9 ms not.)"""
    if trip is None or pass_time is None:
        return True
    return trip - pass_time > 2 * pass_time


def _combine(replies, order, dtype, params):
    """A pass's result from the workers' replies (see :meth:`ClipService.run`)."""
    heads = np.concatenate([reply[0] for reply in replies])
    if order is not None:
        heads = heads[order]
    p = ksc.resolve(dtype, **ksc.validate(0, **split(params)[0]))
    histogram = np.zeros(0 if p["extremes"] else ksc.bin_count(p["bins"]))
    for _, offset, part, *_ in replies:
        _add(histogram, offset, part)
    return finish(heads, histogram, params)


def _call(client, address, actor, method, *args):
    return client.sync(_execute, client, address, actor, method, *args)


async def _execute(client, address, actor, method, *args):
    """Call ``method`` of the actor ``actor`` on worker ``address`` over the client's own
    connection to the worker (what ``distributed.Actor`` does with ``direct_to_workers``; its
    default goes through the scheduler, a hop more per call). The method and its arguments go
    pickled into one bytes object, and the result comes back so (:meth:`ClipService.execute`):
    distributed serialises each argument of a call, and each element of a list of them, apart,
    about a millisecond a message for the passes of a batch, which was as much as the passes
    themselves on a GPU worker."""
    blob = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
    reply = await client.rpc(address).actor_execute(
        actor=actor, function="execute", args=[blob], kwargs={})
    if reply["status"] != "OK":
        raise reply["exception"]
    return pickle.loads(reply["result"])


#: The attribute of a client that holds its ClipService actors' futures, by worker address: they
#: keep the actors alive, and live and die with the client (a cache beside it would keep it alive).
_ATTRIBUTE = "_chunkernels_clip_services"
_SERVICES_LOCK = threading.Lock()
#: Calls sent without waiting for their reply, kept until they finish.
_PENDING: set = set()


def _known_services(client) -> dict:
    """The keys of the ClipService actors ``client`` already has, by worker address."""
    with _SERVICES_LOCK:
        known = client.__dict__.get(_ATTRIBUTE, {})
        return {a: f.key for a, f in known.items() if f.status == "finished"}


def _services(client, addresses) -> dict:
    """The key of the ClipService actor on each worker of ``addresses``, made where missing."""
    from distributed import wait

    with _SERVICES_LOCK:
        known = client.__dict__.setdefault(_ATTRIBUTE, {})
        missing = [a for a in addresses if a not in known or known[a].status != "finished"]
        if missing:
            made = {a: client.submit(ClipService, workers=[a], allow_other_workers=False,
                                     actor=True, pure=False,
                                     key=f"chunkernels-clip-service-{uuid.uuid4().hex}")
                    for a in missing}
            wait(list(made.values()))
            failed = [a for a, f in made.items() if f.status != "finished"]
            if failed:
                raise OSError(f"κ-σ clipping could not start its actor on worker(s) {failed}")
            known.update(made)
        return {a: known[a].key for a in addresses}


def release(client) -> int:
    """Release the ClipService actors of ``client`` (the next clipping makes them again); how
    many there were. Closing the client releases them too."""
    with _SERVICES_LOCK:
        return len(client.__dict__.pop(_ATTRIBUTE, {}))


def _background(client, coroutine) -> None:
    task = asyncio.ensure_future(coroutine)
    _PENDING.add(task)
    task.add_done_callback(_done)


def _done(task) -> None:
    _PENDING.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a worker gone meanwhile is no error of the result

