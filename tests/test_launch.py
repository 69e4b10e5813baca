"""How chunkernels.cuda.Kernel launches: arguments packed as the kernel's parameters lie in
memory and passed to cuLaunchKernel, which is called holding the GIL.

The CPU tests stand a recording function in for the driver (and a stand-in CuPy module): they
read each argument back through the pointer the launch passes. The GPU test launches a kernel
that writes its arguments out, through the driver and through CuPy, and compares.
"""

import ctypes
import sys
import threading
import types

import numpy as np
import pytest

from chunkernels import cuda


class _Array:
    """A stand-in CuPy array: only its data pointer."""

    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


class _Raw:
    """A stand-in cupy.RawKernel that records the launches it gets."""

    kernel = types.SimpleNamespace(ptr=0xF00D)

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


class _DriverError(RuntimeError):
    pass


@pytest.fixture
def driver(monkeypatch):
    """A stand-in CuPy (array type, current stream, driver error) and driver launch; yields the
    launches' recorded arguments, each with the kernel's arguments read back from the buffer."""
    stream = types.SimpleNamespace(ptr=0x5EED)
    fake = types.ModuleType("cupy")
    fake.ndarray = _Array
    freed = []
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: stream,
                                      driver=types.SimpleNamespace(CUDADriverError=_DriverError),
                                      runtime=types.SimpleNamespace(free=freed.append))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    launches = []
    status = {"value": 0, "then": []}

    def launch(function, gx, gy, gz, bx, by, bz, shared, stream_ptr, params, extra):
        # what ctypes passes without argtypes: pointers as c_void_p (or None), sizes as C ints
        assert all(isinstance(p, ctypes.c_void_p) for p in (function, params))
        assert stream_ptr is None or isinstance(stream_ptr, ctypes.c_void_p)
        assert all(type(n) is int and 0 <= n < 2**31 for n in (gx, gy, gz, bx, by, bz, shared))
        launches.append({"function": function.value, "grid": (gx, gy, gz),
                         "block": (bx, by, bz), "shared": shared,
                         "stream": stream_ptr and stream_ptr.value, "params": params.value,
                         "extra": extra, "thread": threading.get_ident()})
        return status["then"].pop(0) if status["then"] else status["value"]

    monkeypatch.setattr(cuda, "_driver_launch", lambda: launch)
    monkeypatch.setattr(cuda, "LAUNCH_HOLDS_GIL", True)
    yield types.SimpleNamespace(launches=launches, status=status, freed=freed, stream=stream)


def _argument(params, i, ctype):
    """Argument ``i`` of a launch, read through its pointer in ``kernelParams``."""
    address = ctypes.c_void_p.from_address(params + 8 * i).value
    assert address % ctypes.sizeof(ctype) == 0, f"argument {i} is not aligned for {ctype}"
    return ctype.from_address(address).value


def test_arguments_reach_the_driver_as_the_kernel_reads_them(driver):
    """Every argument type the library passes, mixed so that C alignment adds padding."""
    kernel = cuda.Kernel(_Raw())
    args = (_Array(0x1000), np.int8(-3), np.float64(2.5), np.int32(-7), _Array(0x2008),
            np.bool_(True), np.uint64(2**63 + 5), np.float32(0.25), np.int16(-300), 41, 1.5,
            np.uint32(2**32 - 1), np.int64(-(2**40)), np.uint8(200), np.uint16(65000))
    want = [(ctypes.c_void_p, 0x1000), (ctypes.c_int8, -3), (ctypes.c_double, 2.5),
            (ctypes.c_int32, -7), (ctypes.c_void_p, 0x2008), (ctypes.c_bool, True),
            (ctypes.c_uint64, 2**63 + 5), (ctypes.c_float, 0.25), (ctypes.c_int16, -300),
            (ctypes.c_int64, 41), (ctypes.c_double, 1.5), (ctypes.c_uint32, 2**32 - 1),
            (ctypes.c_int64, -(2**40)), (ctypes.c_uint8, 200), (ctypes.c_uint16, 65000)]
    kernel((3, 2), (128,), args, shared_mem=1024)
    (launch,) = driver.launches
    assert launch["function"] == 0xF00D and launch["stream"] == 0x5EED
    assert launch["grid"] == (3, 2, 1) and launch["block"] == (128, 1, 1)
    assert launch["shared"] == 1024 and launch["extra"] is None
    assert [_argument(launch["params"], i, t) for i, (t, _) in enumerate(want)] == \
        [v for _, v in want]


