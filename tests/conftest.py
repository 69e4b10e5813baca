"""Shared test configuration: GPU skips, registry isolation and the user kernels the tests register.

Tests marked ``gpu`` need CuPy and a CUDA device, ``multigpu`` two devices; without them they are
skipped at collection, with the reason, so the CPU suite runs unchanged on a machine without a GPU.
A kernel launch that would fall back to CuPy's (an old driver, a CuPy without the function
handle) is an error in the tests: ``CHUNKERNELS_LAUNCH_FALLBACK=error``, set here for this
process and the Dask worker processes it starts.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import scipy.ndimage as ndi

import chunkernels
from chunkernels import _registry

os.environ["CHUNKERNELS_LAUNCH_FALLBACK"] = "error"

# -- GPU markers ----------------------------------------------------------------------------------


@functools.cache
def gpu_status() -> tuple[int, str]:
    """``(number of CUDA devices, why there are none)``; CuPy is imported only when asked.

    Cached: asking the driver once per session is enough, and the question is only asked when a
    collected test carries a GPU marker, so a CPU-only run never imports CuPy.
    """
    try:
        import cupy
    except ImportError as exc:
        return 0, f"CuPy is not importable ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device: all mean "no GPU"
        return 0, f"CuPy found no CUDA device ({type(exc).__name__}: {exc})"
    return count, "" if count else "CuPy reports 0 CUDA devices"


def pytest_collection_modifyitems(config, items):
    needs = {"gpu": 1, "multigpu": 2}
    for item in items:
        want = max((n for mark, n in needs.items() if item.get_closest_marker(mark)), default=0)
        if not want:
            continue
        count, why = gpu_status()
        if count < want:
            reason = why or f"needs {want} CUDA GPUs, found {count}"
            item.add_marker(pytest.mark.skip(reason=reason))


# -- registry isolation ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_registry():
    """Snapshot the kernel registry and restore it after the test.

    Tests register, replace and unregister kernels and reset the entry-point loading; none of it
    may leak into the next test. The dicts are restored in place because the registry functions
    use these very objects.
    """
    saved = (dict(_registry._REGISTRY), dict(_registry._ORIGIN), dict(_registry._loaded))
    yield
    targets = (_registry._REGISTRY, _registry._ORIGIN, _registry._loaded)
    for target, snapshot in zip(targets, saved, strict=True):
        target.clear()
        target.update(snapshot)


# -- user kernels (CPU reference only) ------------------------------------------------------------

#: Edge modes of ``moving_sum``: scipy.ndimage's names.
MODES = ("reflect", "nearest", "mirror", "constant", "wrap")
#: scipy.ndimage's synonyms, which validation turns into the names above.
MODE_SYNONYMS = {"grid-wrap": "wrap", "grid-mirror": "reflect", "grid-constant": "constant"}


def moving_sum_reference(x, *, radius=1, mode="reflect"):
    """``x[..., i-radius] + ... + x[..., i+radius]`` along the last axis, ``mode`` at the edges."""
    return ndi.correlate1d(x, np.ones(2 * radius + 1, dtype=x.dtype), axis=-1, mode=mode)


def _moving_sum_validate(ndim, radius=1, mode="reflect", **unknown):
    if unknown:
        raise TypeError(f"moving_sum got unexpected parameters {sorted(unknown)}")
    mode = MODE_SYNONYMS.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {MODES}")
    if ndim < 1:
        raise ValueError("moving_sum needs at least one axis")
    return {"radius": int(radius), "mode": mode}


def _moving_sum_halo(ndim, *, radius=1, mode="reflect"):
    return (0,) * (ndim - 1) + (radius,)


def _boundary(mode="reflect", **_):
    # 'wrap' needs the values from the other end of the array; every other mode is applied by the
    # kernel itself at the array's outer edge, so Dask must not pad there.
    return "periodic" if mode == "wrap" else "none"


MOVING_SUM = chunkernels.KernelSpec(
    name="moving_sum",
    summary="sum over a window of 2*radius+1 along the last axis; reference ndimage.correlate1d",
    cpu=moving_sum_reference,
    halo=_moving_sum_halo,
    halo_rule="radius (last axis)",
    boundary=_boundary,
    validate=_moving_sum_validate,
    dtypes=("float32", "float64", "int32", "int64"),
    ndim=(1, None),
)


def scaled_subtract_reference(x, other, *, scale=1):
    """``(x - other) * scale`` in NumPy's result dtype of ``x`` and ``other``."""
    diff = np.subtract(x, other, dtype=np.result_type(x.dtype, other.dtype))
    return diff * diff.dtype.type(scale)


SCALED_SUBTRACT = chunkernels.KernelSpec(
    name="scaled_subtract",
    summary="(x - other) * scale, other broadcast over x",
    cpu=scaled_subtract_reference,
    operands=("other",),
    dtypes=("float32", "float64", "int32", "int64"),
)


@pytest.fixture
def references_fold(monkeypatch):
    """The CPU references fold every tap that reaches beyond its axis, as the kernels do
    (by default they leave taps reaching at most ``SCIPY_REACH`` to SciPy's own extension):
    tests of the folding itself run it on the CPU too."""
    from chunkernels._shared import filters

    monkeypatch.setattr(filters, "SCIPY_REACH", 0)


@pytest.fixture
def moving_sum():
    """Register the halo kernel ``moving_sum`` for one test; returns its spec."""
    return chunkernels.register(MOVING_SUM)


@pytest.fixture
def scaled_subtract():
    """Register the pointwise kernel ``scaled_subtract`` for one test; returns its spec."""
    return chunkernels.register(SCALED_SUBTRACT)


# -- shared helpers -------------------------------------------------------------------------------


def random_array(rng, shape, dtype):
    """Random values of ``dtype``; integers small enough that sums of a few never overflow, floats
    integral so that sums are exact whatever order a chunked computation adds them in."""
    return rng.integers(-1000, 1000, size=shape).astype(dtype)



def demo_in_a_thread(client, tmp_path, *options):
    """``chunkernels demo``'s pipeline on ``client``, started in a daemon thread with the
    command's own parser and defaults (``--out tmp_path``, then ``options``): ``(thread,
    outcome)``, where ``outcome`` gets ``"status"`` (the exit status) or ``"error"`` (what it
    raised) when the pipeline ends. The fault tests kill workers while it runs."""
    import argparse
    import threading

    from chunkernels import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path), *options])
    outcome = {}

    def run():
        try:
            outcome["status"] = demo._pipeline(args, client)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome
