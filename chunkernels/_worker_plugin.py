"""What chunkernels sets up on the workers of the clusters it starts or tunes
(:func:`chunkernels.cluster.client`, :func:`chunkernels.cluster.tune_gpu_workers`).

Imports ``distributed``: imported only where a cluster is set up.
"""

from __future__ import annotations

import sys

from distributed import WorkerPlugin


class SwitchInterval(WorkerPlugin):
    """Sets the worker process's thread switch interval (:func:`sys.setswitchinterval`) when
    the worker starts, and again on every worker that joins or is restarted later."""

    name = "chunkernels-switch-interval"

    def __init__(self, seconds: float):
        self.seconds = seconds

    def setup(self, worker) -> None:
        sys.setswitchinterval(self.seconds)


class CPUWorkers(WorkerPlugin):
    """Marks the workers of a CPU cluster (``chunkernels.cluster.client(gpus=0)``, or one
    started where no GPU is visible): on a host with GPUs they see them too (a worker of threads
    is this process), but they were asked for as CPU workers, and the library makes and
    describes their data as NumPy. Also on workers that join or restart later."""

    name = "chunkernels-cpu-workers"

    def setup(self, worker) -> None:
        pass
