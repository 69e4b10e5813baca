"""A worker process killed in the middle of a chunked halo computation changes nothing.

Distributed recomputes the results the dead worker held and reruns the task it was running
(``distributed.scheduler.allowed-failures`` bounds how many deaths one task may witness), so the
result must equal the single-process one, value for value (the values are integers, so sums in
any order are exact). The kernel's CPU reference sleeps a
little per block, so that the computation is still running when the worker dies; the test kills
it only once it holds finished blocks and others remain, and checks both.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import dask
import dask.array as da
import numpy as np
from conftest import MOVING_SUM, demo_in_a_thread, moving_sum_reference, random_array

import chunkernels
from chunkernels import cluster

DELAY = 0.04  # seconds per block: 64 blocks on 2 workers keep them busy for over a second


def slow_moving_sum(x, *, radius=1, mode="reflect"):
    """``moving_sum``'s reference, slowed down."""
    time.sleep(DELAY)
    return moving_sum_reference(x, radius=radius, mode=mode)


SLOW_MOVING_SUM = dataclasses.replace(MOVING_SUM, name="slow_moving_sum", cpu=slow_moving_sum)


def _blocks_held(worker: str, name: str, dask_scheduler=None) -> tuple[int, int]:
    """On the scheduler: ``(results of layer name held by worker, results held anywhere)``."""
    mine = everywhere = 0
    for key, ts in dask_scheduler.tasks.items():
        if isinstance(key, tuple) and key[0] == name and ts.state == "memory":
            everywhere += 1
            mine += any(ws.address == worker for ws in ts.who_has)
    return mine, everywhere


def test_a_worker_killed_mid_compute_leaves_the_result_unchanged():
    from distributed import wait

    chunkernels.register(SLOW_MOVING_SUM)
    x_np = random_array(np.random.default_rng(5), (64, 96), "float64")
    x = da.from_array(x_np, chunks=(8, 12))  # 64 blocks; the halo (5) comes from neighbours
    expected = moving_sum_reference(x_np, radius=5)  # in one process, on the whole array

    with dask.config.set({"distributed.scheduler.allowed-failures": 2}), cluster.client(
            gpus=0, processes=True, n_workers=2, threads=1, dashboard_address=None) as c:
        pids = c.run(os.getpid)
        victim = sorted(pids)[0]
        z = c.persist(chunkernels.apply(x, "slow_moving_sum", radius=5))
        deadline = time.monotonic() + 20
        while (held := c.run_on_scheduler(_blocks_held, victim, z.name))[0] < 4:
            assert time.monotonic() < deadline, f"the victim never held 4 blocks: {held}"
            time.sleep(0.01)
        os.kill(pids[victim], signal.SIGKILL)
        assert held[1] < z.npartitions  # killed mid-compute: blocks were still to come
        wait(z, timeout=60)
        got = c.compute(z, sync=True)
        np.testing.assert_array_equal(got, expected)
        c.wait_for_workers(2, timeout=30)  # the nanny started a fresh worker process
        assert pids[victim] not in c.run(os.getpid).values()


def test_the_only_worker_killed_mid_demo_fails_clearly_instead_of_hanging(tmp_path):
    """The demo's pipeline on a cluster of one worker process, killed while it labels: the
    placed blocks' recomputation is restricted to the dead worker's address, which distributed
    never maps to the restarted worker (dask/distributed#7346). The clusters chunkernels starts
    set a no-workers timeout (:data:`chunkernels.cluster.NO_WORKERS_TIMEOUT`; here shortened),
    so the pipeline fails with distributed's NoValidWorkerError instead of waiting for ever (or
    its NoWorkerError, where the nanny's restart takes longer than the timeout: a loaded host)."""
    from distributed.scheduler import NoValidWorkerError, NoWorkerError

    config = {"distributed.scheduler.allowed-failures": 4,
              "distributed.scheduler.no-workers-timeout": "3s"}
    with dask.config.set(config), cluster.client(gpus=0, processes=True, n_workers=1, threads=1,
                                                 dashboard_address=None) as c:
        thread, outcome = demo_in_a_thread(c, tmp_path, "--size", "512", "--chunks", "64")
        (pid,) = c.run(os.getpid).values()
        deadline = time.monotonic() + 60
        while not c.run_on_scheduler(_label_results_held):
            assert thread.is_alive(), f"the pipeline ended before any block was labelled: {outcome}"
            assert time.monotonic() < deadline, "no label result appeared in 60 s"
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
        thread.join(timeout=90)
        assert not thread.is_alive(), "the pipeline hangs after its only worker died"
        assert isinstance(outcome.get("error"), (NoValidWorkerError, NoWorkerError)), outcome


def test_the_clusters_started_here_time_out_tasks_without_workers():
    """Unless Dask's configuration says otherwise."""
    from chunkernels.cluster import NO_WORKERS_TIMEOUT, _no_workers

    key = "distributed.scheduler.no-workers-timeout"
    assert _no_workers() == {key: NO_WORKERS_TIMEOUT}
    with dask.config.set({key: "5 minutes"}):
        assert _no_workers() == {}


def _label_results_held(dask_scheduler=None) -> int:
    """On the scheduler: finished tasks of a label graph."""
    return sum(ts.state == "memory" and str(ts.key).startswith("('label-")
               for ts in dask_scheduler.tasks.values())
