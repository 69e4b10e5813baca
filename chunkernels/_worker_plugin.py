"""What chunkernels sets up on GPU workers (:func:`chunkernels.cluster.tune_gpu_workers`).

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
