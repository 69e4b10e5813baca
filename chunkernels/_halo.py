"""The halo exchange for kernels with a halo: its plans and the bodies of its tasks.

Thin strips travel, core blocks stay where they are. ``dask.array.map_overlap`` builds, for every
block, getitem tasks on each neighbour and concatenation tasks that assemble the block with its
halo, then a trim; on a distributed cluster the concatenations pull whole neighbour blocks across
workers, and every stage is a task. :func:`chunkernels._graph.overlap` builds the graph from the
plans here, in one of these shapes:

* lazy inputs: a **strip task** on each block slices, as contiguous copies, exactly the pieces of
  it that other blocks' halos need (faces, edges and corners, ``depth`` thick; with a periodic
  boundary the wrap-around pieces too; :func:`cut`). It depends on that block only, so the
  scheduler runs it where the block lives and only the strips travel;
* a **kernel task** per block takes the core block and the pieces its halo needs, copies them once
  into one preallocated buffer (CuPy blocks: one gather launch, ``kernels_cuda/halo_gather.cu``),
  runs the kernel on it and returns the core region of the result (:func:`extend_and_run`). Its
  largest input is the core block, so it runs on the worker that holds it;
* inputs whose blocks are already in memory (a persisted array on a local scheduler,
  ``from_array`` of a NumPy array) need no strip tasks: their kernel tasks hold the core block
  and the neighbours' pieces they need (:class:`Held`: the block and the slices, read in place by
  the gather), so the graph is one independent task per block, nothing is cut or copied before
  the gather, and a task that is ever serialised carries only its core and strips;
* inputs persisted on a cluster, each block on one worker: a kernel task reads the pieces held by
  its own worker in place (:class:`Held` again) and the strips that cross workers travel in one
  batch per pair of workers (:func:`cut_many`);
* CuPy blocks already in memory under a local scheduler go further: one task runs the kernel on a
  group of blocks (:func:`run_group`), and each output block's task picks its result from the
  group's (:func:`group_blocks` says when). Their kernel tasks only queue launches, so a task per
  block buys no parallelism, and in one task the blocks of one extended shape can share launches:
  a kernel whose spec stacks blocks (``KernelSpec.stack``, the separable filters) gathers them
  into slices of one buffer and runs once on the stack, one launch per pass instead of one per
  block.

Pieces are planned per axis and combined (:func:`plans`): along an axis, a block's extended range
is its own range widened by the depth on each side (clipped to the array where the boundary is
``"none"``, wrapped around it where it is ``"periodic"``), cut at chunk boundaries. A halo wider
than the neighbouring chunks therefore gathers from several of them, with no rechunking. Graph
size is O(blocks); a block refers to as many strip tasks as blocks its halo reaches.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from bisect import bisect_right

import numpy as np

from chunkernels import cuda, layout

BOUNDARIES = ("none", "periodic")

#: The halo of an axis that must be one chunk (a kernel that needs a block's edge along it both
#: wrapped around the array and not): not smaller than any array, so :func:`chunkernels.apply`
#: makes the axis one chunk as it does for any halo that spans the array; small enough that a
#: pipeline's summed halos do not overflow.
WHOLE_AXIS = 2**62


#: The most output bytes one task of a group computes (:func:`group_blocks`): large enough that
#: a few tasks cover arrays of many gigabytes, small enough that Dask can release a group's input
#: blocks, and its consumers run, before the whole array is done.
GROUP_BYTES = 2**30


#: The most output bytes one group task of a halo exchange on a cluster computes
#: (:func:`chunkernels._graph.overlap`, inputs persisted on GPU workers): a few group tasks per
#: worker, whose consumers wait for the whole group.
PLACED_GROUP_BYTES = 2**32


def group_blocks(held) -> bool:
    """Whether, under a local scheduler, one task runs the kernel on a group of blocks (at most
    :data:`GROUP_BYTES` of output): every input's blocks are CuPy arrays in memory. NumPy blocks
    keep a task each, which the threaded scheduler runs in parallel (the CPU kernels release
    the GIL); a cluster's workers run each block where it lies (the graph layer asks this only
    where the graph runs locally)."""
    if not held or any(blocks is None for blocks in held) or not held[0]:
        return False
    return cuda.is_cupy_array(next(iter(held[0].values())))


def run_group(fn, jobs):
    """Each job's result (jobs as :func:`chunkernels._graph.overlap` makes them). A kernel whose spec can stack blocks
    (``KernelSpec.stack``) runs the blocks of one extended shape, dtype and device together:
    each gathered into its slice of one buffer, then one run on the stack (one launch per
    pass instead of one per block). The others, and a stack that does not fit in device memory,
    run block by block."""
    results = [None] * len(jobs)
    stacks: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        if job[0] is not None and _stackable(fn, job):
            core = job[1][0]
            device = core.data.device_id if cuda.is_cupy_array(core) else None
            stacks.setdefault((job[0][0], core.dtype, device), []).append(i)
        else:
            results[i] = run_job(fn, job)
    for members in stacks.values():
        stacked = _run_stack(fn, [jobs[i] for i in members]) if len(members) > 1 else None
        for n, i in enumerate(members):
            results[i] = run_job(fn, jobs[i]) if stacked is None else stacked[n]
    return results


def group_placed(metas) -> bool:
    """Whether the kernel tasks of a halo exchange over inputs persisted on a cluster (their
    ``metas``) run in group tasks per worker: on GPU workers (CuPy blocks), whose tasks only
    queue launches. NumPy blocks keep a task each, which a worker's threads run in parallel."""
    return all(cuda.is_cupy_array(m) for m in metas)


