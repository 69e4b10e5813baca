"""The examples in examples/ (included in the documentation) and the README's run and verify their
own results.

Each example runs in a fresh interpreter, as a user would run it: the examples register kernels
(a second registration in this process would be a duplicate) and the cluster example starts
worker processes that re-import it. Tests marked ``gpu`` are skipped by conftest.py without a
CUDA GPU; where there is one they must take the GPU path, and say so.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, hide_gpus: bool = False, timeout: float = 300) -> str:
    return run_python([str(EXAMPLES / name), *args], name, hide_gpus=hide_gpus, timeout=timeout)


def run_python(args: list[str], name: str, *, hide_gpus: bool = False,
               timeout: float = 300) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a GPU machine
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{output}"
    return output


def readme_example(device: str) -> str:
    """The README's Python block for ``device`` ("CPU": the one that does not import CuPy)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    gpu = [b for b in blocks if "import cupy" in b]
    cpu = [b for b in blocks if "import cupy" not in b]
    assert len(cpu) == 1 and len(gpu) == 1, f"README.md: {len(cpu)} CPU and {len(gpu)} GPU blocks"
    return (gpu if device == "GPU" else cpu)[0]


def test_readme_cpu_example():
    out = run_python(["-c", readme_example("CPU")], "README's CPU example", hide_gpus=True)
    assert re.search(r"^CPU: \d+ sources, total flux [\d.]+$", out, re.M), out


@pytest.mark.gpu
def test_readme_gpu_example():
    out = run_python(["-c", readme_example("GPU")], "README's GPU example")
    assert re.search(r"^GPU: \d+ sources$", out, re.M), out


def test_custom_kernel_example_on_cpu():
    out = run_example("custom_kernel.py", hide_gpus=True)
    assert "CPU path: verified against the CPU reference" in out
    assert "GPU path: skipped" in out
    assert "FAIL" not in out


@pytest.mark.gpu
def test_custom_kernel_example_on_gpu():
    out = run_example("custom_kernel.py")
    assert "CPU path: verified against the CPU reference" in out
    assert "GPU path: verified against the CPU reference" in out  # CuPy chunks really ran
    assert "gpu, dask chunks" in out and "FAIL" not in out


def test_cluster_example_on_cpu():
    out = run_example("broadcast_add_cluster.py", hide_gpus=True)
    assert "verified" in out
    assert "NumPy chunks" in out


@pytest.mark.gpu
def test_cluster_example_on_gpus():
    pytest.importorskip("dask_cuda")
    out = run_example("broadcast_add_cluster.py")
    assert "verified" in out
    assert "CuPy chunks" in out


def test_multi_gpu_example_on_cpu_workers():
    out = run_example("multi_gpu_gaussian.py", "--size", "256", "--chunks", "64", hide_gpus=True)
    assert out.startswith("2 worker(s) on CPU")
    assert "256x256 float32 (256.00 kiB) in 16 chunks of 64x64 (NumPy chunks)" in out
    assert "result:  rows 56..72 verified against scipy.ndimage.gaussian_filter" in out


@pytest.mark.gpu
def test_multi_gpu_example_on_gpus():
    pytest.importorskip("dask_cuda")
    out = run_example("multi_gpu_gaussian.py", "--size", "8192", "--chunks", "2048")
    assert " GPU(s): " in out.splitlines()[0]
    assert "in 16 chunks of 2048x2048 (CuPy chunks)" in out
    assert "result:  rows 2040..2056 verified" in out


def test_halo_kernel_example():
    out = run_example("halo_kernel.py", hide_gpus=True)
    assert "HaloError" not in out  # refused with a message, not a traceback
    assert "refused as expected" in out and "box_mean: verified" in out


def test_alignment_example():
    out = run_example("alignment.py", hide_gpus=True)
    assert "(2, 4) (2, 6)" in out  # what map_blocks does with misaligned operands
    assert "verified: align=True gives x + y" in out


def test_find_sources_example_on_cpu():
    out = run_example("find_sources.py", hide_gpus=True)
    assert "every step verified against the lesson's CPU code (NumPy chunks)" in out


@pytest.mark.gpu
def test_find_sources_example_on_gpu():
    out = run_example("find_sources.py")
    assert "every step verified against the lesson's CPU code (CuPy chunks)" in out


