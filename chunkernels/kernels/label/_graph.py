"""label's Dask graph (:func:`plan`), the tasks it runs (a local labelling per block, one
merge, a relabel per block, or all three in one task), and :data:`SPEC`, which names the graph
and whose check of a block the tasks ask before they label it on the GPU.

The top of :mod:`chunkernels.kernels.label`: the spec lives here, beside the graph, because the
two need each other (the spec's ``dask_graph`` is :func:`dask_graph`; :func:`gpu_takes` and
:class:`_LocalLabels` ask ``SPEC.check_block``).
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings

import numpy as np
import scipy.ndimage as ndi

from chunkernels import _halo, cuda
from chunkernels._errors import CPUFallbackWarning, GPUOutOfMemoryError, UnsupportedBlockError
from chunkernels._registry import KernelSpec
from chunkernels.kernels.label._device_merge import _DeviceNumbering, _table_device, merge_device
from chunkernels.kernels.label._forest import (
    _BATCH,
    _NATIVE,
    _Forest,
    _index64,
    _local_device,
    _local_host,
    _supports,
    dispatch,
)
from chunkernels.kernels.label._host_merge import _MergePlan, _table, merge
from chunkernels.kernels.label._reference import (
    GPU_DTYPES,
    MAX_NDIM,
    _result_dtype,
    _validate,
    check_structure,
    default_dtype,
    reference,
)

#: Pixels of the blocks of one batch at most (:meth:`_LocalLabels.many`): a batch's scan of root
#: flags is as large as its blocks, so the batch stays within what one block's would be under
#: 2**26.
_BATCH_PIXELS = 1 << 26


def gpu_takes(x, structure, dtype=None, *, strict=False) -> bool:
    """Whether the CUDA kernels label CuPy array ``x``; if not, raise under ``strict``, else warn
    that SciPy labels it (a host round trip)."""
    ok, reason = SPEC.check_block(x, structure=structure, dtype=dtype)
    if ok:
        return True
    if strict:
        raise UnsupportedBlockError(
            f"label: the GPU path refuses this array of shape {x.shape}: {reason}. Pass "
            f"strict=False to label it with SciPy (a host round trip)")
    warnings.warn(f"label: {reason}; labelling this array of shape {x.shape} with SciPy (copies "
                  f"it to the host and back)", CPUFallbackWarning, stacklevel=3)
    return False



class _LocalLabels:
    """Task body of step 1: ``block -> (local labels, summary)``; NumPy blocks use SciPy, CuPy
    blocks the CUDA kernels (or, for blocks they refuse, SciPy with a warning)."""

    def __init__(self, structure, strict):
        self.structure = structure
        self.strict = strict

    def __call__(self, block):
        if not cuda.is_cupy_array(block):
            return _local_host(np.asarray(block), self.structure)
        with block.device:
            if gpu_takes(block, self.structure, strict=self.strict):
                return _local_device(block, self.structure)
            labels, summary = _local_host(block.get(), self.structure)
            return cuda.cupy().asarray(labels), cuda.cupy().asarray(summary)

    def many(self, blocks) -> tuple[list[tuple], list[tuple]]:
        """``[self(block) for block in blocks]``, CuPy blocks of one layout (device, shape,
        strides, dtype; at most 3-D) labelled together, a batch (:meth:`_Forest.batch`) taking
        one launch of each kernel where a block alone would take as many: what a task that
        labels many blocks costs the host grows with their layouts, not their number.

        Returns ``(results, batches)``. A batch's blocks are left as a forest: their results are
        ``(None, summary)``, and ``batches`` holds ``(forest, the blocks' indices)`` for
        :meth:`_DeviceNumbering.relabel_batch`, or :meth:`_Forest.write_summary` for their local
        labels."""
        results = [None] * len(blocks)
        by_layout, takes = {}, {}
        for i, block in enumerate(blocks):
            if cuda.is_cupy_array(block) and block.size:
                key = (block.device.id, block.shape, block.strides, block.dtype)
                ok = takes.get(key)
                if ok is None:  # asked once per layout
                    ok = takes[key] = (block.ndim < MAX_NDIM and block.dtype.name in _NATIVE
                                       and not _index64(block)
                                       and SPEC.check_block(block, structure=self.structure)[0])
                if ok:
                    by_layout.setdefault(key, []).append(i)
                    continue
            results[i] = self(block)  # alone, or on the host (with a warning, or refused)
        batches = []
        for key, members in by_layout.items():
            per_batch = max(1, min(_BATCH, _BATCH_PIXELS // blocks[members[0]].size))
            for start in range(0, len(members), per_batch):
                chunk = members[start:start + per_batch]
                with blocks[chunk[0]].device:
                    forest = _Forest.batch([blocks[i] for i in chunk], self.structure, False)
                    for i, summary in zip(chunk, forest.summaries()):
                        results[i] = (None, summary)
                batches.append((forest, chunk))
        return results, batches

    def __dask_tokenize__(self):
        return ("chunkernels-label-local", self.structure.tobytes(), self.strict)


def _on_one_device(summaries) -> bool:
    """Whether every summary is a CuPy array, all on one device."""
    devices = {s.device.id if cuda.is_cupy_array(s) else None for s in summaries}
    return len(devices) == 1 and None not in devices


def _summary_of(local):
    """A block's summary as it travels to every worker (the cluster shape): a GPU summary is
    copied to the host here (:class:`~chunkernels._halo.Strips`), so that sending it never waits
    behind the kernels its GPU has queued since (a device-to-host copy on the default stream
    would, when another worker asks for it); each worker uploads it once."""
    summary = local[1]
    return _halo.Strips.of([summary]) if cuda.is_cupy_array(summary) else summary


def _merge_task(plan, results):
    """Step 2 from the local results (labels, summary) or the summaries alone."""
    summaries = [r[1] if isinstance(r, tuple) else r for r in results]
    if len(plan.shape) <= MAX_NDIM and _on_one_device(summaries):
        with summaries[0].device:
            return merge_device(plan, summaries)
    return merge(plan, summaries)


def _relabel(local, merged, b, dtype):
    """Step 3: block ``b``'s local labels through its lookup table, on the labels' device."""
    labels, summary = local
    if isinstance(merged, _DeviceNumbering):
        with labels.device:
            return merged.relabel(b, cuda.cupy().ascontiguousarray(labels), dtype)
    numbering, away, count = merged[0][b]
    lines = len(numbering) - 2 * away
    ends = summary[len(summary) - lines:]
    if cuda.is_cupy_array(labels):
        cp = cuda.cupy()
        with labels.device:
            if cuda.is_cupy_array(summary):
                table = _table_device(ends, numbering, away, count, dtype)
            else:  # a block labelled on the host (empty, or refused by the kernels)
                table = cp.asarray(_table(ends, numbering, away, count, dtype))
            return cp.take(table, labels)
    return _table(ends, numbering, away, count, dtype)[labels]


def _count(merged):
    total = merged.total if isinstance(merged, _DeviceNumbering) else merged[1]
    return np.asarray(int(total), dtype=np.intp)


def _naming_the_fix(fn):
    """Task ``fn`` whose device running out of memory raises :class:`GPUOutOfMemoryError`,
    which names the block, the device's memory and the fixes (smaller chunks, more GPUs, an
    earlier spill), in place of the allocator's bare error: the group tasks hold a worker's
    labels of many blocks, next to the arrays persisted on its GPU."""
    @functools.wraps(fn)
    def task(*args):
        try:
            return fn(*args)
        except MemoryError as exc:
            if isinstance(exc, GPUOutOfMemoryError) or type(exc).__module__.partition(".")[0] \
                    not in ("cupy", "cupy_backends", "rmm"):
                raise
            failure = f"{type(exc).__name__}: {exc}"
        # raised outside the except block: no frame of the failed work keeps its buffers
        from chunkernels._dispatch import out_of_memory_error

        blocks = [a for a in args if cuda.is_cupy_array(a)]
        if not blocks:  # the merge, a relabelling: the labels of many blocks at once
            plan = next((a for a in args if isinstance(a, _MergePlan)), None)
            dtype = next((a for a in args if isinstance(a, np.dtype)),
                         None if plan is None else plan.dtype)
            raise GPUOutOfMemoryError(_out_of_memory_message(failure, _current_device(), dtype))
        block = max(blocks, key=lambda b: b.nbytes)
        raise out_of_memory_error("label", block.shape, block.dtype, block.device,
                                  (0,) * block.ndim, failure)

    return task


def _current_device():
    """:func:`chunkernels._dispatch.device_memory` of the current CuPy device, None without
    CuPy."""
    from chunkernels._dispatch import device_memory

    if cuda.gpu_count() == 0:
        return None
    return device_memory(cuda.cupy().cuda.Device())


def _out_of_memory_message(failure: str, device, dtype) -> str:
    """What :class:`GPUOutOfMemoryError` says when a label task that holds many blocks' labels
    (the merge, a relabelling) runs out of device memory: ``device`` as
    :func:`chunkernels._dispatch.device_memory` describes it (None: unknown), ``dtype`` the
    labels' (None: unknown). Smaller chunks change little there: what fills the GPU is the
    worker's share of the labels beside the arrays persisted on it."""
    from dask.utils import format_bytes

    held = "" if device is None else (
        f" Device {device['id']} ({device['name']}) has {format_bytes(device['free'])} free "
        f"of {format_bytes(device['total'])}.")
    wide = ""
    if dtype is not None and np.dtype(dtype).itemsize == 8:
        wide = (f"The labels are {np.dtype(dtype)} (SciPy's dtype for arrays of 2**31 elements "
                f"or more): label(x, output=np.int32) halves their bytes where fewer than 2**31 "
                f"labels are expected. ")
    return (f"label: the GPU ran out of memory ({failure}).{held} {wide}Leave the label more "
            "room: spill results to host memory earlier (dask-cuda's device_memory_limit, e.g. "
            "chunkernels.cluster.client(gpus=4, device_memory_limit=0.6), or dask cuda worker "
            "--device-memory-limit 0.6), label on more GPUs, or let go of the persisted arrays "
            "the label does not read (del x)")


@_naming_the_fix
def _label_blocks(plan: _MergePlan, local, dtype, blocks):
    """Steps 1 to 3 in one task: ``(every block's labels, the merge, the number of labels)``,
    the number an ``int`` or a :class:`_HostNumber`. Blocks labelled in a batch get their global
    labels in one pass over the batch when the merge was made on their device; else (blocks on
    several devices, merged on the host) their local labels are written and relabelled block by
    block, as the others are."""
    results, batches = local.many(blocks)
    merged = _merge_task(plan, results)
    number = _HostNumber(merged.total) if isinstance(merged, _DeviceNumbering) else merged[1]
    return (_halo.GroupResults(_relabelled(results, batches, merged, range(len(blocks)), dtype)),
            merged, number)


def _relabelled(results, batches, merged, numbers, dtype) -> list:
    """Step 3 on blocks labelled locally (``results`` and ``batches`` as
    :meth:`_LocalLabels.many` gives them; ``numbers[j]``: block ``j``'s number in the grid):
    their global labels. A batch gets them in one pass over it when the merge was made on a
    device, else its local labels are written out and relabelled block by block, as the
    others are. ``batches`` is emptied as it goes, each forest let go once done: forests and
    labels together may not fit (a worker's share of 65536² on one H100); ``results`` too,
    block by block: a group's local labels and its new ones together held up to 7 chunks of
    int64 labels beside a worker's share of the labels (160000² on four H100s)."""
    out = [None] * len(results)
    while batches:
        forest, members = batches.pop(0)
        if isinstance(merged, _DeviceNumbering):
            with forest.parent.device:
                relabelled = merged.relabel_batch(forest, [numbers[j] for j in members], dtype)
            for j, labels in zip(members, relabelled):
                out[j] = labels
            del relabelled
        else:
            _write_out(forest, members, results)
        del forest
    for j, result in enumerate(results):
        if out[j] is None:
            out[j] = _relabel(result, merged, numbers[j], dtype)
        results[j] = None  # the block's local labels go once relabelled, not with the group
    return out


