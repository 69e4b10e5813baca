"""SciPy's own ``scipy.ndimage`` tests, judging ``chunkernels.ndimage`` on Dask arrays of about
three uneven chunks per axis (the plugin ``tests/scipy_suite.py`` says how). Each module runs
in a pytest process of its own, with SciPy's ``conftest.py`` and none of this suite's settings.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Per SciPy test module, functions whose calls must have reached chunkernels.
MODULES = {
    "test_filters": ("correlate", "convolve1d", "gaussian_filter", "uniform_filter", "sobel"),
    "test_measurements": ("label", "sum_labels", "center_of_mass", "find_objects",
                          "maximum_position"),
    "test_interpolation": ("zoom", "spline_filter"),
}


def _calls(output: str) -> dict[str, int]:
    """The plugin's count of calls per function, from its summary line."""
    for line in output.splitlines():
        if line.startswith("chunkernels.ndimage calls"):
            counts = line.partition(": ")[2]
            return {name: int(n) for name, n in (c.rsplit(" ", 1) for c in counts.split(", "))
                    if n.isdigit()}
    return {}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_scipys_own_tests_pass_on_chunked_input(module, tmp_path):
    # found, not imported: importing applies SciPy's marks, unknown to this suite's settings
    if importlib.util.find_spec(f"scipy.ndimage.tests.{module}") is None:
        pytest.skip("this SciPy was installed without its tests")
    env = {**os.environ, "SCIPY_SUITE_CHUNKS": "thirds",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-c", os.devnull, "--rootdir", str(tmp_path), "-p", "scipy_suite",
           "--pyargs", f"scipy.ndimage.tests.{module}"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1200,
                         check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    calls = _calls(output)
    missing = [name for name in MODULES[module] if not calls.get(name)]
    assert not missing, f"no call of {missing} reached chunkernels: {calls}"