def test_a_numpy_array_is_passed_by_value_as_its_bytes(driver):
    """As CuPy passes a struct (the halo gather's plan): the array's bytes, copied at launch;
    an array of another size than the first launch's goes through CuPy."""
    raw = _Raw()
    kernel = cuda.Kernel(raw)
    words = np.arange(5, dtype=np.int64)
    kernel((1,), (32,), (_Array(0x10), words.view(np.dtype((np.void, 40))), np.int32(3)))
    params = driver.launches[-1]["params"]
    at = ctypes.c_void_p.from_address(params + 8).value
    assert ctypes.string_at(at, 40) == words.tobytes()
    assert _argument(params, 2, ctypes.c_int32) == 3
    kernel((1,), (32,), (_Array(0x10), np.zeros(1, np.dtype((np.void, 48))), np.int32(3)))
    assert len(driver.launches) == 1 and len(raw.calls) == 1


def test_each_launch_packs_its_own_values(driver):
    """The buffer is reused per thread: a second launch's values replace the first's."""
    kernel = cuda.Kernel(_Raw())
    for n in (5, 6):
        kernel((1,), (32,), (_Array(0x100 * n), np.int64(n)))
        launch = driver.launches[-1]
        assert _argument(launch["params"], 0, ctypes.c_void_p) == 0x100 * n
        assert _argument(launch["params"], 1, ctypes.c_int64) == n


def test_the_null_stream_is_passed_as_null(driver):
    driver.stream.ptr = 0
    kernel = cuda.Kernel(_Raw())
    kernel((1,), (32,), (np.int32(1),))
    assert driver.launches[-1]["stream"] is None


def test_threads_launch_from_their_own_buffers(driver):
    kernel = cuda.Kernel(_Raw())
    seen, values = {}, {}
    launched = threading.Barrier(4)  # every thread alive (its buffer too) until all launched

    def launch(n):
        kernel((1,), (32,), (np.int32(n),))
        seen[n] = next(entry for entry in driver.launches
                       if entry["thread"] == threading.get_ident())["params"]
        launched.wait()
        values[n] = _argument(seen[n], 0, ctypes.c_int32)

    threads = [threading.Thread(target=launch, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen.values())) == 4
    assert values == {n: n for n in range(4)}


def test_other_argument_types_and_the_switch_go_through_cupy(driver, monkeypatch):
    """Argument types the packer does not know (None, CuPy's memory pointers...) and
    ``LAUNCH_HOLDS_GIL = False`` launch through CuPy, with the same arguments."""
    raw = _Raw()
    kernel = cuda.Kernel(raw)
    kernel((1,), (32,), (None, np.int32(1)))
    kernel((1,), (32,), (np.float16(1.0),))
    monkeypatch.setattr(cuda, "LAUNCH_HOLDS_GIL", False)
    kernel((2,), (64,), (np.int32(2),), shared_mem=8)
    assert not driver.launches
    assert [c[2] for c in raw.calls] == [(None, np.int32(1)), (np.float16(1.0),), (np.int32(2),)]
    assert raw.calls[-1][3] == 8


def test_later_launches_are_packed_as_the_first(driver):
    """A compiled function's parameters are fixed: the first launch's arguments give the
    layout. A scalar of another width is packed at the parameter's; an argument of another
    kind (no array where the first launch had one, an array for a scalar) goes through CuPy."""
    raw = _Raw()
    kernel = cuda.Kernel(raw)
    kernel((1,), (32,), (_Array(0x10), np.int64(1), np.float32(0.5)))
    kernel((1,), (32,), (_Array(0x20), np.int32(-2), 0.25))
    params = driver.launches[-1]["params"]
    assert _argument(params, 0, ctypes.c_void_p) == 0x20
    assert _argument(params, 1, ctypes.c_int64) == -2
    assert _argument(params, 2, ctypes.c_float) == 0.25
    kernel((1,), (32,), (None, np.int64(1), np.float32(0.5)))
    kernel((1,), (32,), (_Array(0x10), _Array(0x30), np.float32(0.5)))
    assert len(driver.launches) == 2 and len(raw.calls) == 2


