"""Importing and using chunkernels on NumPy/Dask data never touches CuPy, CUDA or GPU frameworks.

Checked in a fresh interpreter, with an import hook that records every *attempt* to import the
GPU packages: on a machine without CuPy a swallowed ImportError leaves nothing in sys.modules, so
looking there alone would miss an attempt. Dask itself imports CuPy where it is installed
(``dask.array.chunk_types``), so with Dask the test holds chunkernels to adding no attempt of its
own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

GPU_PACKAGES = ("cupy", "cupy_backends", "cupyx", "torch", "dask_cuda", "numba", "rmm", "cudf")

SCRIPT = textwrap.dedent("""
    import json, sys

    GPU_PACKAGES = {gpu_packages!r}
    attempts = []

    class Recorder:
        # first on sys.meta_path: sees every import, records the GPU ones, lets the rest through
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in GPU_PACKAGES:
                attempts.append(name)
            return None

    def gpu_modules():
        return {{m for m in sys.modules if m.split(".")[0] in GPU_PACKAGES}}

    sys.meta_path.insert(0, Recorder())
    stages = {{}}
    before = [0, set()]

    def stage(label):
        # every import attempt during this stage (repeats included), and modules it added
        stages[label] = sorted(set(attempts[before[0]:]) | (gpu_modules() - before[1]))
        before[:] = [len(attempts), gpu_modules()]

    import numpy as np
    stage("numpy")
    import chunkernels
    stage("import chunkernels")

    names = chunkernels.registered()
    chunkernels.describe("broadcast_add")
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_names = chunkernels.kernels()  # the former name of registered(), deprecated
    stage("registry")

    x = np.ones((4, 6), "float32")
    numpy_result = chunkernels.apply(x, "broadcast_add", np.arange(6, dtype="float32"))
    chunkernels.blockwise("broadcast_add")(x, x[0])
    stage("apply numpy")

    from chunkernels.cli import main
    main(["list"])
    stage("cli list")

    # Dask itself tries CuPy (dask.array.chunk_types registers it as a chunk type when installed)
    # and distributed tries RMM: that is theirs. chunkernels must add nothing on top.
    import dask.array as da
    import distributed
    stage("dask")
    z = chunkernels.apply(da.from_array(x, chunks=(2, 3)), "broadcast_add", 1.0)
    dask_result = z.compute()
    f = chunkernels.blockwise("broadcast_add")
    dx, dy = da.from_array(x, chunks=2), da.from_array(x[0], chunks=2)
    da.map_blocks(f, dx, dy, **f.kwargs(dx, dy)).compute()
    stage("apply dask")

    print(json.dumps({{
        "stages": stages,
        "kernels": names,
        "kernels_callable_after_use": callable(chunkernels.kernels),
        "old_name_lists_the_same": old_names == names,
        "old_name_warns": [w.category.__name__ for w in caught],
        "numpy_type": type(numpy_result).__name__,
        "numpy_sum": float(numpy_result.sum()),
        "dask_sum": float(dask_result.sum()),
    }}))
""").format(gpu_packages=GPU_PACKAGES)


def test_cpu_use_imports_no_gpu_package(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    stages = report["stages"]
    ours = ("numpy", "import chunkernels", "registry", "apply numpy", "cli list", "apply dask")
    for stage in ours:
        assert stages.pop(stage) == [], stage
    assert list(stages) == ["dask"]  # whatever Dask imports is Dask's business
    assert "broadcast_add" in report["kernels"]
    assert report["kernels_callable_after_use"]
    assert report["old_name_lists_the_same"]
    assert report["old_name_warns"] == ["DeprecationWarning"]
    assert report["numpy_type"] == "ndarray"
    assert report["numpy_sum"] == 4 * (6 + 15)
    assert report["dask_sum"] == 48.0