class GroupResults:
    """The results of a group task on a cluster's worker, one per block, each taken by its
    block's pick task (:func:`picked_on_worker`): :func:`run_placed`, the label's groups.

    Not a list, so that dask-cuda's spilling leaves it alone. A GPU worker holding more results
    than its ``device_memory_limit`` moves device objects (CuPy arrays, and lists and tuples
    holding any) to host memory, least recently used first. A group's results are the very
    arrays its picks return: spilled as a list, they were copied to the host without freeing
    any device memory (the picks hold them), and copied back to the device for a pick still to
    run, a second copy. The label of a 40 GiB array on two H100s (its float32 input and int64
    labels past dask-cuda's 80 % of each GPU) took 6.79 s so, and 0.96 s since; its peak, as
    CuPy's pool total then measured it, fell from 51.9 to 29.7 GiB above the input. To Dask
    this is a small object: its arrays' bytes
    are counted once, as the picks' results (the group itself is let go once its picks have
    run)."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = list(items)

    def __getitem__(self, position):
        return self.items[position]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + 8 * len(self.items)

    def __reduce__(self):
        return GroupResults, (self.items,)


def run_placed(fn, jobs, *values):
    """Each job's result, block by block: a group task of a halo exchange on a cluster's GPU
    worker (see :func:`chunkernels._graph._placed_graph`), whose jobs are plain data and whose
    ``values`` are the blocks and batches of strips it reads. A job is ``(plan, cores,
    pieces)``: ``cores``, the positions in ``values`` of its input blocks; ``pieces``, per input,
    ``(position, slices)`` for a piece of a block read in place (:class:`Held`) or ``(position,
    index)`` for piece ``index`` of a batch (:class:`Strips`); ``plan`` None for an empty
    block. No stacking (:func:`run_group`): its buffer would add the whole group's size to the
    worker's peak memory. The results come as :class:`GroupResults`."""
    out = []
    for plan, cores, pieces in jobs:
        blocks = tuple(values[at] for at in cores)
        if plan is None:
            out.append(call(fn, blocks))
            continue
        parts = tuple(tuple(Held(values[at], what) if isinstance(what, tuple)
                            else values[at][what] for at, what in own) for own in pieces)
        out.append(extend_and_run(fn, plan, blocks, parts))
    return GroupResults(out)


