"""``chunkernels check``: every kernel's paths against its CPU reference on random inputs.

For each kernel and each of its sample cases (``KernelSpec.cases``) the CPU reference on the whole
array defines the expected result; it is compared with ``apply`` on Dask arrays of NumPy chunks for
several chunkings, and, where a GPU is present, with the GPU path on the whole array and on Dask
arrays of CuPy chunks (views keep their strides on the device).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chunkernels import cuda
from chunkernels._apply import apply
from chunkernels._registry import get, registered
from chunkernels.testing import assert_close, chunkings, to_device_view


@dataclass
class CheckResult:
    kernel: str
    path: str
    cases: int
    passed: int
    detail: str = ""

    @property
    def status(self) -> str:
        if self.cases == 0:
            return "skip"
        return "pass" if self.passed == self.cases else "FAIL"


def check(names=None, *, seed: int = 0, gpu: bool | None = None,
          progress=None) -> list[CheckResult]:
    """Validate kernels ``names`` (all by default); ``gpu=None`` checks the GPU path if one exists.

    ``progress(name, results)``, if given, is called after each kernel with that kernel's results:
    on a fresh GPU machine every kernel's first use compiles its CUDA code, so a full check takes
    minutes and should say how far it got.
    """
    asked = gpu
    if gpu is None:
        gpu = cuda.gpu_count() > 0
    results = []
    for name in names or registered():
        done = len(results)
        spec = get(name)
        rng = np.random.default_rng(seed)
        cases = list(spec.cases(rng)) if spec.cases is not None else []
        paths = {"cpu, dask chunks": _cpu_dask}
        if gpu and spec.gpu is not None:
            paths.update({"gpu, whole array": _gpu_whole, "gpu, dask chunks": _gpu_dask})
        expected = [_reference(spec, x, ops, params) for x, ops, params in cases]
        for path, run in paths.items():
            passed, detail = 0, ""
            for i, ((x, ops, params), want) in enumerate(zip(cases, expected)):
                if isinstance(want, Exception):
                    problem = f"the CPU reference raised {_one_line(want)}"
                else:
                    try:
                        run(spec, x, ops, params, want)
                        passed += 1
                        continue
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        problem = _one_line(exc)
                detail = detail or f"case {i} (x {x.shape} {x.dtype}): {problem}"
            results.append(CheckResult(name, path, len(cases), passed, detail))
        if not gpu and spec.gpu is not None:
            why = "skipped: the GPU path not asked for" if asked is False else (
                "skipped: no CUDA GPU here")
            results.append(CheckResult(name, "gpu", 0, 0, why))
        if progress is not None:
            progress(name, results[done:])
    return results


def _reference(spec, x, ops, params):
    """The CPU reference's result for one case, or the exception it raised.

    The reference defines the expected result; a reference that raises (a kernel registered with
    a broken ``cpu=``, or ``cases`` that draw parameters it refuses) is a failed case in the
    table, with the reference's message, not a traceback that stops the check of every kernel.
    """
    try:
        return np.asarray(spec.cpu(x, *ops, **spec.params(x.ndim, params)))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return exc


def _one_line(exc: BaseException) -> str:
    """``exc`` in one line: its type and the non-empty lines of its message (NumPy's assertion
    messages start with an empty line and put the differences below it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {' | '.join(lines)}"[:400]


def _dask_cases(spec, x, ops, params):
    import dask.array as da

    depth = max(spec.depth(x.ndim, spec.params(x.ndim, params)), default=0)
    for chunks in chunkings(x.shape, depth):
        yield chunks, da.from_array(x, chunks=chunks, asarray=False)


def _cpu_dask(spec, x, ops, params, expected):
    for chunks, dx in _dask_cases(spec, x, ops, params):
        got = apply(dx, spec.name, *ops, align=True, allow_rechunk=True, strict=True, **params)
        assert_close(got.compute(), expected, rtol=spec.rtol, err_msg=f"chunks {chunks}")


def _gpu_whole(spec, x, ops, params, expected):
    got = apply(to_device_view(x), spec.name, *map(to_device_view, ops), strict=True, **params)
    assert cuda.is_cupy_array(got), f"GPU input gave {type(got).__name__}"
    assert_close(got, expected, **_gpu_tolerance(spec, expected))


def _gpu_dask(spec, x, ops, params, expected):
    dev_x = to_device_view(x)
    dev_ops = tuple(map(to_device_view, ops))
    for chunks, _ in _dask_cases(spec, x, ops, params):
        import dask.array as da

        dx = da.from_array(dev_x, chunks=chunks, asarray=False)
        got = apply(dx, spec.name, *dev_ops, align=True, allow_rechunk=True, strict=True, **params)
        assert cuda.is_cupy_array(got._meta), "GPU chunks gave a non-CuPy meta"
        assert_close(got.compute(), expected, err_msg=f"chunks {chunks}",
                     **_gpu_tolerance(spec, expected))


def _gpu_tolerance(spec, expected) -> dict:
    """Tolerances of a GPU result against the CPU reference.

    float32 results of kernels that sum in float32 on the device (the filters' fast path) round
    differently from references that sum in float64 and store float32 (scipy.ndimage): they are
    compared within 1e-5, as the kernels' GPU tests compare them. Everything else as on the CPU.
    """
    if spec.rtol is None and np.dtype(expected.dtype) == np.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": spec.rtol}


def format_table(results) -> str:
    """The results as a fixed-width text table."""
    rows = [("kernel", "path", "cases", "result", "detail")]
    rows += [(r.kernel, r.path, str(r.cases), r.status, r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4]).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
