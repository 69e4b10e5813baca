"""The graph layer: the one module that turns chunkernels' work into Dask task graphs.

Every task graph and every ``dask.array.Array`` the library makes is built here, from Dask's
public task classes (:mod:`dask.task_spec`) and :class:`~dask.highlevelgraph.HighLevelGraph`
layers. Kernels and front ends describe their tasks through :class:`Tasks` (a builder: tasks,
references, blocks of the arrays they read) or through the shapes below; none of them imports
Dask's task classes, and nothing imports ``dask._*``.

Shapes every kernel shares:

* :func:`map_blocks`: one task per block, blocks paired with their operands' (``map_blocks``);
* :func:`reduce`: one task per block and one that combines their results;
* :func:`blocks_then_combine`: the same with each block's global origin (measurements);
* :func:`overlap`: a halo exchange (:mod:`chunkernels._halo` plans it and runs its tasks).

**Graph shape is decided where the graph runs** (:func:`chosen_array`). Some work has two good
graphs: on Dask's local schedulers, CuPy blocks already in memory run best as one task over many
blocks (their launches only queue work on the device, and one task shares launches between
blocks), while on a distributed cluster the same work must stay a task per block, run where
each block lives. Which scheduler computes a graph is not known when it is built (a graph built
before a client exists may be computed on it, and one built with a client may run on local
threads), so such a layer is built when it is materialised: in the process that made it (a
local scheduler) as the local shape; once serialised, on a distributed scheduler, as the
cluster shape. Both shapes have the same output keys, chunks and meta.

**Placement** (:func:`placement`): where the blocks of a persisted array live on a cluster, so
that a halo exchange reads neighbours on the same worker in place and sends only the strips that
cross workers, batched per pair of workers (:func:`overlap`).
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from chunkernels import _halo, cuda
from chunkernels._errors import UnknownChunkSizesError
from chunkernels._imports import current_client
from chunkernels._kind import is_dask  # noqa: F401 - asked here by the layers above, as before


# -- the entry: an array as every entry point takes it ---------------------------------------------


def as_input(a, who: str, name: str = "input", *, chunk_sizes: bool = False):
    """``a`` as chunkernels' entry points take it, decided once, before any work.

    A NumPy, CuPy or Dask array is kept, anything else becomes ``numpy.asarray(a)``; a
    non-native byte order (``>f8`` on little-endian machines: FITS data, big-endian files) is
    swapped to native (:func:`native`), as SciPy reads such data; with ``chunk_sizes``, a Dask
    array's chunk sizes must be known (:func:`check_chunk_sizes`, naming ``who`` and ``name``).
    """
    if not (isinstance(a, np.ndarray) or cuda.is_cupy_array(a) or is_dask(a)):
        a = np.asarray(a)
    a = native(a)
    if chunk_sizes and is_dask(a):
        check_chunk_sizes(a, who, name)
    return a


def native(a):
    """NumPy or Dask array ``a`` in native byte order: ``a`` itself when it is, else a converted
    copy (lazy, block by block, for Dask) of the same values, dtype ``a.dtype.newbyteorder("=")``.

    CuPy arrays are always native. The result's dtype is what SciPy returns for such inputs
    (``float64`` for ``>f8``): its filters compute in native types too.
    """
    if a.dtype.isnative:
        return a
    return a.astype(a.dtype.newbyteorder("="))


def check_chunk_sizes(a, who: str, name: str = "x", axes: Iterable[int] | None = None) -> None:
    """Refuse Dask array ``a`` if its chunk sizes along ``axes`` (default: every axis) are unknown.

    The one check of every entry point that needs them (halos, labels, measurements, zoom), made
    before a graph is built: without it the graph builds and fails at compute with Dask's
    "cannot convert float NaN to integer". Raises :class:`~chunkernels.UnknownChunkSizesError`.
    """
    for axis in range(a.ndim) if axes is None else axes:
        chunks = a.chunks[axis]
        unknown = sum(1 for c in chunks if math.isnan(c))
        if unknown:
            raise UnknownChunkSizesError(
                f"{who}: {name} has unknown chunk sizes along axis {axis}; call "
                f"{name}.compute_chunk_sizes() first ({unknown} of its {len(chunks)} chunk(s) "
                f"there have size NaN, as Dask leaves them after boolean indexing such as "
                f"x[x > 0]; {who} needs every block's size and place in the array)")


def tokenize(*args) -> str:
    """Dask's deterministic token of ``args`` (names of the layers made here)."""
    from dask.base import tokenize as dask_tokenize

    return dask_tokenize(*args)


def meta(x, dtype, ndim: int | None = None):
    """An empty array of ``x``'s array type (NumPy or CuPy) and ``dtype``: a Dask ``meta``."""
    return cuda.array_module(x).empty((0,) * (x.ndim if ndim is None else ndim), dtype=dtype)


def in_memory_blocks(a) -> dict[tuple, Any] | None:
    """The blocks of Dask array ``a`` by block index when every one is a NumPy or CuPy array held
    in its graph (a persisted array on a local scheduler, ``from_array`` of an array), else None
    (lazy blocks, or a distributed cluster's futures)."""
    from dask.task_spec import DataNode

    layer = a.dask.layers.get(a.name)
    if layer is None or not layer.is_materialized() or len(layer) != a.npartitions:
        return None
    blocks = {}
    for key, value in layer.items():
        if isinstance(value, DataNode):
            value = value.value
        if not (isinstance(value, np.ndarray) or cuda.is_cupy_array(value)):
            return None
        blocks[key[1:]] = value
    return blocks


class BlockSource:
    """What tasks need of a Dask array's blocks, without the array: its name and, when they are
    in memory (:func:`in_memory_blocks`), the blocks. It pickles, so a layer built where it runs
    (:func:`chosen_array`) can carry it.

    With ``absorb``, blocks computed from persisted blocks by per-block steps (``threshold`` on a
    persisted image, Dask's elementwise operations and slices, as :func:`placement` with
    ``computed`` sees them) are computed inside the tasks that read them: the argument is the
    block's task itself with the tasks it reads inlined, run in place, and the steps' own tasks
    drop out of the graph when it is optimised (on a cluster each task costs Dask's handling, a
    millisecond or more, whatever its work)."""

    __slots__ = ("held", "inline", "name")

    def __init__(self, a, *, absorb: bool = False):
        self.name = a.name
        self.held = in_memory_blocks(a)
        self.inline = _inline_blocks(a) if absorb and self.held is None else None

    def arg(self, index: tuple):
        """Block ``index`` as a task argument: the block when in memory, its task when absorbed,
        else a reference."""
        if self.held is not None:
            return self.held[index]
        if self.inline is not None:
            return self.inline[index][0]
        from dask.task_spec import TaskRef

        return TaskRef((self.name, *index))

    def where(self, index: tuple):
        """What a task that must run where block ``index`` is computed takes as an argument (so
        that the scheduler places it there): the block (:meth:`arg`), or, absorbed, a persisted
        block that its task reads."""
        if self.inline is not None:
            return self.inline[index][1]
        return self.arg(index)

    def __reduce__(self):
        return _block_source, (self.name, self.held, self.inline)


def _block_source(name, held, inline=None):
    source = BlockSource.__new__(BlockSource)
    source.name, source.held, source.inline = name, held, inline
    return source


def _inline_blocks(a) -> dict | None:
    """``{index: (the block's task, unkeyed, to run inside another, with the lazy tasks below
    it that it reads inlined too; a reference to a persisted block it reads)}`` where every
    block of ``a`` is computed from persisted blocks by tasks that no other block reads (see
    :func:`_block_sources`), else None."""
    plan = _block_sources(a, True)
    if plan is None or not plan[1] or len(plan[1]) != a.npartitions:
        return None
    from dask.task_spec import Task, TaskRef

    tasks = plan[3]
    readers = collections.Counter(d for t in tasks.values() for d in t.dependencies
                                  if d in tasks)
    if any(n > 1 for n in readers.values()):  # inlined twice, it would run twice
        return None

    def inline(key):
        task = tasks[key]
        below = {d: inline(d) for d in task.dependencies if d in tasks}
        if below:
            task = task.substitute(below)
        return Task(None, task.func, *task.args, **task.kwargs)

    return {key[1:]: (inline(key), TaskRef(min(deps, key=str)))
            for key, deps in plan[1].items()}


class Tasks:
    """The tasks of one new Dask layer, as they are described, and the collections they read.

    ``add(key, fn, *args)`` makes a task; its arguments may hold :meth:`ref` (another task's
    result), :meth:`call` (a task run inside the one that takes it), :meth:`items` (a list of
    such values) and :meth:`block` (a block of a Dask array: the block itself when it is in
    memory, else a reference, the array then becoming a dependency of the layer).
    """

    __slots__ = ("graph", "_reads", "_held")

    def __init__(self):
        self.graph: dict = {}
        self._reads: dict[str, Any] = {}
        self._held: dict[str, dict | None] = {}

    def add(self, key, fn: Callable, *args, **kwargs):
        """A task computing ``fn(*args, **kwargs)`` under ``key``; returns a reference to it."""
        from dask.task_spec import Task

        self.graph[key] = Task(key, fn, *args, **kwargs)
        return self.ref(key)

    def add_on_loop(self, key, fn: Callable, *args):
        """A task of coroutine function ``fn`` under ``key``, for graphs only a distributed
        cluster runs: a worker runs it on its event loop, and Dask's optimisation never fuses it
        into another task (:func:`_on_loop_class`); returns a reference to it."""
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"add_on_loop takes a coroutine function; {fn!r} is not one")
        self.graph[key] = _on_loop_class()(key, fn, *args)
        return self.ref(key)

    @staticmethod
    def ref(key):
        """The result of the task ``key`` (of this layer or another), as an argument."""
        from dask.task_spec import TaskRef

        return TaskRef(key)

    @staticmethod
    def call(fn: Callable, *args):
        """``fn(*args)`` run inside the task that takes it as an argument (no key of its own)."""
        from dask.task_spec import Task

        return Task(None, fn, *args)

    @staticmethod
    def items(values: Iterable):
        """A list argument whose entries may be references or nested calls."""
        from dask.task_spec import List

        return List(*values)

    def held(self, a) -> dict | None:
        """:func:`in_memory_blocks` of Dask array ``a``, worked out once per layer."""
        if a.name not in self._held:
            self._held[a.name] = in_memory_blocks(a)
        return self._held[a.name]

    def block(self, a, index: tuple):
        """Block ``index`` of Dask array ``a`` as an argument: the block when in memory (as
        ``from_array(..., inline_array=True)`` puts it in its tasks: the local scheduler then has
        no node per input block to order and release), else a reference to its key."""
        blocks = self.held(a)
        if blocks is not None:
            return blocks[index]
        self.read(a)
        return self.ref((a.name, *index))

    def read(self, collection) -> None:
        """Make ``collection`` (a Dask array or Delayed) a dependency of the layer."""
        self._reads.setdefault(collection.__dask_layers__()[0], collection)

    @property
    def dependencies(self) -> list:
        return list(self._reads.values())

    def array(self, name: str, chunks, dtype, meta):
        """The Dask array whose blocks are this layer's tasks ``(name, *index)``."""
        return _array(self.graph, name, chunks, dtype, meta, self.dependencies)


@functools.cache
def _on_loop_class():
    """The task class of :meth:`Tasks.add_on_loop`, made on first use (it derives from Dask's
    ``Task``, and importing chunkernels imports no Dask) and pickled by reference as
    ``chunkernels._graph.OnLoop`` (the module's ``__getattr__``).

    distributed runs a task whose function is a coroutine function on the worker's event loop,
    without handing it to the worker's thread and back: for a trivial task (picking one block of
    a group task's results) that hand-over is about half of what the task costs the worker.
    Dask's graph optimisation must not fuse such a task into another, though: a fused task runs
    in the thread and calls each function it holds as a plain one, and a coroutine function
    called so returns a coroutine, not its result. Dask's tasks say whether they may be fused
    (``block_fusion``, which distributed's own P2P barrier tasks set); these never are."""
    from dask.task_spec import Task

    class OnLoop(Task):
        """A task of a coroutine function that Dask never fuses into another."""

        __slots__ = ()

        @property
        def block_fusion(self) -> bool:
            return True

    OnLoop.__module__, OnLoop.__qualname__ = __name__, "OnLoop"
    return OnLoop


def __getattr__(name: str):
    if name == "OnLoop":  # how pickle finds the class of a task on the loop
        return _on_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _array(layer, name, chunks, dtype, meta, dependencies):
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    graph = HighLevelGraph.from_collections(name, layer, dependencies=dependencies)
    return da.Array(graph, name, chunks=chunks, dtype=dtype, meta=meta)