def run_job(fn, job):
    """One block's result: ``fn`` on an empty block, or on the block extended by its halo."""
    return call(fn, job[1]) if job[0] is None else extend_and_run(fn, *job)


def _stackable(fn, job) -> bool:
    """Whether ``job`` can run in a stack: one input, a kernel that stacks blocks and takes one
    more dimension."""
    spec = getattr(fn, "spec", None)
    _, cores, _ = job
    if spec is None or spec.stack is None or len(cores) != 1:
        return False
    top = spec.ndim[1]
    return top is None or cores[0].ndim < top


def _run_stack(fn, jobs):
    """The results of ``jobs`` (blocks of one extended shape, dtype and device) computed as one
    stack, or None where the stack does not fit in device memory."""
    shape = jobs[0][0][0]
    first = jobs[0][1][0]
    xp = cuda.array_module(first)
    with contextlib.nullcontext() if xp is np else first.device:
        try:
            stack = xp.empty((len(jobs), *shape), dtype=first.dtype)
            for entry, (plan, (core,), (pieces,)) in zip(stack, jobs):
                _fill(xp, plan, entry, core, pieces)
            out = fn.stacked(stack)
        except MemoryError:  # CuPy's OutOfMemoryError, RMM's bad_alloc: block by block instead
            return None
    return [entry[plan[1]] for entry, (plan, *_) in zip(out, jobs)]


def picked(results, position, *dependencies):
    """``results[position]``; ``dependencies`` are arguments only so that a task depends on them
    (see :func:`chunkernels._graph._placed_graph`)."""
    return results[position]


async def picked_on_worker(results, position, *dependencies):
    """:func:`picked` as a coroutine, for graphs only a distributed cluster runs (their inputs
    live on its workers; :meth:`chunkernels._graph.Tasks.add_on_loop`). A worker runs a
    coroutine task on its event loop as soon as its inputs are there, without handing it to its
    thread and back: that hand-over is about half of what a trivial task costs a worker (0.70
    against 0.36 ms a pick on a CPU worker, 1.04 against 0.66 ms on a GPU worker of a
    LocalCUDACluster), and a GPU worker runs one pick per block of the graph."""
    return results[position]


@functools.lru_cache(maxsize=16)  # a plan holds a few tuples per block: keep the last few
def plans(chunks, depth, boundary, lazy):
    """Per block index of a grid of ``chunks``, its gather plan and placements (or None for an
    empty block), and, when ``lazy``, what each source block must cut for the others:
    ``{source index: {(start, stop) per axis: position}}``. Worked out once per grid, depth and
    boundary (a pipeline's filters, or a series of images chunked alike, share them); the
    results are shared, so they are never changed after."""
    axes_pieces = [[None if plan is None else _pieces_along(plan) for plan in
                    _axis_plan(c, d, b == "periodic")]
                   for c, d, b in zip(chunks, depth, boundary)]
    cuts: dict[tuple, dict[tuple, int]] = {}
    targets = {}
    for index in np.ndindex(*(len(c) for c in chunks)):
        axes = [axes_pieces[a][i] for a, i in enumerate(index)]
        if None in axes:  # an empty block: nothing to extend
            targets[index] = None
            continue
        core_piece = tuple(entries[c] for entries, c, *_ in axes)
        placements = []  # (source index, (start, stop) per axis, cut slices, destination slices)
        for combo in itertools.product(*(entries for entries, *_ in axes)):
            if combo != core_piece:
                placements.append(tuple(zip(*combo)))
        if lazy:
            for source, cut, _, _ in placements:
                wanted = cuts.setdefault(source, {})
                wanted.setdefault(cut, len(wanted))
        core_at = 0  # the pieces tile the buffer in C order of their segments, the core among them
        for entries, c, *_ in axes:
            core_at = core_at * len(entries) + c
        plan = (tuple(a[2] for a in axes), tuple(a[3] for a in axes),
                tuple(dest for *_, dest in placements), tuple(a[4] for a in axes), core_at)
        targets[index] = (plan, tuple(placements))
    return targets, cuts