def _write_out(forest, members, results) -> None:
    """The local labels of a batch (written in its forest's parent array) and its summaries,
    into ``results`` at the batch's ``members``."""
    with forest.parent.device:
        for j, result in zip(members, forest.write_summary()):
            results[j] = result


class _HostNumber:
    """The number of labels (a 0-d device array) on its way to the host: copied to pinned
    memory without waiting, behind the merge and ahead of the relabelling, so that reading it
    (``int``) waits for the merge alone, and Dask's work after the count task overlaps the
    relabelling on the device.

    The pinned buffer is kept (:data:`_COPIES_IN_FLIGHT`) until its copy has landed, whether or
    not the number is read: a graph that computes the labels alone lets it go at once, and
    CuPy's pinned pool would hand the buffer to the next host-to-device copy (``cupy.asarray``
    of a NumPy array stages its data there) while this copy is still queued, which then
    overwrites the staged data. Labels and index tables came out wrong, or kernels faulted
    with misaligned and illegal addresses (found under eight test processes on one GPU)."""

    __slots__ = ("value", "done")

    def __init__(self, total):
        import cupyx

        cp = cuda.cupy()
        self.value = cupyx.empty_pinned((), dtype=total.dtype)
        with total.device:
            stream = cp.cuda.get_current_stream()
            cp.cuda.runtime.memcpyAsync(self.value.ctypes.data, total.data.ptr, total.nbytes,
                                        cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
            self.done = cp.cuda.Event(disable_timing=True)
            self.done.record(stream)
        _hold_until_copied(self.done, self.value)

    def __int__(self) -> int:
        self.done.synchronize()
        return int(self.value)

    def __reduce__(self):
        # sent to another worker (a count task moved): the number itself
        return int, (int(self),)


#: ``(event, pinned buffer)`` of the device-to-host copies still queued (:class:`_HostNumber`):
#: a buffer goes back to CuPy's pinned pool only once its event has passed.
_COPIES_IN_FLIGHT: list = []
_COPIES_LOCK = threading.Lock()


def _hold_until_copied(event, buffer) -> None:
    """Keep ``buffer`` until ``event`` has passed; let go of those whose events have."""
    with _COPIES_LOCK:
        _COPIES_IN_FLIGHT[:] = [(e, b) for e, b in _COPIES_IN_FLIGHT if not e.done]
        _COPIES_IN_FLIGHT.append((event, buffer))


def _pick(labelled, b, *dependencies):
    """Block ``b``'s labels from the result of :func:`_label_blocks` (``dependencies``: see
    :func:`chunkernels._graph._group_tasks`)."""
    return labelled[0][b]


async def _pick_on_worker(labelled, b, *dependencies):
    """:func:`_pick` as a coroutine, for the cluster's shapes (see
    :func:`chunkernels._halo.picked_on_worker`)."""
    return _pick(labelled, b)


def _count_labelled(labelled, blocks):
    """The number of labels from the result of :func:`_label_blocks`. ``blocks`` (the chunks'
    labels, unused) make the scheduler run it after every pick: reading the number waits for
    the device (up to the merge), and the picks then need not wait for it."""
    return np.asarray(int(labelled[2]), dtype=np.intp)


def plan(x, structure, dtype=None, *, strict=False):
    """The labels of Dask array ``x`` and their number, as two lazy Dask arrays sharing one graph.

    The labels have ``x``'s chunks and array type (NumPy or CuPy chunks); the number is a 0-d
    NumPy-backed array. ``structure`` is checked (:func:`check_structure`); ``dtype`` defaults
    to :func:`default_dtype` of the whole array. The graph's shape is chosen where it runs
    (:func:`chunkernels._graph.chosen_array`, :func:`_tasks`).
    """
    from chunkernels import _graph

    dtype = default_dtype(x.size) if dtype is None else np.dtype(dtype)
    xp = cuda.array_module(x)
    if x.ndim == 0:  # one pixel: label it as a 1-D array of one
        labels, count = plan(x[None], check_structure(None, 1), dtype, strict=strict)
        return labels[0], count
    name = "label-" + _graph.tokenize(x, structure, dtype, strict)
    source = _graph.BlockSource(x)
    dependencies = [] if source.held is not None else [x]
    local = local_shape(xp)
    # on GPU workers whose blocks' places are known now: a few tasks per worker
    where = (_graph.placement(x, computed=True)
             if source.held is None and _halo.group_placed([x._meta]) else None)
    groups = None if where is None else _graph.by_worker(where, x.numblocks)
    if groups is not None:  # a per-block step (threshold) runs inside the group tasks
        source = _graph.BlockSource(x, absorb=True)
    args = (name, source, x.numblocks, _MergePlan(x.shape, x.chunks, structure, dtype),
            _LocalLabels(structure, strict), dtype)
    if groups is not None:  # runs of at most PLACED_GROUP_BYTES of labels (see _tasks)
        groups = [run for members in groups for run in _graph.byte_runs(
            members, x.chunks, dtype.itemsize, _halo.PLACED_GROUP_BYTES)]
    if groups is None:
        on_cluster = ("per block, summaries",)
    elif len(groups) == 1:  # one worker, one group: the three steps in one task there
        on_cluster = ("one task, placed",)
    else:
        on_cluster = ("worker groups", groups)
    labels = _graph.chosen_array(
        name, local=functools.partial(_tasks, *args, local),
        cluster=functools.partial(_tasks, *args, *on_cluster), chunks=x.chunks,
        dtype=dtype, meta=_graph.meta(x, dtype), dependencies=dependencies,
        placed=where)  # a chunk's pick runs where its input block is
    count_name = f"{name}-count"
    count = _graph.chosen_array(
        count_name, local=functools.partial(_count_tasks, name, x.numblocks, local),
        cluster=functools.partial(_count_tasks, name, x.numblocks, on_cluster[0]), chunks=(),
        dtype=np.intp, meta=np.empty((), dtype=np.intp), dependencies=[labels])
    return labels, count


def local_shape(xp) -> str:
    """The shape of the label's graph under a local scheduler (:func:`_tasks`): ``"one task"``
    for CuPy blocks, ``"per block"`` for NumPy blocks (labelled by SciPy, which releases the
    GIL, in parallel)."""
    return "one task" if xp is not np else "per block"


def _tasks(name, source, numblocks, merge_plan, local, dtype, shape, groups=None) -> dict:
    """The label's tasks, in one of five shapes:

    * ``"one task"``: steps 1 to 3 in one task (:func:`_label_blocks`), each chunk's task
      picking its labels: CuPy blocks under a local scheduler. Their labelling only queues
      kernels, and blocks of one layout share each launch (a batch, :meth:`_LocalLabels.many`),
      so a task per block would add Dask's handling of a task, which costs the host more than
      the launches, once per block and buy no parallelism; the summaries and the merge stay on
      the device either way;
    * ``"per block"``: a local labelling per block, one merge, a relabel per block: NumPy blocks
      under a local scheduler, labelled by SciPy in parallel;
    * ``"per block, summaries"``: on a cluster, a task per block that keeps only its summary,
      and each block's relabel task merges every summary on its own worker, once per worker
      (:func:`_merged_here`): only the summaries travel (they grow with the chunks' faces), not
      the chunks' labels nor the merge's numbering (which grows with the lines and the labels);
    * ``"one task, placed"``: the same on a cluster's GPU worker that holds every block, when
      its labels make one group (below); each chunk's task also takes its block, so that Dask
      does not queue the picks as root tasks;
    * ``"worker groups"``: on GPU workers whose blocks' places are known when the graph is built
      (``groups``: the block indices of each worker, in runs of at most
      :data:`~chunkernels._halo.PLACED_GROUP_BYTES` of labels: a run's labels are stored at
      once, while its local labels are still held, and on one H100 65536² in one run per worker
      made dask-cuda spill the input to the host), one group task per run for each step: it labels the worker's blocks (in batches, :func:`_label_part`), its face
      summaries travel as one host buffer (:func:`_part_summaries`), and it relabels them with
      the merge made on its worker (:func:`_relabel_part`); a task per block picks its labels.
      A worker's tasks are a handful, not three per block, and each relabelling depends on one
      summary per worker, not one per block (a graph of 64 blocks had 4,000 such edges).
    """
    from chunkernels import _graph

    tasks = _graph.Tasks()
    merge_key = (f"{name}-merge",)
    indices = list(np.ndindex(*numblocks))
    if shape == "worker groups":
        number = {index: b for b, index in enumerate(indices)}
        order = tuple(tuple(number[i] for i in members) for members in groups)
        parts = [tasks.add((f"{name}-part", g), _label_part, local,
                           *(source.arg(i) for i in members)) for g, members in enumerate(groups)]
        summaries = [tasks.add((f"{name}-summaries", g), _part_summaries, part)
                     for g, part in enumerate(parts)]
        tasks.add(merge_key, _merged_of_parts, name, merge_plan, order, *summaries)
        for g, (members, part) in enumerate(zip(groups, parts)):
            relabelled = tasks.add((f"{name}-relabel", g), _relabel_part, name, merge_plan,
                                   order, g, dtype, part, *summaries)
            for position, index in enumerate(members):  # the block too: see _graph._group_tasks
                tasks.add_on_loop((name, *index), _halo.picked_on_worker, relabelled,
                                  position, source.where(index))
        return tasks.graph
    if shape in ("one task", "one task, placed"):
        merged = tasks.add(merge_key, _label_blocks, merge_plan, local, dtype,
                           tasks.items(source.arg(index) for index in indices))
        for b, index in enumerate(indices):
            # on a cluster the block too: see chunkernels._graph._group_tasks
            if shape == "one task, placed":
                tasks.add_on_loop((name, *index), _pick_on_worker, merged, b,
                                  source.where(index))
            else:
                tasks.add((name, *index), _pick, merged, b)
        return tasks.graph
    locals_ = [tasks.add((f"{name}-local", *index), local, source.arg(index))
               for index in indices]
    merged_from = locals_
    if shape == "per block, summaries":
        merged_from = [tasks.add((f"{name}-summary", *index), _summary_of, ref)
                       for index, ref in zip(indices, locals_)]
    if shape == "per block, summaries":
        # Each relabel task merges the summaries on its own worker, once per worker
        # (:func:`_merged_here`): the summaries grow with the faces, the merge's numbering with
        # the lines and the labels (hundreds of MB for a 65536² image), so the faces travel to
        # every worker rather than the numbering. The merge task gives the count.
        summaries = tasks.items(merged_from)
        tasks.add(merge_key, _merged_here, name, merge_plan, summaries)
        for b, (index, ref) in enumerate(zip(indices, locals_)):
            tasks.add((name, *index), _relabel_merging_here, name, merge_plan, summaries, ref, b,
                      dtype)
        return tasks.graph
    merged = tasks.add(merge_key, _merge_task, merge_plan, tasks.items(merged_from))
    for b, (index, ref) in enumerate(zip(indices, locals_)):
        tasks.add((name, *index), _relabel, ref, merged, b, dtype)
    return tasks.graph


#: The merges this process made for label graphs on a cluster, by graph name and device
#: (:func:`_merged_here`), the most recent last; :data:`_MERGES_KEPT` of them are kept.
_MERGES: collections.OrderedDict = collections.OrderedDict()
_MERGES_LOCK = threading.Lock()
_MERGES_KEPT = 2


def _merged_here(name, plan, summaries):
    """Step 2 on this worker (:func:`_merge_task`), made once per graph and device in a process
    and kept for the graph's other relabel tasks here. The merge is deterministic, so every
    worker's is the same numbering."""
    device = None
    for s in summaries:
        if cuda.is_cupy_array(s):
            device = s.device.id
        elif isinstance(s, _halo.Strips) and s.gpu:  # uploaded to this worker's device
            device = cuda.cupy().cuda.runtime.getDevice()
        else:
            continue
        break
    key = (name, device)
    with _MERGES_LOCK:
        merged = _MERGES.get(key)
        if merged is None:
            arrays = [s[0] if isinstance(s, _halo.Strips) else s for s in summaries]
            merged = _MERGES[key] = _merge_task(plan, arrays)
            while len(_MERGES) > _MERGES_KEPT:
                _MERGES.popitem(last=False)
        else:
            _MERGES.move_to_end(key)
    return merged


def _relabel_merging_here(name, plan, summaries, local, b, dtype):
    """Step 3 with the merge made on this worker (:func:`_merged_here`)."""
    return _relabel(local, _merged_here(name, plan, summaries), b, dtype)


class _Part:
    """A worker's blocks labelled locally (step 1 of the ``"worker groups"`` shape,
    :func:`_tasks`): ``results`` and ``batches`` as :meth:`_LocalLabels.many` gives them, and
    ``summaries``, the blocks' face summaries in one host buffer (:class:`~chunkernels._halo.Strips`:
    copied by this task, so that sending them never waits behind the kernels the GPU queued
    since) or a tuple of NumPy arrays."""

    __slots__ = ("results", "batches", "summaries")

    def __init__(self, results, batches, summaries=None):
        self.results = results
        self.batches = batches
        if summaries is None:
            summaries = [summary for _, summary in results]
            summaries = (_halo.Strips.of(summaries) if any(map(cuda.is_cupy_array, summaries))
                         else tuple(summaries))
        self.summaries = summaries

    def written(self) -> list:
        """Per block ``(local labels, summary)``: a batch's labels are written out first (in
        its parent array, which the batch's global relabelling would have overwritten), so
        that the part no longer holds forests."""
        for forest, members in self.batches:
            _write_out(forest, members, self.results)
        self.batches = []
        return self.results

    def __sizeof__(self) -> int:
        """The labels' bytes, which Dask's ``sizeof`` then reports: the scheduler keeps the
        tasks that read a part where it is."""
        forests = sum(f.parent.nbytes for f, _ in self.batches)
        return object.__sizeof__(self) + forests + sum(
            getattr(r, "nbytes", 0) for result in self.results if result for r in result)

    def __reduce__(self):
        # on its way to another worker (a task moved, spilling): without the device forests
        return _Part, (self.written(), [], self.summaries)


@_naming_the_fix
def _label_part(local, *blocks) -> _Part:
    """Step 1 on one worker's blocks (the ``"worker groups"`` shape). A batch of one block is
    written out at once (its labels in its parent array, its scan of roots let go): a forest
    holds two integers a pixel until the relabelling, and a worker's whole share of the array
    is labelled before any block is relabelled (65536² on one H100 did not fit); batches of
    several blocks stay forests, each relabelled in one pass."""
    results, batches = local.many(blocks)
    kept = []
    for forest, members in batches:
        if len(members) == 1:
            _write_out(forest, members, results)
        else:
            kept.append((forest, members))
    return _Part(results, kept)


def _part_summaries(part: _Part):
    """The summaries of a part, the only thing of it that travels."""
    return part.summaries


def _in_block_order(order, summaries) -> list:
    """Every block's summary in block order, from each group's (``order[g]``: the block numbers
    of group ``g``'s summaries), GPU summaries uploaded to this worker's device once."""
    out = [None] * sum(map(len, order))
    for numbers, part in zip(order, summaries):
        for position, b in enumerate(numbers):
            out[b] = part[position]
    return out


@_naming_the_fix
def _merged_of_parts(name, plan, order, *summaries):
    """Step 2 from the parts' summaries, on this worker (:func:`_merged_here`)."""
    return _merged_here(name, plan, _in_block_order(order, summaries))


@_naming_the_fix
def _relabel_part(name, plan, order, g, dtype, part: _Part, *summaries) -> _halo.GroupResults:
    """Step 3 on group ``g``'s blocks, with the merge made on this worker (:func:`_relabelled`;
    the part's forests are spent: relabelled in place); a pick task per block takes its labels
    (:class:`~chunkernels._halo.GroupResults`: dask-cuda does not spill them)."""
    merged = _merged_here(name, plan, _in_block_order(order, summaries))
    batches, part.batches = part.batches, []
    return _halo.GroupResults(_relabelled(part.results, batches, merged, order[g], dtype))


def _count_tasks(name, numblocks, shape) -> dict:
    """The task giving the number of labels, for the labels' tasks of ``shape``
    (:func:`_tasks`)."""
    from chunkernels import _graph

    tasks = _graph.Tasks()
    merged = tasks.ref((f"{name}-merge",))
    if shape in ("one task", "one task, placed"):
        picks = tasks.items(tasks.ref((name, *index)) for index in np.ndindex(*numblocks))
        tasks.add((f"{name}-count",), _count_labelled, merged, picks)
    else:
        tasks.add((f"{name}-count",), _count, merged)
    return tasks.graph


def dask_graph(x, *, strict=False, structure, dtype=None):
    """The labels of a Dask array (:func:`plan`'s first result)."""
    return plan(x, structure, dtype, strict=strict)[0]


# -- chunkernels check --------------------------------------------------------------------------


def _cases(rng):
    """Random binary images for ``chunkernels check``: densities around percolation, every
    connectivity of 2-D and 3-D, a 1-D line, integer and float data, a negative-stride view."""
    for density, connectivity in ((0.3, 1), (0.59, 1), (0.45, 2)):
        x = rng.random((61, 47)) < density
        yield x, (), {"structure": ndi.generate_binary_structure(2, connectivity)}
    for connectivity in (1, 2, 3):
        x = (rng.random((13, 17, 11)) < 0.3).astype(np.uint8)
        yield x, (), {"structure": ndi.generate_binary_structure(3, connectivity)}
    yield (rng.random(200) < 0.5).astype(np.float32), (), {"structure": None}
    base = rng.integers(0, 3, size=(40, 50)).astype(np.int16)
    yield base[::-2, 3:-4], (), {"structure": np.ones((3, 3), bool), "dtype": "int64"}


SPEC = KernelSpec(
    name="label",
    summary="connected components of the nonzero pixels under a symmetric 3**ndim structure, "
            "numbered in raster order of their first pixels; reference scipy.ndimage.label",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="label.cu",
    entries=(
        "label_tiles<bool, int>",
        "label_tiles<unsigned char, int>",
        "label_tiles<float, long long>",
        "label_tiles<double, int>",
        "label_merge<int>",
        "label_merge<long long>",
        "label_merge_borders<int>",
        "label_merge_borders<long long>",
        "label_flatten<int>",
        "label_flatten<long long>",
        "label_scan<int>",
        "label_scan<long long>",
        "label_scan_offsets<int>",
        "label_scan_offsets<long long>",
        "label_write<int, int>",
        "label_write<int, bool>",
        "label_write<long long, double>",
        "label_write_summary<int>",
        "label_write_summary<long long>",
        "label_table<int, int>",
        "label_table<int, bool>",
        "label_table<int, unsigned char>",
        "label_table<long long, double>",
        "label_table<long long, long long>",
        "label_slots<int>",
        "label_slots<long long>",
        "label_face_nodes<int>",
        "label_face_nodes<long long>",
        "label_face_unite",
        "label_scan_popc<long long>",
        "label_face_roots",
        "label_renumber<int>",
        "label_renumber<bool>",
        "label_renumber<long long>",
        "label_renumber<double>",
        "label_lookup<int, int>",
        "label_lookup<int, bool>",
        "label_lookup<long long, long long>",
        "label_lookup<int, double>",
        "label_summary<int>",
        "label_summary<long long>",
        "label_renumber_batch<int, int>",
        "label_renumber_batch<int, bool>",
        "label_renumber_batch<int, long long>",
        "label_renumber_batch<int, double>",
        "label_write_through<int, int>",
        "label_write_through<int, bool>",
        "label_write_through<int, long long>",
        "label_write_through<int, double>",
    ),
    dtypes=GPU_DTYPES,
    ndim=(0, MAX_NDIM),
    validate=_validate,
    result_dtype=_result_dtype,
    supports=_supports,
    cases=_cases,
    dask_graph=dask_graph,
    halo_rule="none (not blockwise: per-chunk labels, one merge of the faces, a relabel)",
)
