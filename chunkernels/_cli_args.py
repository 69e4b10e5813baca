"""Command-line arguments shared by ``chunkernels`` (:mod:`chunkernels.cli`), its benchmarks
(:mod:`chunkernels.bench`) and its demo (:mod:`chunkernels.demo`): the cluster options and the
argument types.

Below all three, so that the benchmarks and the demo never import the command that runs them.
"""

from __future__ import annotations

import argparse
import contextlib


def add_cluster_arguments(parser, *, sweep: bool = False) -> None:
    """Add ``--gpus N`` and ``--scheduler ADDRESS`` to a command that computes.

    Pair with :func:`cluster_from_args`, which opens the client these options describe. With
    ``sweep=True`` (benchmarks), ``--gpus`` takes several counts and ``--workers N [N ...]`` asks
    for local clusters of CPU worker processes; ``chunkernels.bench.clusters`` opens them in turn.
    """
    group = parser.add_mutually_exclusive_group()
    if sweep:
        group.add_argument("--gpus", type=whole_number, nargs="+", metavar="N",
                           help="run on a local Dask cluster of N GPU workers, once per N given "
                                "(--gpus 1 2 4: a scaling sweep; 0: CPU workers in this process)")
        group.add_argument("--workers", type=positive_whole_number, nargs="+", metavar="N",
                           help="run on a local cluster of N single-threaded CPU worker "
                                "processes, once per N given (CPU runs of a GPU benchmark)")
    else:
        group.add_argument("--gpus", type=whole_number, metavar="N",
                           help="run on a local Dask cluster of N GPU workers (0: CPU workers); "
                                "default: no cluster, Dask's threaded scheduler in this process")
    group.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on the running Dask cluster whose scheduler is at ADDRESS "
                            "(tcp://host:8786; `dask scheduler` + `dask cuda worker`)")
    parser.add_argument("--protocol", choices=("tcp", "ucx"),
                        help="how the workers of a local GPU cluster send each other blocks: "
                             "tcp (default) or ucx (NVLink; the ucx-cu12/ucx-cu13 extra)")


def whole_number(text: str, least: int = 0) -> int:
    """A whole number of at least ``least`` for argparse, refused with the value seen otherwise."""
    try:
        n = int(text)
    except ValueError:
        n = least - 1
    if n < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least {least}")
    return n


def positive_whole_number(text: str) -> int:
    """A whole number of at least 1 for argparse (see :func:`whole_number`)."""
    return whole_number(text, 1)


def cluster_from_args(args):
    """A context manager: the Dask client ``--gpus`` / ``--scheduler`` ask for, else nothing.

    Inside it, Dask computations run on that cluster (the client is Dask's default scheduler);
    on leaving, a cluster it started is closed. Without either option it yields ``None`` and
    Dask's threaded scheduler runs everything in this process.
    """
    if args.gpus is None and args.scheduler is None:
        return contextlib.nullcontext()
    from chunkernels.cluster import client, describe

    if args.scheduler is not None:
        c = client(scheduler=args.scheduler)
    else:  # a command-line run has no use for the dashboard, nor for a port it could clash on
        c = client(args.gpus, dashboard_address=None, protocol=getattr(args, "protocol", None))
    print(f"cluster: {describe(c)}", flush=True)
    return c