def block_args(x, ops: Sequence, tasks: Tasks) -> dict[tuple, list]:
    """Per block index of ``x``, the arguments a task on that block takes: the blocks of ``x``
    and of the operands ``ops``, paired right-aligned and broadcast along their single-chunk
    axes, as ``map_blocks`` pairs them (alignment is checked before)."""
    plans = []
    for a in (x, *ops):
        lead = x.ndim - a.ndim
        plans.append((a, tuple(None if nb == 1 else lead + j for j, nb in enumerate(a.numblocks))))
    return {index: [tasks.block(a, tuple(0 if ax is None else index[ax] for ax in axes))
                    for a, axes in plans]
            for index in np.ndindex(*x.numblocks)}


def map_blocks(fn: Callable, name: str, x, ops: Sequence, dtype, meta):
    """``da.map_blocks(fn, x, *ops)`` as one task per output block.

    Same keys, chunks, dtype and meta as ``map_blocks``. Measured on an H100, optimising
    ``map_blocks``' Blockwise layer costs Dask ~70 µs per chunk at persist time (fuse_roots,
    blockwise materialisation), as much as the kernel on a 128 MiB chunk; a materialised layer
    skips that work.
    """
    tasks = Tasks()
    for index, args in block_args(x, ops, tasks).items():
        tasks.add((name, *index), _labelled(fn, index), *args)
    return tasks.array(name, x.chunks, dtype, meta)


def reduce(fn: Callable, combine: Callable, name: str, x, ops: Sequence, *, chunks, dtype, meta):
    """A reduction: ``fn`` on every block (its partial result), then one task
    ``combine(partials)`` giving the single block of an array of ``chunks``."""
    tasks = Tasks()
    partials = [tasks.add((f"{name}-partial", *index), _labelled(fn, index), *args)
                for index, args in block_args(x, ops, tasks).items()]
    tasks.add((name, *(0,) * len(chunks)), combine, tasks.items(partials))
    return tasks.array(name, chunks, dtype, meta)


def blocks_then_combine(label: str, x, others: Sequence, block_task: Callable,
                        combine_task: Callable, *, token, chunks, dtype, meta):
    """A Dask array computed by one task per block and one combine task.

    ``block_task(origin, x_block, *other_blocks)`` runs on every block (``others`` are chunked
    like ``x``), ``origin`` being the block's global coordinates; ``combine_task(list)`` gets
    their results in block order and returns the single block of the result (``chunks``: one
    chunk per axis). Where one task takes many blocks (a GPU worker's), a ``block_task`` with a
    ``many(origins, blocks)`` method (``blocks``: each block's tuple of arrays) does their work
    at once, returning a result per block, which ``combine_task`` must take as it takes
    ``block_task``'s: the work of several blocks may be folded into one of them.
    """
    name = f"{label}-{tokenize(x, *others, token)}"
    starts = [np.cumsum((0,) + c[:-1]).tolist() for c in x.chunks]
    tasks = Tasks()

    def origin(index):
        return tuple(int(s[i]) for s, i in zip(starts, index))

    groups = _worker_groups_of((x, *others)) if _halo.group_placed([x._meta]) else None
    if groups is not None:
        # GPU workers: one task per worker runs the block task on each of its blocks (what a
        # task costs there is Dask's handling of it, not the launches it queues)
        if len(groups) == 1:  # one worker: its blocks and the combine in one task
            blocks = [tasks.block(a, index) for index in groups[0] for a in (x, *others)]
            where = f"blocks {groups[0][0]} to {groups[0][-1]} (one task)"
            tasks.add((name, *(0,) * len(chunks)),
                      _Labelled(_each_block_then, where, block_task), combine_task, block_task,
                      tuple(map(origin, groups[0])), 1 + len(others), *blocks)
            return tasks.array(name, chunks, dtype, meta)
        parts = []
        for g, members in enumerate(groups):
            where = f"blocks {members[0]} to {members[-1]} (one task)"
            parts.append(tasks.add(
                (f"{name}-group", g), _Labelled(_each_block, where, block_task), block_task,
                tuple(map(origin, members)), 1 + len(others),
                *(tasks.block(a, index) for index in members for a in (x, *others))))
        number = {index: b for b, index in enumerate(np.ndindex(*x.numblocks))}
        positions = tuple(tuple(number[i] for i in members) for members in groups)
        tasks.add((name, *(0,) * len(chunks)), _combine_in_block_order, combine_task, positions,
                  *parts)
        return tasks.array(name, chunks, dtype, meta)
    results = []
    for index in np.ndindex(*x.numblocks):
        args = [tasks.block(a, index) for a in (x, *others)]
        results.append(tasks.add((f"{name}-block", *index), _labelled(block_task, index),
                                 origin(index), *args))
    tasks.add((name, *(0,) * len(chunks)), combine_task, tasks.items(results))
    return tasks.array(name, chunks, dtype, meta)


def _worker_groups_of(arrays) -> list[list[tuple]] | None:
    """The block indices of the first of ``arrays`` per worker that holds or will compute them
    (:func:`placements` with ``computed``, :func:`by_worker`) when every one's blocks of each
    index are (or will be) on the same worker, else None (one question to the scheduler)."""
    where = placements(arrays, computed=True)
    if any(w is None or w != where[0] for w in where):
        return None
    return by_worker(where[0], arrays[0].numblocks)


def _each_block(block_task, origins, per_block, *blocks) -> list:
    """``block_task(origin, *its blocks)`` for each of a worker's blocks (``per_block`` arrays
    each, one after the other in ``blocks``), or ``block_task.many`` of them all where it has
    one (see :func:`blocks_then_combine`)."""
    each = [blocks[b * per_block:(b + 1) * per_block] for b in range(len(origins))]
    many = getattr(block_task, "many", None)
    if many is not None:
        return many(origins, each)
    return [block_task(origin, *arrays) for origin, arrays in zip(origins, each)]


def _each_block_then(combine_task, block_task, origins, per_block, *blocks):
    """``combine_task`` of :func:`_each_block`: every block of the array on one worker."""
    return combine_task(_each_block(block_task, origins, per_block, *blocks))