def test_measure_sources_example_on_cpu():
    out = run_example("measure_sources.py", hide_gpus=True)
    assert "NumPy and Dask chunks:" in out and "sources verified" in out
    assert "CuPy: skipped" in out


@pytest.mark.gpu
def test_measure_sources_example_on_gpu():
    out = run_example("measure_sources.py")
    assert "CuPy:" in out and "verified against scipy.ndimage on the GPU" in out


def test_lesson_convolution_example_on_cpu():
    out = run_example("lesson_convolution.py", "--size", "512", "--chunk", "128", hide_gpus=True)
    assert "NumPy chunks on the CPU" in out
    assert "validated: shape (526, 526)" in out and "FAIL" not in out


@pytest.mark.gpu
def test_lesson_convolution_example_on_gpu():
    out = run_example("lesson_convolution.py")  # 16384 x 16384 in chunks of 2048
    assert "CuPy chunks on the GPU" in out
    assert "validated: shape (16398, 16398)" in out and "FAIL" not in out


def test_resize_volume_example_on_cpu():
    out = run_example("resize_volume.py", "--size", "32", "--chunks", "12", "--target", "20",
                      hide_gpus=True)
    assert "CPU path" in out and "NumPy chunks" in out
    assert "zoom: verified" in out and "resize: verified" in out


@pytest.mark.gpu
def test_resize_volume_example_on_gpu():
    out = run_example("resize_volume.py", "--size", "96", "--chunks", "32", "--target", "40")
    assert "GPU path" in out and "CuPy chunks" in out
    assert "zoom: verified" in out and "resize: verified" in out


def test_xarray_example():
    pytest.importorskip("xarray")
    out = run_example("xarray_image.py", hide_gpus=True)
    assert "lazy" in out and "verified against scipy.ndimage" in out


def test_cluster_example_against_a_scheduler_and_workers_started_apart():
    """The multi-machine shape on one host: `dask scheduler` and `dask worker` processes started
    on their own, as on N machines, and the example pointed at the scheduler."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    dask_cli = [sys.executable, "-m", "dask"]
    started = [subprocess.Popen(dask_cli + ["scheduler", "--host", "127.0.0.1", "--port",
                                            str(port), "--no-dashboard"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(2)
        for _ in range(2):
            started.append(subprocess.Popen(dask_cli + ["worker", address, "--nthreads", "1",
                                                        "--no-dashboard"],
                                            env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=60) as c:
            c.wait_for_workers(2, timeout=60)
        out = run_example("cluster_filter_label.py", address, "--size", "512", "--chunks", "128",
                          hide_gpus=True)
        assert "2 worker(s) on CPU" in out
        assert "blocks per worker: [8, 8]" in out
        assert "verified against SciPy" in out
    finally:
        for proc in reversed(started):
            proc.terminate()
        for proc in started:
            proc.wait(timeout=30)


def test_cluster_example_on_a_local_cluster():
    out = run_example("cluster_filter_label.py", "--size", "256", "--chunks", "64",
                      hide_gpus=True)
    assert "verified against SciPy" in out


@pytest.mark.multigpu
def test_cluster_example_against_dask_cuda_workers_started_apart():
    """`dask scheduler` and `dask cuda worker` (one worker per GPU) as separate processes, as
    on N machines; the example pointed at the scheduler computes on every GPU."""
    import socket
    import time

    pytest.importorskip("dask_cuda")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    dask_cli = [sys.executable, "-m", "dask"]
    started = [subprocess.Popen(dask_cli + ["scheduler", "--host", "127.0.0.1", "--port",
                                            str(port), "--no-dashboard"], env=env)]
    try:
        time.sleep(2)
        started.append(subprocess.Popen(dask_cli + ["cuda", "worker", address, "--no-dashboard"],
                                        env=env))
        from distributed import Client

        from chunkernels import cuda

        with Client(address, timeout=60) as c:
            c.wait_for_workers(cuda.gpu_count(), timeout=120)
        out = run_example("cluster_filter_label.py", address, "--size", "8192", "--chunks",
                          "2048")
        assert f"{cuda.gpu_count()} GPU(s)" in out
        assert "verified against SciPy" in out and "CuPy chunks" in out
    finally:
        for proc in reversed(started):
            proc.terminate()
        for proc in started:
            proc.wait(timeout=60)