def test_a_failed_launch_raises_the_driver_error(driver):
    driver.status["value"] = 701  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(_DriverError):
        cuda.Kernel(_Raw())((1,), (32,), (np.int32(1),))


def test_a_thread_without_a_context_gets_one_and_launches_again(driver):
    """A Dask worker thread that has made no CUDA runtime call has no current context: the
    driver says CUDA_ERROR_INVALID_CONTEXT, cudaFree(0) binds the device's, the launch is
    made again with the same arguments."""
    driver.status["then"] = [201]
    kernel = cuda.Kernel(_Raw())  # kept: its buffer holds the arguments read back below
    kernel((1,), (32,), (np.int32(9),))
    assert driver.freed == [0]
    first, again = driver.launches
    assert first == again and _argument(again["params"], 0, ctypes.c_int32) == 9


_ECHO = r"""
extern "C" __global__ void echo(const float* x, signed char a, double b, int c, bool d,
                                unsigned long long e, float f, short g, long long h,
                                double* out)
{
    out[0] = x[1]; out[1] = a; out[2] = b; out[3] = c; out[4] = d;
    out[5] = (double)(e >> 40); out[6] = f; out[7] = g; out[8] = (double)h;
}
"""


@pytest.mark.gpu
def test_driver_launch_matches_cupy_launch_on_the_device():
    cp = cuda.cupy()
    assert cuda._driver_launch() is not None, "libcuda.so.1 not loadable: CuPy would launch"
    raw = cp.RawKernel(_ECHO, "echo")
    kernel = cuda.Kernel(raw)
    x = cp.arange(4, dtype=cp.float32)
    args = (x, np.int8(-3), np.float64(2.5), np.int32(-7), np.bool_(True),
            np.uint64(5 << 40), np.float32(0.25), np.int16(-300), 41)
    want = cp.zeros(9, dtype=cp.float64)
    got = cp.zeros(9, dtype=cp.float64)
    raw((1,), (1,), (*args, want))
    kernel((1,), (1,), (*args, got))
    np.testing.assert_array_equal(got.get(), [1, -3, 2.5, -7, 1, 5, 0.25, -300, 41])
    np.testing.assert_array_equal(got.get(), want.get())


@pytest.mark.parametrize("value, holds", [("0", False), ("false", False), ("OFF", False),
                                          ("1", True), ("yes", True)])
def test_the_environment_variable_switches_it_off(value, holds):
    """CHUNKERNELS_LAUNCH_HOLDS_GIL reaches every process that imports chunkernels (Dask's
    worker processes too): checked in a fresh interpreter."""
    import os
    import subprocess

    code = "import chunkernels.cuda as c; print(c.LAUNCH_HOLDS_GIL)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "CHUNKERNELS_LAUNCH_HOLDS_GIL": value})
    assert out.stdout.strip() == str(holds)


@pytest.mark.gpu
def test_launches_go_to_the_current_stream():
    """Kernel launches on CuPy's current stream (a stream made current with ``with``, and the
    null stream), as CuPy's own launches do; results read back on that stream."""
    cp = cuda.cupy()
    assert cuda._current_stream_ptr()() == cp.cuda.get_current_stream().ptr
    kernel = cuda.Kernel(cp.RawKernel(_ECHO, "echo"))
    x = cp.arange(4, dtype=cp.float32)
    args = (x, np.int8(1), np.float64(2), np.int32(3), np.bool_(False), np.uint64(0),
            np.float32(4), np.int16(5), 6)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        assert cuda._current_stream_ptr()() == stream.ptr != 0
        out = cp.zeros(9, dtype=cp.float64)
        kernel((1,), (1,), (*args, out))
        got = out.get(stream=stream)
    np.testing.assert_array_equal(got, [1, 1, 2, 3, 0, 0, 4, 5, 6])