def _axis_plan(chunks: tuple[int, ...], depth: int, periodic: bool):
    """Per block along one axis: ``(segments, core)``, or ``None`` for an empty block.

    ``segments`` cover the block's extended range in order, each inside one block:
    ``(source block, start, stop, offset in the extended range)``; ``segments[core]`` is the
    block itself.
    """
    bounds = np.concatenate([[0], np.cumsum(chunks)]).tolist()
    n = bounds[-1]
    plans = []
    for i, size in enumerate(chunks):
        if size == 0:
            plans.append(None)
            continue
        lo = bounds[i] - (depth if periodic else min(depth, bounds[i]))
        hi = bounds[i + 1] + (depth if periodic else min(depth, n - bounds[i + 1]))
        segments, core, pos = [], None, lo
        while pos < hi:
            q = pos % n
            j = bisect_right(bounds, q) - 1  # the non-empty block holding position q
            stop = min(bounds[j + 1], q + hi - pos)
            if pos == bounds[i]:
                core = len(segments)
            segments.append((j, q - bounds[j], stop - bounds[j], pos - lo))
            pos += stop - q
        plans.append((segments, core))
    return plans


def _pieces_along(plan):
    """One block's segments along an axis (an :func:`_axis_plan` entry), as the graph uses them:
    ``(pieces, core, extent, core slice, offsets)``, each piece ``(source block, (start, stop),
    cut slice, destination slice)``; ``pieces[core]`` is the block itself."""
    segments, core = plan
    pieces = tuple((j, (start, stop), slice(start, stop), slice(at, at + stop - start))
                   for j, start, stop, at in segments)
    _, start, stop, at = segments[-1]
    return (pieces, core, at + stop - start, pieces[core][3],
            tuple(at for *_, at in segments))


def cut(block, cuts):
    """The pieces of ``block`` other blocks' halos need, as contiguous copies.

    Copies, not views: a view would keep the whole block alive with the strip and make a
    transfer between workers serialise through a strided buffer.
    """
    return tuple(block[tuple(slice(*s) for s in cut)].copy() for cut in cuts)


def cut_many(blocks, cuts):
    """Pieces of several blocks: the strips one worker sends another in one message, as
    :class:`Strips`. ``cuts`` is an integer array with a row per piece: its block's position in
    ``blocks``, then ``start, stop`` along each axis (an array, not nested tuples: submitting a
    task, the client walks nested arguments looking for futures, 0.3 ms for a batch's tuples)."""
    return Strips.of([blocks[row[0]][tuple(slice(*row[i:i + 2]) for i in range(1, len(row), 2))]
                      for row in np.asarray(cuts).tolist()])