def _combine_in_block_order(combine_task, positions, *groups):
    """``combine_task`` of the groups' block results put back in block order (``positions``:
    each group's block numbers)."""
    results = [None] * sum(map(len, positions))
    for numbers, part in zip(positions, groups):
        for b, result in zip(numbers, part):
            results[b] = result
    return combine_task(results)


def of_single_block(fn: Callable, a, shape: tuple, dtype, meta, token=None):
    """A Dask array of one block, ``fn`` of the single block of Dask array ``a``. ``token``, when
    given, stands for ``fn`` in the array's name: what determines it, cheaper to tokenize than
    ``fn`` (whose state Dask's tokenize pickles)."""
    name = _single_block_name(fn, a, token)
    tasks = Tasks()
    tasks.add((name, *(0,) * len(shape)), fn, tasks.block(a, (0,) * a.ndim))
    return tasks.array(name, tuple((n,) for n in shape), dtype, meta)


def delayed_of_single_block(fn: Callable, a, token=None):
    """A Dask Delayed of one task, ``fn`` of the single block of Dask array ``a``: what a task
    returns that is no array (a dict of columns), computed without a finalize task. ``token``
    as :func:`of_single_block` takes it."""
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    name = _single_block_name(fn, a, token)
    tasks = Tasks()
    tasks.add(name, fn, tasks.block(a, (0,) * a.ndim))
    return Delayed(name, HighLevelGraph.from_collections(name, tasks.graph,
                                                         dependencies=tasks.dependencies))


def assembled(blocks: Sequence, numblocks: Sequence[int]):
    """One array of ``blocks``, a grid of ``numblocks`` blocks in C order (the last axis
    fastest), joined axis by axis on their device; a lone block is returned as it is."""
    xp = cuda.array_module(blocks[0])
    blocks = list(blocks)
    for axis in range(len(numblocks) - 1, -1, -1):
        n = numblocks[axis]
        if n > 1:
            blocks = [xp.concatenate(blocks[i:i + n], axis=axis) for i in range(0, len(blocks), n)]
    return blocks[0]


def _single_block_name(fn: Callable, a, token) -> str:
    """The name of a one-task layer ``fn`` of ``a``'s single block: ``fn``'s name and the token
    of ``fn`` (or of ``token``, which stands for it) and ``a``."""
    return (f"{getattr(fn, 'func', fn).__name__.strip('_')}-"
            f"{tokenize(fn if token is None else token, a)}")


