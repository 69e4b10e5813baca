"""``pipeline``: several kernels per chunk in one task, with one halo exchange for all of them.

Running ``gaussian → threshold → label`` as three ``apply`` calls exchanges a halo per stencil
step and keeps every intermediate as a Dask array. A pipeline extends each block once, by the sum
of its steps' halos, runs the steps one after another on that extended block (on the GPU for CuPy
blocks, where the data stays between steps) and trims the result once.

Why the sum suffices: a step with halo ``d`` computes correct values everywhere except within
``d`` of the buffer's edge on the sides where the buffer stops inside the array. Each later step
needs its input only within its own halo of the core, so with ``d1 + d2 + ...`` of margin every
step's input is correct where the next one reads it. At the array's outer edge the buffer's edge
*is* the array's edge, so each step applies its own edge mode there, exactly as on the whole
array, provided every step with a halo along that axis agrees on the boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from chunkernels import _graph, _halo
from chunkernels._apply import BlockFunction, overlap
from chunkernels._registry import get
from chunkernels.interop import array_entry


class Pipeline:
    """Registered kernels run in sequence on each chunk, in one task per chunk.

    Build one with :func:`pipeline`; call it on an array (``p(x)`` or ``p.apply(x)``).
    """

    def __init__(self, steps: Sequence[BlockFunction]):
        self.steps = tuple(steps)

    def __repr__(self):
        return f"pipeline([{', '.join(map(repr, self.steps))}])"

    @property
    def name(self) -> str:
        """The steps' kernel names joined by ``+``, used in Dask keys and messages."""
        return "+".join(step.spec.name for step in self.steps)

    def depth(self, ndim: int) -> tuple[int, ...]:
        """Halo per axis of the whole pipeline: the sum of its steps' halos."""
        return tuple(int(d) for d in np.sum(
            [step.spec.depth(ndim, step.params(ndim)) for step in self.steps], axis=0))

    def boundary(self, ndim: int, axes=None) -> tuple[str, ...]:
        """Boundary per axis; steps with a halo along an axis must agree on it. ``axes``: the
        axes a halo is exchanged along (default every axis); along the others (one chunk), each
        step's own edge mode applies and nothing needs to agree."""
        chosen: dict[int, tuple[str, str]] = {}
        for step in self.steps:
            params = step.params(ndim)
            depth = step.spec.depth(ndim, params)
            per_axis = _halo.boundaries(step.spec.boundary(**params), ndim, step.spec.name)
            for axis, (d, b) in enumerate(zip(depth, per_axis)):
                if d == 0 or (axes is not None and axis not in axes):
                    continue  # no halo of this step (or of any block) along this axis
                first = chosen.setdefault(axis, (step.spec.name, b))
                if first[1] != b:
                    raise ValueError(
                        f"pipeline {self.name}: along axis {axis}, {first[0]} needs a {first[1]!r} "
                        f"boundary and {step.spec.name} a {b!r} one (their edge modes differ: "
                        f"one wraps around the array, the other does not); one halo exchange "
                        f"cannot serve both. Give them the same kind of edge mode, or split the "
                        f"pipeline between them"
                    )
        return tuple(chosen.get(axis, (None, "none"))[1] for axis in range(ndim))

    def dtype(self, x_dtype, ndim: int) -> np.dtype:
        """Result dtype for an ``ndim``-d input of ``x_dtype``: the steps' result types, chained."""
        dtype = np.dtype(x_dtype)
        for step in self.steps:
            dtype = step.spec.out_dtype(dtype, (), step.params(ndim))
        return dtype

    @array_entry("x", coerce=False)
    def apply(self, kind, x, *, allow_rechunk: bool = False):
        """Run the pipeline on ``x``; the same array type out.

        Parameters
        ----------
        x
            A Dask array (NumPy or CuPy chunks), a ``numpy.ndarray``, a ``cupy.ndarray``, a
            ``torch.Tensor`` or an ``xarray.DataArray`` of any of these
            (:mod:`chunkernels.interop`).
        allow_rechunk
            As in :func:`chunkernels.apply`: make an axis one chunk where the pipeline's total
            halo is not smaller than the array along it, instead of raising
            :class:`~chunkernels.HaloError`.

        Returns
        -------
        dask.array.Array, numpy.ndarray, cupy.ndarray, torch.Tensor or xarray.DataArray
            Equal to applying the steps one after another with :func:`chunkernels.apply`.
        """
        if kind is None:
            raise TypeError(f"a pipeline takes a dask.array.Array, numpy.ndarray or cupy.ndarray; "
                            f"got {type(x).__module__}.{type(x).__name__}")
        x = _graph.as_input(x, f"pipeline {self.name}", "x")
        run = _Run(self.steps, x.ndim)  # validates every step's parameters for x.ndim
        if not kind.dask:
            return run(x)
        dtype = self.dtype(x.dtype, x.ndim)
        meta = kind.meta(dtype, x.ndim)
        depth = tuple(0 if len(c) == 1 else d for c, d in zip(x.chunks, self.depth(x.ndim)))
        boundary = self.boundary(x.ndim, [axis for axis, d in enumerate(depth) if d])
        if not any(depth):
            return _graph.map_blocks(run, f"{self.name}-{_graph.tokenize(run, x)}", x, [], dtype,
                                     meta)
        return overlap(run, self.name, x, [], depth, boundary, dtype, meta, allow_rechunk)

    __call__ = apply