class Strips:
    """Pieces of blocks that one worker sends another, copied into one contiguous host buffer;
    ``strips[i]`` is piece ``i``.

    GPU blocks' pieces are copied to the host where they are cut, by the task that cuts them
    (which runs before the kernels of the exchange: it is submitted first). The message then
    carries host bytes, and the sending worker's serialisation does not wait: a device-to-host
    copy made there would run on the default stream, behind every kernel its GPU has queued
    since (measured: 29–47 ms for a 4 MiB batch on 2–4 H100s, while the copy takes 1 ms). The
    receiving worker uploads the buffer once, on first use, and hands out views of it.
    """

    __slots__ = ("host", "layout", "gpu", "_device")

    #: Bytes each piece's offset is a multiple of (any element type's alignment).
    ALIGN = 16

    def __init__(self, host: np.ndarray, layout: tuple, gpu: bool):
        self.host = host  # uint8
        self.layout = layout  # per piece: (offset, shape, dtype)
        self.gpu = gpu
        self._device = None

    @classmethod
    def of(cls, pieces) -> Strips:
        gpu = any(cuda.is_cupy_array(p) for p in pieces)
        xp = cuda.cupy() if gpu else np
        layout, offset = [], 0
        for p in pieces:
            layout.append((offset, p.shape, p.dtype))
            offset += -(-p.nbytes // cls.ALIGN) * cls.ALIGN
        flat = xp.empty(offset, dtype=np.uint8)
        for (at, shape, dtype), p in zip(layout, pieces):
            _view(flat, at, shape, dtype)[...] = p
        return cls(flat.get() if gpu else flat, tuple(layout), gpu)

    def __len__(self) -> int:
        return len(self.layout)

    def __getitem__(self, position: int):
        return _view(self.upload() if self.gpu else self.host, *self.layout[position])

    def upload(self):
        """The buffer on this process's current GPU, copied there once (GPU pieces only)."""
        if self._device is None:
            self._device = cuda.cupy().asarray(self.host)
        return self._device

    def __sizeof__(self) -> int:
        return int(self.host.nbytes)

    def __reduce__(self):
        return Strips, (self.host, self.layout, self.gpu)


def _view(flat, offset: int, shape: tuple, dtype):
    """The piece of ``shape`` and ``dtype`` at byte ``offset`` of the uint8 buffer ``flat``."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return flat[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)


def call(fn, blocks):
    return fn(*blocks)


class Held:
    """A piece of a block already in memory, not cut out: the block and the piece's slices.

    The gather reads it where it lies (the block's address plus the slices' offset), so neither
    building the graph nor the kernel task makes a view or a copy of it (a CuPy view costs
    microseconds of host time, and a block's halo has eight pieces in 2-d). Serialised, in a task
    sent to another process, it carries the piece alone.
    """

    __slots__ = ("block", "cut")

    def __init__(self, block, cut: tuple[slice, ...]):
        self.block = block
        self.cut = cut

    def array(self):
        """The piece, as a view of the block."""
        return self.block[self.cut]

    def __reduce__(self):
        piece = self.array()
        return Held, (piece, (slice(None),) * piece.ndim)


def pick(strips, picks):
    """The pieces a block needs, in its placement order, from its neighbours' strip tuples."""
    return tuple(strips[source][position] for source, position in picks)


def extend_and_run(fn, plan, cores, pieces):
    """Assemble each input's block with its halo in one buffer, run ``fn``, keep the core."""
    core = plan[1]
    xp = cuda.array_module(cores[0])
    if xp is np:
        return fn(*(_extend(np, plan, block, parts) for block, parts in zip(cores, pieces)))[core]
    with cores[0].device:
        extended = None
        try:
            extended = [_extend(xp, plan, block, parts) for block, parts in zip(cores, pieces)]
            result = fn(*extended)
        except MemoryError as exc:  # CuPy's OutOfMemoryError, RMM's bad_alloc
            # the kernel's own GPUOutOfMemoryError (run_block) counts the spec's whole halo on
            # both sides of every axis; this block's halo is known here (edges, single chunks)
            failure = getattr(exc, "failure", None) or f"{type(exc).__name__}: {exc}"
        else:
            return result[core]
        extended = None  # the error's traceback holds this frame: free the halo buffers now
        # the halo buffer did not fit: the error run_block raises, for the extended block
        from chunkernels._dispatch import out_of_memory_error

        spec = getattr(fn, "spec", None)
        name = spec.name if spec is not None else getattr(fn, "__name__", "halo exchange")
        depth = tuple((c.start, n - c.stop) for n, c in zip(plan[0], core))  # before, after
        raise out_of_memory_error(name, plan[0], cores[0].dtype, cores[0].device, depth, failure)


def _extend(xp, plan, block, pieces):
    """``block`` with ``pieces`` around it, in a new C-ordered buffer of the plan's shape."""
    buf = xp.empty(plan[0], dtype=block.dtype)
    _fill(xp, plan, buf, block, pieces)
    return buf


def _fill(xp, plan, buf, block, pieces):
    """Write ``block`` and ``pieces`` around it into ``buf`` (C-contiguous, the plan's shape)."""
    _, core, dests, offsets, core_at = plan
    if xp is not np and _gather(buf, offsets, core_at, block, pieces):
        return
    buf[core] = block
    for dest, piece in zip(dests, pieces):
        buf[dest] = piece.array() if isinstance(piece, Held) else piece


#: The gather kernel's plan (``kernels_cuda/halo_gather.cu``): int64 words of shape [4],
#: segment offsets [4][8], segment counts [4], piece addresses [64], piece strides [64][4].
GATHER_DIMS, GATHER_SEGMENTS, GATHER_PIECES = 4, 8, 64
GATHER_WORDS = GATHER_DIMS * (1 + GATHER_SEGMENTS + 1) + GATHER_PIECES * (1 + GATHER_DIMS)
_GATHER_SRC = GATHER_DIMS * (GATHER_SEGMENTS + 2)
_GATHER_STRIDE = _GATHER_SRC + GATHER_PIECES
_GATHER_PARAM = np.dtype((np.void, GATHER_WORDS * 8))  # passed by value, as one struct
#: Element sizes the gather moves, and the unsigned word it moves them as.
GATHER_WORD_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int",
                     8: "unsigned long long", 16: "halo_word16"}
#: The gather's CUDA source (a library source, not a registered kernel) and its instantiations.
GATHER_SOURCE = "halo_gather.cu"
GATHER_ENTRIES = tuple(f"halo_gather<{word}>" for word in GATHER_WORD_TYPES.values())
_GATHER_BLOCK = 256
#: Columns each thread copies per row: a thread splits its row index into the outer coordinates
#: once (64-bit divisions), then copies this many elements of the row.
_GATHER_COLUMNS_PER_THREAD = 8
_GATHER_MAX_GRID_X = 4096
_GATHER_MAX_GRID_Y = 65535
_TEMPLATES: dict[tuple, np.ndarray | bool] = {}
_MAX_TEMPLATES = 1024


def gather_words(shape, offsets, core_at, block, pieces) -> np.ndarray | None:
    """The gather kernel's plan for ``block`` and ``pieces`` (NumPy or CuPy arrays, or
    :class:`Held` pieces of them), or None where the kernel cannot walk them: more than 4 dims,
    8 segments on an axis or 64 pieces, strides that are not whole elements.

    The pieces, with ``block`` at position ``core_at``, tile a buffer of ``shape`` as the product
    of per-axis segments that start at ``offsets[axis]``, in C order of the segment indices.
    """
    ndim = len(shape)
    count = len(pieces) + 1
    if ndim > GATHER_DIMS or count > GATHER_PIECES or any(len(o) > GATHER_SEGMENTS
                                                           for o in offsets):
        return None
    walks = [_walk(p) for p in pieces]
    walks.insert(core_at, (layout.pointer(block), block.strides))
    # the plan without the addresses, which change from block to block; the geometry and the
    # strides do not (interior blocks share them)
    key = (shape, offsets, block.dtype.itemsize, tuple([strides for _, strides in walks]))
    template = _TEMPLATES.get(key)
    if template is None:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.clear()
        template = _TEMPLATES[key] = _template(*key)
    if template is False:
        return None
    words = template.copy()
    words[_GATHER_SRC:_GATHER_SRC + count] = [address for address, _ in walks]
    return words


def _template(shape, offsets, itemsize, strides) -> np.ndarray | bool:
    """:func:`gather_words` without the addresses; False for strides of part elements."""
    byte_strides = np.array(strides, dtype=np.int64)
    if (byte_strides % itemsize).any():
        return False
    ndim = len(shape)
    pad = GATHER_DIMS - ndim
    words = np.zeros(GATHER_WORDS, dtype=np.int64)
    words[:GATHER_DIMS] = (1,) * pad + tuple(shape)
    segs = words[GATHER_DIMS:GATHER_DIMS * (GATHER_SEGMENTS + 1)].reshape(
        GATHER_DIMS, GATHER_SEGMENTS)
    nseg = words[GATHER_DIMS * (GATHER_SEGMENTS + 1):_GATHER_SRC]
    nseg[:pad] = 1
    for axis, starts in enumerate(offsets, start=pad):
        segs[axis, :len(starts)] = starts
        nseg[axis] = len(starts)
    count = len(strides)
    walk = words[_GATHER_STRIDE:_GATHER_STRIDE + count * GATHER_DIMS].reshape(count, GATHER_DIMS)
    walk[:, pad:] = byte_strides // itemsize
    words.setflags(write=False)
    return words


def _walk(piece) -> tuple[int, tuple[int, ...]]:
    """Address of a piece's first element, and its byte strides."""
    if isinstance(piece, Held):
        base = piece.block
        strides = base.strides
        address = layout.pointer(base)
        for s, stride in zip(piece.cut, strides):
            address += (s.start or 0) * stride
        return address, strides
    return layout.pointer(piece), piece.strides


def _gather(buf, offsets, core_at, block, pieces) -> bool:
    """Fill ``buf`` (CuPy) from ``block`` and ``pieces`` in one launch; False where the gather
    kernel cannot (its limits, an element size it does not move, a piece on another device)."""
    word = GATHER_WORD_TYPES.get(buf.dtype.itemsize)
    device = buf.data.device_id
    arrays = [p.block if isinstance(p, Held) else p for p in pieces]
    if word is None or any(a.data.device_id != device or a.dtype != buf.dtype
                           for a in (block, *arrays)):
        return False
    words = gather_words(buf.shape, offsets, core_at, block, pieces)
    if words is None:
        return False
    cols = buf.shape[-1]
    rows = buf.size // cols
    grid = (min(-(-cols // (_GATHER_BLOCK * _GATHER_COLUMNS_PER_THREAD)), _GATHER_MAX_GRID_X),
            min(rows, _GATHER_MAX_GRID_Y))
    kernel = cuda.function(GATHER_SOURCE, f"halo_gather<{word}>")
    kernel(grid, (_GATHER_BLOCK,), (buf, words.view(_GATHER_PARAM)))
    return True


def boundaries(boundary, ndim: int, kernel: str) -> tuple[str, ...]:
    """A spec's boundary as one value per axis.

    ``boundary`` is ``"none"`` or ``"periodic"`` for every axis, a dict ``{axis: value}`` (axes
    not named are ``"none"``), or a sequence of ``ndim`` values.
    """
    from chunkernels._errors import KernelSpecError

    if isinstance(boundary, str):
        per_axis = dict.fromkeys(range(ndim), boundary)
    elif isinstance(boundary, dict):
        per_axis = dict.fromkeys(range(ndim), "none")
        for axis, value in boundary.items():
            if not isinstance(axis, int | np.integer) or not -ndim <= axis < ndim:
                raise KernelSpecError(f"kernel {kernel!r}: boundary() returned axis {axis!r} for "
                                      f"a {ndim}-d input; expected axes in range({ndim})")
            per_axis[int(axis) % ndim] = value
    elif isinstance(boundary, tuple | list) and len(boundary) == ndim:
        per_axis = dict(enumerate(boundary))
    else:
        raise KernelSpecError(f"kernel {kernel!r}: boundary() returned {boundary!r} for a "
                              f"{ndim}-d input; expected 'none', 'periodic', a dict of them per "
                              f"axis or a sequence of {ndim}")
    bad = {a: b for a, b in per_axis.items() if b not in BOUNDARIES}
    if bad:
        raise KernelSpecError(f"kernel {kernel!r}: boundary() returned {bad}; expected one of "
                              f"{BOUNDARIES} per axis ('none': the kernel applies its edge mode)")
    return tuple(per_axis[a] for a in range(ndim))