def with_noop_tasks(collection):
    """``collection`` (a Dask array) with every task's function replaced by one that returns at
    once: what Dask's own handling of the graph costs (the benchmarks' "Dask alone" rows)."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from dask.task_spec import Task

    graph = collection.__dask_graph__()
    layers = {name: MaterializedLayer({
        key: Task(key, _noop, *node.args, **node.kwargs) if isinstance(node, Task) else node
        for key, node in layer.items()}) for name, layer in graph.layers.items()}
    return da.Array(HighLevelGraph(layers, graph.dependencies), collection.name,
                    chunks=collection.chunks, dtype=collection.dtype, meta=collection._meta)


def _noop(*args, **kwargs) -> None:
    return None


# -- errors that say which block -------------------------------------------------------------------


class _Labelled:
    """``fn`` run on ``where`` (a block index, or a text naming blocks): an exception it raises
    carries a note naming the kernel (``about``, or ``fn``) and the block, keeping its type, so
    that the client sees where it happened."""

    __slots__ = ("fn", "where", "about")

    def __init__(self, fn, where, about=None):
        self.fn = fn
        self.where = where
        self.about = about

    def __call__(self, *args, **kwargs):
        try:
            return self.fn(*args, **kwargs)
        except Exception as exc:
            add_block_note(exc, self.fn if self.about is None else self.about, self.where)
            raise

    def __reduce__(self):
        return _Labelled, (self.fn, self.where, self.about)


def _labelled(fn, index, about=None) -> _Labelled:
    return _Labelled(fn, tuple(int(i) for i in index), about)


def add_block_note(exc: BaseException, about, where) -> None:
    """Note on ``exc``, once, that it was raised by ``about`` (a kernel's block function, whose
    spec names the kernel, a name, or any function) on ``where`` (a block index or a text)."""
    spec = getattr(about, "spec", None)
    if spec is not None:
        what = f"kernel {spec.name!r}"
    elif isinstance(about, str):
        what = about
    else:
        what = getattr(about, "name", None) or getattr(getattr(about, "func", about),
                                                        "__qualname__", "a task")
    place = f"block {where}" if isinstance(where, tuple) else where
    note = f"chunkernels: raised by {what} on {place}"
    if note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)


# -- graph shapes decided where the graph runs ---------------------------------------------------


def chosen_array(name: str, *, local: Callable[[], dict], cluster: Callable[[], dict],
                 chunks, dtype, meta, dependencies: Sequence = (), placed=None):
    """A Dask array whose tasks ``local()`` builds when the graph is materialised in the process
    that made it (Dask's local schedulers) and ``cluster()`` builds where it was sent (a
    distributed scheduler). Both return ``{key: task}`` with the same output keys
    ``(name, *index)``; ``cluster`` must pickle (a module-level function or a
    ``functools.partial`` of one). ``placed``, ``{block index: worker address}``: where the
    cluster shape computes each block, when the builder knows it (a label over placed blocks),
    for :func:`placement` with ``computed`` (a graph built over the array before it runs, such
    as measurements of lazy labels, then takes the same worker groups)."""
    layer = _chosen_layer_class()(local, cluster)
    layer.placed = None if placed is None else dict(placed)
    return _array(layer, name, chunks, dtype, meta, dependencies)


@functools.cache
def _chosen_layer_class():
    """The layer class of :func:`chosen_array`, made on first use (it derives from Dask's
    ``Layer``, and importing chunkernels imports no Dask)."""
    from dask.highlevelgraph import Layer

    class Chosen(Layer):
        """A layer built when it is materialised: by ``local()`` where it was made, by
        ``cluster()`` once serialised (see :func:`chosen_array`)."""

        def __init__(self, local, cluster, remote=False, annotations=None):
            super().__init__(annotations=annotations)
            self.local = local
            self.cluster = cluster
            self.remote = remote
            self.placed = None  # known where it was built: see chosen_array
            self._mapping = None

        @property
        def mapping(self) -> dict:
            if self._mapping is None:
                self._mapping = (self.cluster if self.remote else self.local)()
            return self._mapping

        def __getitem__(self, key):
            return self.mapping[key]

        def __iter__(self):
            return iter(self.mapping)

        def __len__(self):
            return len(self.mapping)

        def __contains__(self, key):
            return key in self.mapping

        def is_materialized(self) -> bool:
            return self._mapping is not None

        def get_output_keys(self):
            return self.mapping.keys()

        def __reduce__(self):
            # serialised: on its way to a distributed scheduler, which builds the cluster shape
            return _rebuild_chosen, (self.cluster, self.annotations)

    Chosen.__name__ = Chosen.__qualname__ = "ChosenLayer"
    return Chosen


def _rebuild_chosen(cluster, annotations):
    return _chosen_layer_class()(None, cluster, True, annotations)


# -- placement on a cluster ------------------------------------------------------------------------


def placement(a, *, computed: bool = False) -> dict[tuple, str] | None:
    """Where the blocks of Dask array ``a`` live: ``{block index: worker address}`` when they
    are futures of the current distributed client, each held by one worker, else None (lazy or
    local blocks, or blocks held twice).

    With ``computed``, also where they will be computed: a lazy block computed by tasks of one
    block each (:func:`map_blocks`, ``threshold``, Dask's elementwise operations and slices; up
    to :data:`LAZY_LAYERS` of them) from persisted blocks all held by the same worker is
    computed there (Dask runs a task where its inputs are).
    """
    return placements([a], computed=computed)[0]


def placements(arrays, *, computed: bool = False) -> list[dict[tuple, str] | None]:
    """:func:`placement` of each of ``arrays``, asking the scheduler once."""
    client = current_client()
    if client is None:
        return [None] * len(arrays)
    declared = [_declared_placement(a) if computed else None for a in arrays]
    plans = [None if d is not None else _block_sources(a, computed)
             for a, d in zip(arrays, declared)]
    futures = {f.key: f for plan in plans if plan is not None for f in plan[0].values()}
    who = client.who_has(list(futures.values())) if futures else {}
    return [d if d is not None else None if plan is None else _placed(*plan[:3], who)
            for d, plan in zip(declared, plans)]


def _declared_placement(a) -> dict[tuple, str] | None:
    """Where the blocks of ``a`` will be computed, as the builder of its :func:`chosen_array`
    layer declared it (``placed``), else None."""
    layer = a.dask.layers.get(a.name)
    placed = getattr(layer, "placed", None) if isinstance(layer, _chosen_layer_class()) else None
    return dict(placed) if placed is not None and len(placed) == a.npartitions else None


#: How many layers of per-block tasks (Dask's elementwise operations and slicing,
#: ``map_blocks``, ``threshold``) :func:`placement` with ``computed`` looks through, down to the
#: persisted blocks they read; and how many tasks a layer it reads may have, per block of the
#: array (a layer it looks into is materialised, as the scheduler would materialise it).
LAZY_LAYERS = 16
LAZY_TASKS_PER_BLOCK = 4


def _block_sources(a, computed):
    """``({key: future}, {block key: the persisted keys it reads}, keys, {lazy key: task})`` for
    :func:`placements`: the persisted blocks ``a`` is or reads, which of them each lazy block
    reads (through up to :data:`LAZY_LAYERS` layers of tasks), the array's block keys, and the
    lazy tasks between them; None where its placement cannot be known (a block that reads no
    persisted block, or a layer of many more tasks than blocks: a reduction, a rechunk, or a
    layer of :func:`chosen_array`, which is not built here)."""
    layer = a.dask.layers.get(a.name)
    if isinstance(layer, _chosen_layer_class()):
        return None
    if layer is None or len(layer) != a.npartitions or not (
            computed or layer.is_materialized()):
        return None
    from dask.task_spec import Task
    from distributed import Future

    limit = LAZY_TASKS_PER_BLOCK * max(1, a.npartitions)
    futures, reads, tasks, seen = {}, {}, {}, {}

    def node(key):
        below = a.dask.layers.get(key[0]) if isinstance(key, tuple) and key else None
        if below is None or isinstance(below, _chosen_layer_class()) or len(below) > limit:
            return None
        return below.get(key)

    def persisted(key, depth):
        """The persisted keys that ``key`` reads, None where not known."""
        if key in seen:
            return seen[key]
        value = node(key)
        found = None
        if isinstance(value, Future):
            futures[key] = value
            found = frozenset((key,))
        elif depth and isinstance(value, Task) and value.dependencies:
            below = [persisted(d, depth - 1) for d in value.dependencies]
            if all(b is not None for b in below):
                tasks[key] = value
                found = frozenset().union(*below)
        seen[key] = found
        return found

    for key in layer:
        value = layer[key]
        if isinstance(value, Future):
            futures[key] = value
        elif not computed or (found := persisted(key, LAZY_LAYERS)) is None or key not in tasks:
            return None
        else:
            reads[key] = found
    return futures, reads, list(layer), tasks


def _placed(futures, reads, keys, who) -> dict[tuple, str] | None:
    at = {}
    for key, future in futures.items():
        holders = who.get(future.key) or ()  # a block moved into place has a key of its own
        if len(holders) != 1:
            return None
        at[key] = holders[0]
    out = {}
    for key in keys:
        workers = {at[d] for d in reads[key]} if key in reads else {at[key]}
        if len(workers) != 1:
            return None
        out[key[1:]] = workers.pop()
    return out


def by_worker(where, numblocks) -> list[list[tuple]]:
    """The block indices of :func:`placement`'s ``where`` per worker, each list in block order,
    the workers in address order."""
    groups: dict[str, list] = {}
    for index in np.ndindex(*numblocks):
        groups.setdefault(where[index], []).append(index)
    return [groups[w] for w in sorted(groups)]


def tiles(numblocks: Sequence[int], n: int) -> dict[tuple, int]:
    """Each block index's tile, ``0 <= tile < n``: contiguous tiles of blocks, balanced.

    Where ``n`` factors over the axes into tiles of equal block counts, the factorisation with
    the least cut between tiles (the block faces a halo exchange sends across) wins, the first
    axes cut first (slabs of C order). Otherwise the blocks in C order are cut into ``n`` runs
    whose lengths differ by at most one. Tiles are numbered in C order of their position.
    """
    if n < 1:
        raise ValueError(f"tiles for n={n} workers; expected at least one")
    numblocks = tuple(int(b) for b in numblocks)
    total = math.prod(numblocks)
    best = None
    for factors in _factorisations(n, len(numblocks)):
        if all(b % f == 0 for b, f in zip(numblocks, factors)):
            cut = sum((f - 1) * total // b for f, b in zip(factors, numblocks) if b)
            rank = (cut, tuple(-f for f in factors))  # ties: cut the first axes first
            if best is None or rank < best[0]:
                best = (rank, factors)
    indices = list(np.ndindex(*numblocks))
    if best is not None:
        factors = best[1]
        sizes = [b // f for b, f in zip(numblocks, factors)]
        return {index: int(np.ravel_multi_index(tuple(i // s for i, s in zip(index, sizes)),
                                                factors)) for index in indices}
    return {index: min(n - 1, position * n // max(total, 1))
            for position, index in enumerate(indices)}


def _factorisations(n: int, ndim: int):
    """Every way of writing ``n`` as a product of ``ndim`` positive factors, in order."""
    if ndim == 0:
        if n == 1:
            yield ()
        return
    for f in range(1, n + 1):
        if n % f == 0:
            for rest in _factorisations(n // f, ndim - 1):
                yield (f, *rest)


# -- the halo exchange -------------------------------------------------------------------------------


def overlap(fn: Callable, name: str, x, ops: Sequence, depth: tuple[int, ...],
            boundary: tuple[str, ...], dtype, meta):
    """``fn`` over ``x`` (and same-chunked ``ops``) with a halo of ``depth``; a Dask array.

    ``fn(block, *operand_blocks)`` receives each block extended by its halo and returns a result
    of the same shape; the result's core region becomes the output block. ``boundary[a]`` is
    ``"none"`` (no halo beyond the array's edge: the kernel applies its own edge mode there) or
    ``"periodic"`` (the halo wraps around) for each axis ``a``. The graph's shape, see
    :mod:`chunkernels._halo`:

    * inputs persisted on the current cluster, each block on one worker: a kernel task per block
      (per group of a worker's blocks, on GPU workers) reads its neighbours on the same worker
      in place, and the strips that cross workers travel in one batch per pair of workers
      (:func:`_placed_graph`);
    * otherwise, built where the graph is materialised (:func:`chosen_array`): locally, CuPy
      blocks in memory run in group tasks, other blocks a task each (strip tasks for lazy
      inputs); on a cluster, a task per block with strip tasks for lazy inputs.
    """
    inputs = (x, *ops)
    held = [in_memory_blocks(a) for a in inputs]
    dependencies = [a for a, blocks in zip(inputs, held) if blocks is None]
    chunks = tuple(map(tuple, x.chunks))
    if dependencies:
        where = _common_placement(inputs)
        if where is not None:
            return _array(_placed_graph(fn, name, inputs, where, chunks, depth, boundary), name,
                          x.chunks, dtype, meta, dependencies)
    itemsize = np.dtype(dtype).itemsize
    names = [a.name for a in inputs]
    args = (fn, name, names, held, chunks, tuple(depth), tuple(boundary))
    return chosen_array(
        name, local=functools.partial(_overlap_local, *args, itemsize),
        cluster=functools.partial(_overlap_blocks, *args), chunks=x.chunks, dtype=dtype,
        meta=meta, dependencies=dependencies)


def _common_placement(inputs) -> dict | None:
    """:func:`placement` of the first input when every input's block of each index lives on
    the same worker, else None (one question to the scheduler)."""
    where = placements(inputs)
    return None if any(w is None or w != where[0] for w in where) else where[0]


def _overlap_jobs(fn, name, names, held, chunks, depth, boundary):
    """The tasks of a halo exchange before their grouping: strip tasks (lazy inputs) and, per
    output key, ``(plan, cores, pieces)`` (``(None, cores)`` for an empty block)."""
    tasks = Tasks()
    strip_names = [f"{name}-strips-{i}" for i in range(len(names))]
    lazy = any(blocks is None for blocks in held)
    pack = tasks.items if lazy else tuple  # plain tuples unless they hold references
    targets, cuts = _halo.plans(chunks, depth, boundary, lazy)
    for source, wanted in cuts.items():
        ranges = tuple(wanted)  # insertion order: the positions handed out in the plans
        for inp, blocks, strips in zip(names, held, strip_names):
            if blocks is None:
                tasks.add((strips, *source), _halo.cut, tasks.ref((inp, *source)), ranges)
    jobs = {}
    for index, target in targets.items():
        cores = pack([tasks.ref((inp, *index)) if blocks is None else blocks[index]
                      for inp, blocks in zip(names, held)])
        if target is None:
            jobs[(name, *index)] = (None, cores)
            continue
        plan, placements = target
        pieces = []
        for blocks, strips in zip(held, strip_names):
            if blocks is None:  # the strip tasks' outputs, picked in placement order
                sources = list(dict.fromkeys(source for source, *_ in placements))
                refs = tasks.items(tasks.ref((strips, *s)) for s in sources)
                picks = tuple((sources.index(s), cuts[s][c]) for s, c, _, _ in placements)
                pieces.append(tasks.call(_halo.pick, refs, picks))
            else:  # the blocks in memory, not cut: the gather reads the pieces in place
                pieces.append(tuple([_halo.Held(blocks[s], c) for s, _, c, _ in placements]))
        jobs[(name, *index)] = (plan, cores, pack(pieces))
    return tasks, jobs


def _overlap_blocks(fn, name, names, held, chunks, depth, boundary) -> dict:
    """A task per output block (and strip tasks for lazy inputs)."""
    tasks, jobs = _overlap_jobs(fn, name, names, held, chunks, depth, boundary)
    for key, job in jobs.items():
        if job[0] is None:
            tasks.add(key, _halo.call, fn, job[1])
        else:
            tasks.add(key, _labelled(_halo.extend_and_run, key[1:], fn), fn, *job)
    return tasks.graph


def _overlap_local(fn, name, names, held, chunks, depth, boundary, itemsize) -> dict:
    """Under a local scheduler: CuPy blocks in memory run in group tasks
    (:func:`_halo.group_blocks`); anything else a task per block."""
    if not _halo.group_blocks(held):
        return _overlap_blocks(fn, name, names, held, chunks, depth, boundary)
    tasks, jobs = _overlap_jobs(fn, name, names, held, chunks, depth, boundary)

    def group(key, where, members):
        return tasks.add(key, _Labelled(_halo.run_group, where, fn), fn,
                         tuple(tuple(jobs[k]) for k in members))

    _group_tasks(tasks, name, jobs, chunks, itemsize, limit=_halo.GROUP_BYTES, group=group)
    return tasks.graph


def _group_tasks(tasks, name, keys, chunks, itemsize, *, limit, group,
                 pick_inputs=None) -> None:
    """Group tasks over the output ``keys`` (in order), each made by ``group(key, where,
    members)`` for at most ``limit`` bytes of output (:func:`byte_runs`; ``where``: the blocks
    it computes, for its errors), and per output key a task picking its result;
    ``pick_inputs(key)``: the references a pick task also takes, as dependencies only, on a
    cluster (:func:`_placed_graph`), where the picks are coroutines
    (:func:`_halo.picked_on_worker`)."""
    on_loop = pick_inputs is not None
    for members in byte_runs([k[1:] for k in keys], chunks, itemsize, limit):
        members = [(name, *index) for index in members]
        key = (f"{name}-group", len(tasks.graph))
        where = (f"blocks {members[0][1:]} to {members[-1][1:]} (one task)" if len(members) > 1
                 else tuple(members[0][1:]))
        ref = group(key, where, members)
        for position, k in enumerate(members):
            if on_loop:
                tasks.add_on_loop(k, _halo.picked_on_worker, ref, position, *pick_inputs(k))
            else:
                tasks.add(k, _halo.picked, ref, position)


def byte_runs(indices, chunks, itemsize: int, limit: int) -> list[list[tuple]]:
    """The block ``indices`` (in order) of a grid of ``chunks`` cut into runs of at most
    ``limit`` bytes (``itemsize`` bytes an element; a block larger than that is a run alone):
    what one group task of a worker computes."""
    runs, run, size = [], [], 0
    for index in indices:
        nbytes = itemsize * math.prod(c[i] for c, i in zip(chunks, index))
        if run and size + nbytes > limit:
            runs.append(run)
            run, size = [], 0
        run.append(index)
        size += nbytes
    if run:
        runs.append(run)
    return runs


def _placed_graph(fn, name, inputs, where, chunks, depth, boundary):
    """The halo exchange over inputs persisted on a cluster (``where``: each block index's
    worker). A kernel task per block reads the pieces its halo needs from blocks on its own
    worker in place (no copy, no transfer); the pieces held by other workers are cut by one
    task per (source worker, destination worker) pair, so that each pair exchanges one message
    per run (:class:`~chunkernels._halo.Strips`), and each kernel task picks its pieces from
    it. The cuts are submitted when the graph is built (they read blocks already in memory);
    the scheduler runs each kernel task where most of the bytes it reads are: where its core
    block and its neighbours are (a batch of strips is small). (No worker is pinned: Dask's
    array optimisation drops layer annotations, and a lost worker's tasks must run elsewhere.)

    On GPU workers (one thread each) a kernel task only queues launches, and what a task costs
    is the worker's handling of it: its message, its run spec unpickled, its dependencies looked
    up (about 1 ms for a halo task with nine blocks, as much as the kernel on a 128 MiB chunk).
    There each worker's blocks run in group tasks of at most
    :data:`~chunkernels._halo.PLACED_GROUP_BYTES` of output (:func:`_group_tasks`), the blocks
    whose halo crosses workers apart, so that the others run while their strips travel. A group
    task is one flat task (:func:`_halo.run_placed`): the blocks and batches it reads are its
    arguments, and its blocks' plans plain data, so that it costs the client, the scheduler and
    the worker one task, not one per piece (a graph of nested tasks, a piece each, took longer
    to build, send and unpack than the GPUs took to run it). A pick task also takes its block's
    inputs: Dask's scheduler counts a task group whose dependencies hold fewer than 5 tasks in
    all as "root-ish" and hands a worker one at a time, a round trip each (64 picks of 4 groups
    took 200 ms on one H100 that way). The picks are coroutines
    (:func:`_halo.picked_on_worker`), which a worker runs on its event loop: this graph reads
    the cluster's futures, so only a distributed scheduler runs it."""
    names = [a.name for a in inputs]
    targets, _ = _halo.plans(chunks, depth, boundary, False)
    tasks = Tasks()
    # per (source worker, destination worker): the (input, source index, cut) pieces, in order
    batches: dict[tuple[str, str], dict[tuple, int]] = {}
    for index, target in targets.items():
        if target is None:
            continue
        _, placements = target
        here = where[index]
        for source, ranges, _, _ in placements:
            there = where[source]
            if there != here:
                wanted = batches.setdefault((there, here), {})
                for i in range(len(names)):
                    wanted.setdefault((i, source, ranges), len(wanted))
    # The batches are cut now, before the kernels' graph is sent: their inputs are in memory,
    # and a cut's copy to the host, made on the source's GPU, must not queue behind the kernels
    # that graph launches there. Each is cut on its source worker; the border group that reads
    # it takes the cut itself, so the scheduler hands the reader that group as soon as the graph
    # arrives (its inputs are in memory by then), and the reader fetches the batch while its
    # other groups run and runs the group when the batch is there. A task of its own on the
    # reader that moved the batch first (and uploaded it) made the border group wait for that
    # task's completion to reach the scheduler and the group to come back: 8 ms a run on four
    # H100s, where a worker's other blocks are too few to hide it (77.8 against 70.6 ms for the
    # 16 GiB Gaussian, interleaved; no change on two). The layer holds the batches' futures, so
    # they live as long as the graph.
    batch_keys, moves, home = {}, Tasks(), {}
    for (there, here), wanted in batches.items():
        key = (f"{name}-batch", len(batch_keys))
        batch_keys[(there, here)] = key
        sources = list(dict.fromkeys((i, s) for i, s, _ in wanted))
        cuts = np.array([(sources.index((i, s)), *(n for r in c for n in r))
                         for i, s, c in wanted], dtype=np.int64)
        blocks = [inputs[i].dask.layers[names[i]][(names[i], *s)] for i, s in sources]
        moves.add(key, _halo.cut_many, moves.items(blocks), cuts)
        home[key] = there
    if moves.graph:  # none where no halo crosses workers (one worker): no message
        tasks.graph.update(_submitted(moves.graph, home, list(batch_keys.values())))
    # per output key: (plan, core keys, pieces) with keys for what it reads, each piece
    # (key of a block, its slices) read in place or (key of a batch, position in it)
    jobs: dict[tuple, tuple] = {}
    groups: dict[tuple, list] = {}  # per (worker, reads batches): output keys in block order
    for index, target in targets.items():
        key = (name, *index)
        cores = tuple((n, *index) for n in names)
        if target is None:
            jobs[key] = (None, cores, ())
            reads = False
        else:
            plan, placements = target
            here = where[index]
            pieces, reads = [], False
            for i, n in enumerate(names):
                own = []
                for source, ranges, cut, _ in placements:
                    there = where[source]
                    if there == here:
                        own.append(((n, *source), cut))
                    else:
                        own.append((batch_keys[(there, here)],
                                    batches[(there, here)][(i, source, ranges)]))
                        reads = True
                pieces.append(tuple(own))
            jobs[key] = (plan, cores, tuple(pieces))
        groups.setdefault((where[index], reads), []).append(key)
    if not _halo.group_placed([a._meta for a in inputs]):
        # NumPy blocks (CPU workers): a task per block, which a worker's threads run in parallel
        for key, (plan, cores, pieces) in jobs.items():
            blocks = tasks.items(tasks.ref(k) for k in cores)
            if plan is None:
                tasks.add(key, _halo.call, fn, blocks)
                continue
            parts = tasks.items(tasks.items(
                tasks.call(_halo.Held, tasks.ref(k), what) if isinstance(what, tuple)
                else tasks.call(_halo.picked, tasks.ref(k), what) for k, what in own)
                for own in pieces)
            tasks.add(key, _labelled(_halo.extend_and_run, key[1:], fn), fn, plan, blocks,
                      parts)
        return tasks.graph

    def group(key, where, members):
        reads = {}  # the keys the group reads, in order: its arguments after the jobs
        for k in members:
            plan, cores, pieces = jobs[k]
            for read in (*cores, *(r for own in pieces for r, _ in own)):
                reads.setdefault(read, len(reads))
        flat = tuple((plan, tuple(reads[c] for c in cores),
                      tuple(tuple((reads[r], what) for r, what in own) for own in pieces))
                     for plan, cores, pieces in (jobs[k] for k in members))
        return tasks.add(key, _Labelled(_halo.run_placed, where, fn), fn, flat,
                         *(tasks.ref(r) for r in reads))

    itemsize = max(np.dtype(a.dtype).itemsize for a in inputs)
    for members in groups.values():
        _group_tasks(tasks, name, members, chunks, itemsize, limit=_halo.PLACED_GROUP_BYTES,
                     group=group, pick_inputs=lambda k: [tasks.ref(c) for c in jobs[k][1]])
    return tasks.graph


def _submitted(graph: dict, home: dict, keys: list) -> dict:
    """The tasks of ``graph`` submitted to the current client in one message, each to run on
    the worker ``home`` names for its key (a preference: another may run it if that one is
    lost); the futures of ``keys`` by key (the other tasks are released once used).

    One message, not one ``Client.submit`` each: the scheduler handles each submission in a
    millisecond or two, and the graph that reads these results, sent next, waits behind them
    (24 submissions held a 4-GPU halo exchange's first kernel task back by about 35 ms)."""
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    name = f"submitted-{tokenize(sorted(map(str, graph)))}"
    layer = MaterializedLayer(graph, annotations={"workers": lambda key: [home[key]],
                                                  "allow_other_workers": True})
    futures = current_client().get(HighLevelGraph({name: layer}, {name: set()}), keys,
                                   sync=False)
    return dict(zip(keys, futures))


def persist_blocks(a, blocks_by_worker: dict[str, list[tuple]], client):
    """Dask array ``a`` computed on ``client``'s workers, each worker making the blocks of its
    list (a preference: a lost worker's blocks are made elsewhere): a Dask array of the same
    chunks and meta whose blocks are those futures, returned once they are in memory. Blocks
    already computed on the cluster (futures) are copied to their worker by a task each, under
    a new name."""
    from distributed import Future, futures_of, wait

    layer = a.dask.layers.get(a.name)
    computed = (layer is not None and layer.is_materialized() and len(layer) == a.npartitions
                and all(isinstance(v, Future) for v in layer.values()))
    name = f"placed-{a.name}" if computed else a.name
    futures = {}
    if computed:
        for worker, indices in blocks_by_worker.items():
            for index in indices:
                futures[(name, *index)] = client.submit(
                    _same, layer[(a.name, *index)], key=(name, *index), workers=[worker],
                    allow_other_workers=True, pure=False)
    else:
        delayed = a.to_delayed(optimize_graph=True)
        for worker, indices in blocks_by_worker.items():
            if indices:
                parts = client.persist([delayed[index] for index in indices], workers=[worker],
                                       allow_other_workers=True)
                for index, part in zip(indices, parts):
                    (futures[(name, *index)],) = futures_of(part)
    wait(list(futures.values()))
    # a preference, not a pin (a lost worker's blocks must be made elsewhere): where work
    # stealing moved some, copy them to their worker; stealing may move a copy too (a copy
    # runs best where its block is), so check again, a few times at most. A round that copies
    # any block puts every block under a new name, the others by a task on the worker already
    # holding them (the same object, no copy), so that each key of the array is its block's
    # own: a block under another key would make the array's key an alias task in every graph
    # that reads it, and the scheduler, still holding the original key, refuses a task of
    # that key with other dependencies (distributed's "Detected different `run_spec`")
    wanted = {(name, *index): worker for worker, indices in blocks_by_worker.items()
              for index in indices}
    for attempt in range(PLACEMENT_ATTEMPTS):
        who = client.who_has(list(futures.values()))
        if all(wanted[key] in who.get(f.key, ()) for key, f in futures.items()):
            break
        renamed = f"placed-{attempt}-{a.name}"
        moved = {(renamed, *key[1:]): client.submit(
                     _same, future, workers=[wanted[key]], key=(renamed, *key[1:]),
                     allow_other_workers=True, pure=False)
                 for key, future in futures.items()}
        wait(list(moved.values()))
        wanted = {(renamed, *key[1:]): worker for key, worker in wanted.items()}
        futures, name = moved, renamed
    return _array(futures, name, a.chunks, a.dtype, a._meta, [])


#: How many times :func:`persist_blocks` copies blocks that work stealing moved off their worker.
PLACEMENT_ATTEMPTS = 3


def _same(block):
    return block