class _Run:
    """The block function of a pipeline: every step on one block, in order."""

    def __init__(self, steps, ndim):
        self.steps = steps
        self.name = "pipeline " + "+".join(step.spec.name for step in steps)
        for step in steps:
            step.params(ndim)

    def __call__(self, block):
        for step in self.steps:
            block = step(block)
        return block

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("chunkernels-pipeline", tokenize(*self.steps))


def pipeline(steps: Iterable, *, strict: bool = False) -> Pipeline:
    """Chain registered kernels so that each chunk runs all of them in one task.

    Parameters
    ----------
    steps
        Each step is a kernel name, a ``(kernel_name, params)`` pair (``params`` a dict of the
        kernel's parameters) or a :class:`~chunkernels.BlockFunction` from
        :func:`chunkernels.blockwise`. Every step takes the previous step's result as ``x``;
        kernels with extra array operands and reduction kernels cannot be steps.
    strict
        For steps given by name: raise instead of falling back to the CPU reference on blocks
        the GPU path refuses (a ``BlockFunction`` keeps its own setting).

    Returns
    -------
    Pipeline
        Call it on a Dask, NumPy or CuPy array: ``pipeline(steps)(x)``. With a Dask array, each
        block is extended once by the sum of the steps' halos, all steps run on it in one task,
        and the result is trimmed once; the result equals applying the steps one by one.

    Raises
    ------
    UnknownKernelError
        A step names no registered kernel.
    TypeError
        A step is not one of the forms above, takes array operands, is a reduction, or is not
        blockwise (a kernel that plans its own Dask graph: ``label``, ``zoom``).
    ValueError
        No steps.

    Notes
    -----
    A step must be chunk-local: its result on a block, given the block's halo, must be its result
    on the whole array there. A step that needs the whole array (a global merge of labels across
    chunks, a reduction) ends a pipeline: run it on the pipeline's output. Steps whose halos meet
    along an axis of several chunks must agree on the boundary there (both wrap around the
    array, or neither); the pipeline raises otherwise, when it is applied to such an array.
    """
    one_step = isinstance(steps, (str, BlockFunction)) or (
        isinstance(steps, tuple) and len(steps) == 2 and isinstance(steps[0], str)
        and isinstance(steps[1], dict))
    if one_step:  # a name would be read letter by letter
        raise TypeError(f"pipeline() takes a list of steps; got one step, {steps!r}: wrap it in "
                        f"a list, e.g. chunkernels.pipeline([{steps!r}])")
    if not isinstance(steps, Iterable):
        raise TypeError(f"pipeline() takes a list of steps (kernel names, (kernel_name, params) "
                        f"pairs or chunkernels.blockwise(...) functions); got {steps!r}")
    built = [_step(s, strict) for s in steps]
    if not built:
        raise ValueError("pipeline() needs at least one step: a kernel name, a "
                         "(kernel_name, params) pair or a chunkernels.blockwise(...) function")
    return Pipeline(built)


def _step(step: Any, strict: bool) -> BlockFunction:
    if isinstance(step, BlockFunction):
        fn = step
    elif isinstance(step, str):
        fn = BlockFunction(get(step), {}, strict=strict)
    elif (isinstance(step, tuple) and len(step) == 2 and isinstance(step[0], str)
          and isinstance(step[1], dict)):
        fn = BlockFunction(get(step[0]), step[1], strict=strict)
    else:
        raise TypeError(f"pipeline step {step!r} is not a kernel name, a (kernel_name, params) "
                        f"pair with params a dict, nor a chunkernels.blockwise(...) function")
    spec = fn.spec
    if spec.kind == "reduction":
        raise TypeError(f"pipeline step {spec.name} is a reduction: it combines the whole array, "
                        f"so it cannot run per chunk in a pipeline. Apply it to the pipeline's "
                        f"output: chunkernels.apply(p(x), {spec.name!r})")
    if spec.operands:
        raise TypeError(f"pipeline step {spec.name} takes array operands ({', '.join(spec.operands)})"
                        f"; a step gets only the previous step's result. Apply it on its own: "
                        f"chunkernels.apply(x, {spec.name!r}, ...)")
    if spec.dask_graph is not None:
        # Its result on a chunk is not its result on the whole array there, whatever the halo
        # (labels merged across chunks, an output of another shape): per chunk it would be
        # silently wrong (label) or fail at compute (zoom), so it is refused before any graph.
        raise TypeError(
            f"pipeline step {spec.name} is not blockwise: its result on a chunk depends on more "
            f"than the chunk and a halo around it, or has another shape (it plans its own Dask "
            f"graph), so a pipeline, which runs every step on one chunk "
            f"at a time, would get it wrong. End the pipeline before it and apply it to the "
            f"pipeline's output: chunkernels.apply(p(x), {spec.name!r}, ...)")
    # after what the step is: a kernel that cannot be a step says so, whatever its parameters
    spec.check_parameters(fn.raw_params)  # a misspelt parameter is refused now, not when applied
    return fn
