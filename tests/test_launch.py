"""How chunkernels.cuda.Kernel launches: each argument packed at the offset and size the compiled
function's parameter has (the driver's cuFuncGetParamInfo), cuLaunchKernel called holding the
GIL or releasing it as the thread's policy says, and every way this can fail loud.

The CPU tests stand fakes in for the driver (a parameter table per function handle, recording
launch functions) and for CuPy (array type, current stream): they read each argument back
through the pointer the launch passes. The GPU tests launch real kernels, compare with CuPy's
own launch and with NumPy, on several streams, devices and threads.
"""

import ctypes
import itertools
import os
import re
import subprocess
import sys
import threading
import types
import warnings

import numpy as np
import pytest

from chunkernels import cuda
from chunkernels._errors import KernelArgumentError, LaunchFallbackError, LaunchFallbackWarning


def _layout(*ctypes_types):
    """``(offset, size)`` of parameters of these C types, as a C compiler lays them out (the
    parameter space of a kernel is laid out as a struct of its parameters)."""
    fields = [(f"p{i}", t) for i, t in enumerate(ctypes_types)]
    struct_type = type("Params", (ctypes.Structure,), {"_fields_": fields})
    return tuple((getattr(struct_type, name).offset, ctypes.sizeof(t)) for name, t in fields)


class _Array:
    """A stand-in CuPy array: only its data pointer."""

    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


class _Raw:
    """A stand-in cupy.RawKernel with a function handle; records the launches it gets."""

    def __init__(self, handle=0xF00D, name="fake_kernel"):
        self.kernel = types.SimpleNamespace(ptr=handle)
        self.name = name
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


class _DriverError(RuntimeError):
    pass


_HANDLES = iter(range(0x1000, 1 << 40, 0x10))


@pytest.fixture
def driver(monkeypatch):
    """A stand-in CuPy and driver. ``driver.kernel(*ctypes_types)`` makes a Kernel whose
    compiled parameters are of those C types; ``driver.launches`` records each launch, with
    the function (hold or release) that made it."""
    stream = types.SimpleNamespace(ptr=0x5EED)
    fake = types.ModuleType("cupy")
    fake.ndarray = _Array
    fake.__version__ = "0.fake"
    freed = []
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: stream,
                                      driver=types.SimpleNamespace(CUDADriverError=_DriverError),
                                      runtime=types.SimpleNamespace(free=freed.append))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    tables, launches, queries = {}, [], []
    status = {"value": 0, "then": [], "info": []}

    def param_info(handle, index, offset, size):
        # what ctypes hands the real function with its argtypes: the handle as c_void_p, the
        # index as an int, the outputs as c_size_t (passed by reference)
        assert isinstance(handle, ctypes.c_void_p) and type(index) is int
        queries.append((handle.value, index))
        if status["info"]:
            return status["info"].pop(0)
        table = tables[handle.value]
        if index >= len(table):
            return 1  # CUDA_ERROR_INVALID_VALUE
        offset.value, size.value = table[index]
        return 0

    def launcher(holds):
        def launch(function, gx, gy, gz, bx, by, bz, shared, stream_ptr, params, extra):
            # what ctypes passes without argtypes: pointers as c_void_p (or None), sizes as ints
            assert all(isinstance(p, ctypes.c_void_p) for p in (function, params))
            assert stream_ptr is None or isinstance(stream_ptr, ctypes.c_void_p)
            assert all(type(n) is int and 0 <= n < 2**31 for n in (gx, gy, gz, bx, by, bz, shared))
            launches.append({"function": function.value, "grid": (gx, gy, gz),
                             "block": (bx, by, bz), "shared": shared,
                             "stream": stream_ptr and stream_ptr.value, "params": params.value,
                             "extra": extra, "thread": threading.get_ident(), "holds": holds})
            return status["then"].pop(0) if status["then"] else status["value"]
        return launch

    fake_driver = cuda._Driver(launcher(True), launcher(False), param_info)
    monkeypatch.setattr(cuda, "_driver", lambda: fake_driver)
    # the fakes' launches count apart from the process's (which reports read)
    monkeypatch.setattr(cuda, "_DRIVER_LAUNCHES", itertools.count())
    monkeypatch.setattr(cuda, "_COUNT_READS", 0)
    monkeypatch.setattr(cuda, "_CUPY_LAUNCHES", {})
    monkeypatch.setattr(cuda, "LAUNCH_HOLDS_GIL", "auto")
    monkeypatch.setattr(cuda, "LAUNCH_THROUGH_CUPY", False)

    def kernel(*ctypes_types, name="fake_kernel", layout=None):
        raw = _Raw(next(_HANDLES), name)
        tables[raw.kernel.ptr] = _layout(*ctypes_types) if layout is None else layout
        return cuda.Kernel(raw, name)

    yield types.SimpleNamespace(kernel=kernel, launches=launches, status=status, freed=freed,
                                stream=stream, queries=queries, driver=fake_driver)


def _argument(launch, i, ctype):
    """Argument ``i`` of a launch, read through its pointer in ``kernelParams``."""
    address = ctypes.c_void_p.from_address(launch["params"] + 8 * i).value
    if ctype is bytes:
        return address
    return ctype.from_address(address).value


# -- the layout and the packing -------------------------------------------------------------------


def test_every_kind_of_argument_is_packed_as_its_parameter(driver):
    """Each argument at its parameter's offset (C alignment adds padding) and size: arrays as
    pointers, NumPy scalars by dtype, Python ints and floats at the parameter's size."""
    c = ctypes
    params = [(c.c_void_p, _Array(0x1000), 0x1000), (c.c_int8, np.int8(-3), -3),
              (c.c_double, np.float64(2.5), 2.5), (c.c_int32, np.int32(-7), -7),
              (c.c_void_p, _Array(0x2008), 0x2008), (c.c_bool, np.bool_(True), True),
              (c.c_uint64, np.uint64(2**63 + 5), 2**63 + 5), (c.c_float, np.float32(0.25), 0.25),
              (c.c_int16, np.int16(-300), -300), (c.c_int64, 41, 41), (c.c_double, 1.5, 1.5),
              (c.c_uint32, np.uint32(2**32 - 1), 2**32 - 1),
              (c.c_int64, np.int64(-(2**40)), -(2**40)), (c.c_uint8, np.uint8(200), 200),
              (c.c_uint16, np.uint16(65000), 65000),
              # a Python int for an int parameter is a 4-byte int, a float for a float
              # parameter a float32, a bool one byte (CuPy would pass 8, 8 and 1)
              (c.c_int32, -5, -5), (c.c_float, 0.75, 0.75), (c.c_bool, True, True),
              (c.c_int8, -1, -1), (c.c_int16, 1234, 1234)]
    kernel = driver.kernel(*(t for t, _, _ in params))
    kernel((3, 2), (128,), tuple(v for _, v, _ in params), shared_mem=1024)
    (launch,) = driver.launches
    assert launch["function"] == kernel._handle.value and launch["stream"] == 0x5EED
    assert launch["grid"] == (3, 2, 1) and launch["block"] == (128, 1, 1)
    assert launch["shared"] == 1024 and launch["extra"] is None
    assert [_argument(launch, i, t) for i, (t, _, _) in enumerate(params)] == \
        [want for _, _, want in params]
    # the pointers lie where the kernel's parameters do, relative to each other
    first = _argument(launch, 0, bytes)
    assert [_argument(launch, i, bytes) - first for i in range(len(params))] == \
        [offset for offset, _ in kernel.layout]


def test_half_and_complex_scalars_are_passed_as_their_bytes(driver):
    kernel = driver.kernel(ctypes.c_uint16, ctypes.c_double, ctypes.c_int8,
                           layout=((0, 2), (8, 8), (16, 1)))
    kernel((1,), (1,), (np.float16(1.5), np.complex64(1 + 2j), np.int8(3)))
    launch = driver.launches[-1]
    assert ctypes.string_at(_argument(launch, 0, bytes), 2) == np.float16(1.5).tobytes()
    assert ctypes.string_at(_argument(launch, 1, bytes), 8) == np.complex64(1 + 2j).tobytes()


def test_a_numpy_array_is_passed_by_value_as_its_bytes(driver):
    """As CuPy passes a struct (the halo gather's plan): the array's bytes, copied at launch; an
    array of another size than the parameter's raises, at the first launch and at any later."""
    kernel = driver.kernel(ctypes.c_void_p, ctypes.c_int64 * 5, ctypes.c_int32)
    words = np.arange(5, dtype=np.int64)
    kernel((1,), (32,), (_Array(0x10), words.view(np.dtype((np.void, 40))), np.int32(3)))
    launch = driver.launches[-1]
    assert ctypes.string_at(_argument(launch, 1, bytes), 40) == words.tobytes()
    assert _argument(launch, 2, ctypes.c_int32) == 3
    with pytest.raises(KernelArgumentError, match=r"kernel fake_kernel: argument 1 is a "
                       r"numpy.ndarray of 48 bytes, but parameter 1 of the compiled function is "
                       r"40 bytes"):
        kernel((1,), (32,), (_Array(0x10), np.zeros(1, np.dtype((np.void, 48))), np.int32(3)))
    # as CuPy: only one element passes by value, lest a NumPy array meant as device memory
    # be passed as bytes (here 40 of them, the parameter's size)
    with pytest.raises(KernelArgumentError, match=r"argument 1 is a numpy.ndarray of 5 elements "
                       r"\(shape \(5,\)\); only a one-element NumPy array, a struct, is passed by "
                       r"value \(parameter 1 is 40 bytes\); for device memory pass a CuPy array"):
        kernel((1,), (32,), (_Array(0x10), words, np.int32(3)))
    fresh = driver.kernel(ctypes.c_int64 * 5)
    with pytest.raises(KernelArgumentError, match="argument 0 is a numpy.ndarray of 5 elements"):
        fresh((1,), (32,), (np.zeros(5, np.int64),))
    assert len(driver.launches) == 1


def test_none_is_a_null_pointer(driver):
    """As CuPy passes None: a null pointer, for an 8-byte parameter only."""
    kernel = driver.kernel(ctypes.c_void_p, ctypes.c_int32)
    kernel((1,), (1,), (_Array(0x10), 1))
    kernel((1,), (1,), (None, 2))
    assert _argument(driver.launches[-1], 0, ctypes.c_void_p) is None
    assert _argument(driver.launches[-1], 1, ctypes.c_int32) == 2
    with pytest.raises(KernelArgumentError, match="argument 1 is a NoneType, but parameter 1 "
                       "of the compiled function is 4 bytes"):
        kernel((1,), (1,), (None, None))


def test_the_layout_is_the_kernels_not_the_first_calls(driver):
    """The first launch decides nothing: a later argument of another type is packed at the
    parameter's size if it fits exactly, and raises if it does not; nothing is coerced."""
    kernel = driver.kernel(ctypes.c_void_p, ctypes.c_int32, ctypes.c_float)
    seen = []
    for args in ((_Array(0x10), 7, 0.5),  # Python int and float: the parameters' sizes
                 (_Array(0x20), np.int32(-2), np.float32(0.25))):
        kernel((1,), (32,), args)
        launch = driver.launches[-1]
        seen.append((_argument(launch, 1, ctypes.c_int32), _argument(launch, 2, ctypes.c_float)))
    assert seen == [(7, 0.5), (-2, 0.25)]
    with pytest.raises(KernelArgumentError, match="argument 1 is a numpy.int64 of 8 bytes, but "
                       "parameter 1 of the compiled function is 4 bytes"):
        kernel((1,), (32,), (_Array(0x20), np.int64(-2), np.float32(0.25)))
    with pytest.raises(KernelArgumentError, match="argument 2 is a numpy.float64 of 8 bytes"):
        kernel((1,), (32,), (_Array(0x20), np.int32(-2), np.float64(0.25)))
    assert len(driver.launches) == 2


@pytest.mark.parametrize("args, message", [
    ((_Array(1), np.int32(1)), r"kernel fake_kernel takes 3 arguments \(its compiled parameters, "
     r"of 8, 4, 8 bytes\), got 2: \(test_launch._Array, numpy.int32 of 4 bytes\); pass one "
     r"value per parameter"),
    ((_Array(1), np.int32(1), 1.0, 2), "takes 3 arguments"),
    ((_Array(1), _Array(2), 1.0), r"argument 1 is a test_launch._Array, passed as its 8-byte "
     r"device pointer, but parameter 1 of the compiled function is 4 bytes; pass a value of the "
     r"parameter's C type \(numpy.int32, numpy.uint32, numpy.float32, or a Python int or "
     r"float\)"),
    ((_Array(1), np.int16(1), 1.0), "argument 1 is a numpy.int16 of 2 bytes, but parameter 1"),
    ((_Array(1), True, 1.0), "argument 1 is a bool, but parameter 1 of the compiled function "
     "is 4 bytes"),
    ((_Array(1), [1], 1.0), r"argument 1 is a list, which a launch cannot pass \(parameter 1 is "
     r"4 bytes\); pass a CuPy array \(as its device pointer\), a NumPy scalar, a Python int, "
     r"float or bool, or a NumPy array \(a struct, by value\)"),
    ((_Array(1), np.datetime64(1, "s"), 1.0), "argument 1 is a numpy.datetime64 of 8 bytes, "
     "which a launch cannot pass"),
    ((_Array(1), np.str_("ab"), 1.0), "argument 1 is a numpy.str_ of 8 bytes, which a launch "
     "cannot pass"),
    ((_Array(1), 2**31, 1.0), r"argument 1, the int 2147483648, does not fit parameter 1, a "
     r"4-byte signed integer; pass a NumPy scalar of the parameter's C type \(numpy.uint32 for "
     r"an unsigned one\)"),
])
def test_arguments_that_do_not_fit_raise_naming_kernel_parameter_size_and_type(driver, args,
                                                                               message):
    kernel = driver.kernel(ctypes.c_void_p, ctypes.c_int32, ctypes.c_double)
    with pytest.raises(KernelArgumentError, match=message):
        kernel((1,), (32,), args)
    assert not driver.launches


def test_a_float_out_of_float32_range_raises(driver):
    kernel = driver.kernel(ctypes.c_float)
    with pytest.raises(KernelArgumentError, match=r"the float 1e\+300, does not fit parameter "
                       r"0, a 4-byte float; pass a value a float32 can hold"):
        kernel((1,), (1,), (1e300,))
    with pytest.raises(TypeError):  # KernelArgumentError is a TypeError
        kernel((1,), (1,), ("a",))


def test_pack_plan_lays_values_at_the_offsets():
    """The plan is a pure function of the layout and the argument types: one struct with the
    parameters' padding, and a pack function that takes only arguments of those types."""
    layout = _layout(ctypes.c_int8, ctypes.c_double, ctypes.c_int16, ctypes.c_void_p)
    assert layout == ((0, 1), (8, 8), (16, 2), (24, 8))
    args = (np.int8(1), 2.0, 3, _Array(4))
    plan = cuda._pack_plan("k", layout, args, _Array)
    assert plan.struct.format == "<b7xdh6xQ" and plan.struct.size == 32
    assert plan.kinds == ("value", "value", "value", "pointer")
    buffer = ctypes.create_string_buffer(64)
    assert plan.pack(buffer, args)
    assert plan.struct.unpack_from(buffer, 32) == (1, 2.0, 3, 4)  # after 4 pointers, 16-aligned
    assert not plan.pack(buffer, (np.int8(1), 2.0, np.int16(3), _Array(4)))  # another type
    assert not plan.pack(buffer, args[:3])
    struct_plan = cuda._pack_plan("k", ((0, 16), (16, 8)), (np.zeros(1, "V16"), None), _Array)
    assert struct_plan.kinds == ("bytes", "null")
    with pytest.raises(KernelArgumentError, match="argument 0 is a numpy.ndarray of 8 bytes"):
        struct_plan.pack(buffer, (np.zeros(1, "V8"), None))
    scalar_plan = cuda._pack_plan("k", ((0, 16),), (np.zeros(1, "V16")[0],), _Array)
    with pytest.raises(KernelArgumentError, match="argument 0 is a numpy.void of 8 bytes"):
        scalar_plan.pack(buffer, (np.zeros(1, "V8")[0],))  # the same type, another size


def test_a_kernel_without_parameters(driver):
    kernel = driver.kernel()
    assert kernel.layout == ()
    kernel((1,), (1,), ())
    assert len(driver.launches) == 1
    with pytest.raises(KernelArgumentError, match=r"takes 0 arguments \(its compiled "
                       r"parameters, of no bytes\), got 1"):
        kernel((1,), (1,), (1,))


def test_each_launch_packs_its_own_values(driver):
    """The buffer is reused per thread: a second launch's values replace the first's."""
    kernel = driver.kernel(ctypes.c_void_p, ctypes.c_int64)
    for n in (5, 6):
        kernel((1,), (32,), (_Array(0x100 * n), np.int64(n)))
        launch = driver.launches[-1]
        assert _argument(launch, 0, ctypes.c_void_p) == 0x100 * n
        assert _argument(launch, 1, ctypes.c_int64) == n


def test_threads_launch_from_their_own_buffers(driver):
    kernel = driver.kernel(ctypes.c_int32)
    seen, values = {}, {}
    launched = threading.Barrier(4)  # every thread alive (its buffer too) until all launched

    def launch(n):
        kernel((1,), (32,), (np.int32(n),))
        seen[n] = next(entry for entry in driver.launches
                       if entry["thread"] == threading.get_ident())
        launched.wait()
        values[n] = _argument(seen[n], 0, ctypes.c_int32)

    threads = [threading.Thread(target=launch, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({entry["params"] for entry in seen.values()}) == 4
    assert values == {n: n for n in range(4)}


# -- the parameter table --------------------------------------------------------------------------


def test_the_parameter_table_is_read_once_per_function(driver):
    kernel = driver.kernel(ctypes.c_void_p, ctypes.c_int32)
    handle = kernel._handle.value
    assert kernel.layout == ((0, 8), (8, 4)) and kernel.fallback is None
    assert driver.queries == [(handle, 0), (handle, 1), (handle, 2)]
    for _ in range(3):
        kernel((1,), (1,), (_Array(1), 2))
    assert len(driver.queries) == 3


def test_parameter_layout_without_a_current_context_gets_one():
    """A worker thread with no current context: CUDA_ERROR_INVALID_CONTEXT once, cudaFree(0),
    asked again. Any other error or an impossible table: no layout (the kernel falls back)."""
    freed, answers = [], [201, 0, 1]
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(free=freed.append)))

    def info(handle, index, offset, size):
        status = answers.pop(0)
        if status == 0:
            offset.value, size.value = 0, 8
        return status

    with pytest.MonkeyPatch.context() as m:
        m.setitem(sys.modules, "cupy", fake)
        assert cuda._parameter_layout(info, ctypes.c_void_p(1)) == ((0, 8),)
    assert freed == [0]
    with pytest.raises(cuda._NoLayout, match="cuFuncGetParamInfo failed with CUDA error 500"):
        cuda._parameter_layout(lambda *a: 500, ctypes.c_void_p(1))
    table = iter([(0, 8), (4, 4)])

    def overlapping(handle, index, offset, size):
        try:
            offset.value, size.value = next(table)
        except StopIteration:
            return 1
        return 0

    with pytest.raises(cuda._NoLayout, match="overlap"):
        cuda._parameter_layout(overlapping, ctypes.c_void_p(1))


def test_parameter_layout_from_the_count_asks_nothing_past_the_last_parameter():
    """Issue #20: compute-sanitizer reported the query past the last parameter (how drivers
    without cuFuncGetParamCount tell the count) as an API error on every case. Where the driver
    has it, the layout asks the count first and nothing beyond it."""
    table = [(0, 8), (8, 4), (16, 8)]
    asked = []

    def count(handle, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_size_t))[0] = len(table)
        return 0

    def info(handle, index, offset, size):
        asked.append(index)
        if index >= len(table):
            return 1  # CUDA_ERROR_INVALID_VALUE
        offset.value, size.value = table[index]
        return 0

    assert cuda._parameter_layout(info, ctypes.c_void_p(1), count) == tuple(table)
    assert asked == [0, 1, 2]
    asked.clear()
    assert cuda._parameter_layout(info, ctypes.c_void_p(1)) == tuple(table)
    assert asked == [0, 1, 2, 3]  # without the count: one query past the end
    with pytest.raises(cuda._NoLayout, match="cuFuncGetParamCount failed with CUDA error 500"):
        cuda._parameter_layout(info, ctypes.c_void_p(1), lambda *a: 500)


# -- streams, errors, contexts --------------------------------------------------------------------


def test_the_current_stream_is_asked_at_every_launch(driver):
    """The stream changes per thread and with every ``with stream:``: each launch asks CuPy
    (its public get_current_stream); the null stream is passed as NULL."""
    kernel = driver.kernel(ctypes.c_int32)
    for ptr in (0x5EED, 0, 0xBEEF, 0x5EED, 0):
        driver.stream.ptr = ptr
        kernel((1,), (32,), (np.int32(1),))
    assert [launch["stream"] for launch in driver.launches] == [0x5EED, None, 0xBEEF, 0x5EED,
                                                                None]


def test_a_failed_launch_raises_the_driver_error(driver):
    driver.status["value"] = 701  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(_DriverError):
        driver.kernel(ctypes.c_int32)((1,), (32,), (np.int32(1),))


def test_a_thread_without_a_context_gets_one_and_launches_again(driver):
    """A Dask worker thread that has made no CUDA runtime call has no current context: the
    driver says CUDA_ERROR_INVALID_CONTEXT, cudaFree(0) binds the device's, the launch is
    made again with the same arguments."""
    driver.status["then"] = [201]
    kernel = driver.kernel(ctypes.c_int32)  # kept: its buffer holds the arguments read back
    kernel((1,), (32,), (np.int32(9),))
    assert driver.freed == [0]
    first, again = driver.launches
    assert first == again and _argument(again, 0, ctypes.c_int32) == 9


# -- falling back to CuPy's launch: counted, warned once, an error in the tests -------------------


def test_the_test_suite_makes_a_fallback_an_error():
    assert os.environ[cuda.FALLBACK_ENV] == "error"


@pytest.mark.parametrize("missing", ["no-driver", "no-param-info", "no-handle"])
def test_a_fallback_launches_through_cupy_counted_and_warned_once(driver, monkeypatch, missing):
    if missing == "no-handle":
        raw = _Raw()
        del raw.kernel
        reason = "CuPy 0.fake gives no function handle"
    else:
        reason = {"no-driver": "the CUDA driver library libcuda.so.1 was not found",
                  "no-param-info": "the CUDA driver (CUDA 12.2) has no cuFuncGetParamInfo"}[missing]
        monkeypatch.setattr(cuda, "_driver", lambda: cuda._Driver(missing=reason + ", ..."))
        raw = _Raw()
    kernel = cuda.Kernel(raw, "echo<int>")
    assert kernel.layout is None and kernel.fallback.startswith(reason)
    with pytest.raises(LaunchFallbackError, match=r"kernel echo<int> would launch through "
                       r"CuPy's RawKernel, not chunkernels' driver launch: " + re.escape(reason)):
        kernel((1,), (32,), (np.int32(1),))
    assert not raw.calls
    monkeypatch.setenv(cuda.FALLBACK_ENV, "warn")
    monkeypatch.setattr(cuda, "_CUPY_LAUNCHES", {})
    before = cuda.launch_counts()
    with pytest.warns(LaunchFallbackWarning, match="kernels launch through CuPy's RawKernel: "
                      + re.escape(reason)):
        kernel((1,), (32,), (np.int32(1),), shared_mem=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason: no second warning
        kernel((2,), (64,), (np.int32(2),))
    assert raw.calls == [((1,), (32,), (np.int32(1),), 8), ((2,), (64,), (np.int32(2),), 0)]
    after = cuda.launch_counts()
    assert after["driver"] == before["driver"] and after["cupy"] == 2
    assert after["fallback_reasons"] == {kernel.fallback: 2}
    monkeypatch.setenv(cuda.FALLBACK_ENV, "loud")
    with pytest.raises(ValueError, match="CHUNKERNELS_LAUNCH_FALLBACK='loud' is not understood"):
        kernel((1,), (32,), (np.int32(1),))


def test_launch_through_cupy_on_request_is_counted_not_warned(driver, monkeypatch):
    """``LAUNCH_THROUGH_CUPY`` (the benchmarks' comparison rows) launches through CuPy with the
    same arguments; no warning, not a fallback."""
    monkeypatch.setattr(cuda, "_CUPY_LAUNCHES", {})
    kernel = driver.kernel(ctypes.c_int32)
    monkeypatch.setattr(cuda, "LAUNCH_THROUGH_CUPY", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel((2,), (64,), (np.int32(2),), shared_mem=8)
    assert kernel.raw.calls == [((2,), (64,), (np.int32(2),), 8)] and not driver.launches
    assert cuda.launch_counts()["cupy"] == 1
    assert cuda.launch_counts()["fallback_reasons"] == {}


def test_launch_counts_count_each_driver_launch(driver):
    kernel = driver.kernel(ctypes.c_int32)
    before = cuda.launch_counts()
    assert cuda.launch_counts() == before  # reading does not count
    for n in range(5):
        kernel((1,), (1,), (n,))
    assert cuda.launch_counts()["driver"] == before["driver"] + 5
    threads = [threading.Thread(target=lambda: [kernel((1,), (1,), (n,)) for n in range(200)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cuda.launch_counts()["driver"] == before["driver"] + 805


# -- the GIL: held, released, or decided per thread -----------------------------------------------


def test_the_gil_setting_picks_the_launch_function(driver, monkeypatch):
    """True: ctypes.PyDLL's function (keeps the GIL); False: ctypes.CDLL's (releases it);
    "auto" on a thread that is no Dask worker's: held."""
    kernel = driver.kernel(ctypes.c_int32)
    for setting, holds in ((True, True), (False, False), ("auto", True)):
        monkeypatch.setattr(cuda, "LAUNCH_HOLDS_GIL", setting)
        kernel((1,), (1,), (1,))
        assert driver.launches[-1]["holds"] is holds
        assert cuda.launch_holds_gil() is holds


def test_auto_releases_the_gil_on_a_distributed_workers_threads(driver, monkeypatch):
    """Decided once per thread: a thread running a worker's task releases it (its launches
    must not stall the worker's event loop), any other thread holds it."""
    kernel = driver.kernel(ctypes.c_int32)
    worker = {"on": True}

    def get_worker():
        if not worker["on"]:
            raise ValueError("No worker found")
        return object()

    monkeypatch.setitem(sys.modules, "distributed", types.SimpleNamespace(get_worker=get_worker))
    seen = {}

    def task(label):
        kernel((1,), (1,), (1,))
        seen[label] = (driver.launches[-1]["holds"], cuda.launch_holds_gil())
        worker["on"] = False  # the thread's decision is made: it stays
        kernel((1,), (1,), (1,))
        seen[label + " again"] = driver.launches[-1]["holds"]

    for label, on in (("worker", True), ("plain", False)):
        worker["on"] = on
        t = threading.Thread(target=task, args=(label,))
        t.start()
        t.join()
    assert seen == {"worker": (False, False), "worker again": False,
                    "plain": (True, True), "plain again": True}


def test_auto_on_a_real_distributed_worker():
    """On a distributed worker's task thread the launches release the GIL; under the local
    threaded scheduler, in the same process, they hold it."""
    import dask
    from distributed import Client, LocalCluster

    def policy(_):
        return cuda.launch_holds_gil()

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as local, Client(local) as client:
        assert client.submit(policy, 1).result() is False
        assert dask.delayed(policy)(2).compute(scheduler="threads") is True
    assert policy(3) is True


@pytest.mark.parametrize("value, setting", [("0", False), ("false", False), ("OFF", False),
                                            ("1", True), ("yes", True), ("auto", "auto"),
                                            (None, "auto")])
def test_the_environment_variable_sets_the_policy(value, setting):
    """CHUNKERNELS_LAUNCH_HOLDS_GIL reaches every process that imports chunkernels (Dask's
    worker processes too): checked in a fresh interpreter, which decides without importing
    distributed."""
    code = ("import sys; from chunkernels import cuda; print(repr(cuda.LAUNCH_HOLDS_GIL)); "
            "cuda.launch_holds_gil(); print('distributed' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "CHUNKERNELS_LAUNCH_HOLDS_GIL"}
    if value is not None:
        env["CHUNKERNELS_LAUNCH_HOLDS_GIL"] = value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env)
    assert out.stdout.split() == [repr(setting), "False"]


def test_an_unknown_environment_value_is_refused():
    code = "import chunkernels.cuda"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False,
                         env={**os.environ, "CHUNKERNELS_LAUNCH_HOLDS_GIL": "sometimes"})
    assert out.returncode != 0
    assert ("CHUNKERNELS_LAUNCH_HOLDS_GIL='sometimes' is not understood; use 1 (launches hold "
            "the GIL), 0 (they release it) or auto") in out.stderr


# -- on the device --------------------------------------------------------------------------------

_ECHO = r"""
struct Pair { int a; double b; };

extern "C" __global__ void echo(const float* x, signed char a, double b, int c, bool d,
                                unsigned long long e, float f, short g, long long h, Pair p,
                                unsigned char i, unsigned short j, int k, float l, bool m,
                                double* out)
{
    out[0] = x[1]; out[1] = a; out[2] = b; out[3] = c; out[4] = d;
    out[5] = (double)(e >> 40); out[6] = f; out[7] = g; out[8] = (double)h;
    out[9] = p.a; out[10] = p.b; out[11] = i; out[12] = j; out[13] = k; out[14] = l; out[15] = m;
}
"""
_PAIR = np.dtype({"names": ["a", "b"], "formats": [np.int32, np.float64], "offsets": [0, 8],
                  "itemsize": 16})
_ECHO_WANT = [1, -3, 2.5, -7, 1, 5, 0.25, -300, 41, 12, -0.5, 200, 65000, -9, 0.125, 1]


def _echo_args(cp):
    x = cp.arange(4, dtype=cp.float32)
    pair = np.array([(12, -0.5)], dtype=_PAIR)
    return (x, np.int8(-3), np.float64(2.5), np.int32(-7), np.bool_(True), np.uint64(5 << 40),
            np.float32(0.25), np.int16(-300), np.int64(41), pair, np.uint8(200),
            np.uint16(65000), -9, 0.125, True)


@pytest.mark.gpu
def test_every_argument_kind_on_the_device():
    """The driver's layout of a kernel with every kind of parameter (a struct by value among
    them) is C's; the kernel reads back every argument; a Python int and float reach an int
    and a float parameter as such (CuPy would pass a long long and a double)."""
    cp = cuda.cupy()
    raw = cp.RawKernel(_ECHO, "echo")
    kernel = cuda.Kernel(raw)
    assert kernel.fallback is None, kernel.fallback
    c = ctypes
    pair = type("Pair", (c.Structure,), {"_fields_": [("a", c.c_int32), ("b", c.c_double)]})
    assert kernel.layout == _layout(c.c_void_p, c.c_int8, c.c_double, c.c_int32, c.c_bool,
                                    c.c_uint64, c.c_float, c.c_int16, c.c_int64, pair, c.c_uint8,
                                    c.c_uint16, c.c_int32, c.c_float, c.c_bool, c.c_void_p)
    got = cp.zeros(16, dtype=cp.float64)
    before = cuda.launch_counts()
    kernel((1,), (1,), (*_echo_args(cp), got))
    np.testing.assert_array_equal(got.get(), _ECHO_WANT)
    assert cuda.launch_counts()["driver"] == before["driver"] + 1
    # CuPy's launch of the arguments it passes as the kernel reads them (not the Python int
    # and float, which it widens) agrees
    args = _echo_args(cp)[:-3]
    want = cp.zeros(16, dtype=cp.float64)
    mine = cp.zeros(16, dtype=cp.float64)
    raw((1,), (1,), (*args, np.int32(-9), np.float32(0.125), np.bool_(True), want))
    kernel((1,), (1,), (*args, np.int32(-9), np.float32(0.125), np.bool_(True), mine))
    np.testing.assert_array_equal(mine.get(), want.get())


@pytest.mark.gpu
def test_mismatches_raise_on_the_device_and_launch_nothing():
    cp = cuda.cupy()
    kernel = cuda.Kernel(cp.RawKernel(_ECHO, "echo"))
    out = cp.zeros(16, dtype=cp.float64)
    args = list(_echo_args(cp))
    args[3] = np.int64(-7)  # an 8-byte value for the int parameter
    with pytest.raises(KernelArgumentError, match="kernel echo: argument 3 is a numpy.int64 of "
                       "8 bytes, but parameter 3 of the compiled function is 4 bytes"):
        kernel((1,), (1,), (*args, out))
    with pytest.raises(KernelArgumentError, match="takes 16 arguments"):
        kernel((1,), (1,), tuple(_echo_args(cp)))
    args = list(_echo_args(cp))
    args[9] = np.zeros(1, np.dtype((np.void, 12)))  # a struct of another size
    with pytest.raises(KernelArgumentError, match="argument 9 is a numpy.ndarray of 12 bytes"):
        kernel((1,), (1,), (*args, out))
    cp.cuda.Device().synchronize()
    assert not out.any()


_SPIN = r"""
extern "C" __global__ void spin_then_write(long long ns, float value, float* out, int n)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)ns);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value * i;
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["stream", "external", "torch"])
def test_launches_go_to_the_current_stream(kind):
    """A launch goes to CuPy's current stream: a CuPy stream made current with ``with``, an
    external stream (a raw handle, as torch's), a torch stream. The proof: a long kernel
    launched there leaves that non-blocking stream busy, and its result is there after the
    stream alone is synchronised."""
    cp = cuda.cupy()
    kernel = cuda.Kernel(cp.RawKernel(_SPIN, "spin_then_write"))
    owned = None
    if kind == "stream":
        stream = cp.cuda.Stream(non_blocking=True)
    elif kind == "external":
        owned = cp.cuda.runtime.streamCreateWithFlags(cp.cuda.runtime.streamNonBlocking)
        stream = cp.cuda.ExternalStream(owned)
    else:
        torch = pytest.importorskip("torch")
        torch_stream = torch.cuda.Stream()
        stream = cp.cuda.ExternalStream(torch_stream.cuda_stream)
    try:
        out = cp.zeros(256, dtype=cp.float32)
        cp.cuda.Device().synchronize()
        with stream:
            assert cp.cuda.get_current_stream().ptr == stream.ptr != 0
            kernel((1,), (256,), (np.int64(50_000_000), 2.0, out, 256))
            assert not stream.done  # the 50 ms kernel is queued on this stream
        stream.synchronize()
        np.testing.assert_array_equal(out.get(stream=stream), 2.0 * np.arange(256))
    finally:
        if owned is not None:
            cp.cuda.runtime.streamDestroy(owned)


_FILL = r"""
template <typename T>
__global__ void fill(T* out, T value, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value + (T)i;
}
"""


@pytest.fixture
def fill_kernel(monkeypatch):
    """``cuda.function("launch_test.cu", "fill<T>")`` compiles the template above (a library
    source's name: no registered kernel, the source read through ``cuda.source``)."""
    source = cuda.source
    monkeypatch.setattr(cuda, "source",
                        lambda kernel: _FILL if kernel == "launch_test.cu" else source(kernel))
    yield lambda dtype: cuda.function("launch_test.cu", f"fill<{cuda.cuda_type(dtype)}>")
    cuda.forget("launch_test.cu")


@pytest.mark.gpu
def test_compiled_functions_are_cached_per_device(fill_kernel):
    cp = cuda.cupy()
    kernel = fill_kernel(np.float32)
    assert fill_kernel(np.float32) is kernel and fill_kernel(np.int32) is not kernel
    assert kernel.name == "fill<float>" and kernel.layout == ((0, 8), (8, 4), (12, 4))
    out = cp.empty(100, dtype=cp.float32)
    kernel((1,), (128,), (out, 0.5, 100))
    np.testing.assert_array_equal(out.get(), 0.5 + np.arange(100, dtype=np.float32))


@pytest.mark.multigpu
def test_each_device_has_its_own_compiled_function(fill_kernel):
    """The same name expression on device 1 is another function (another handle, its own
    per-thread buffers), and launches there."""
    cp = cuda.cupy()
    on_0 = fill_kernel(np.float64)
    with cp.cuda.Device(1):
        on_1 = fill_kernel(np.float64)
        assert on_1 is not on_0 and on_1._handle.value != on_0._handle.value
        assert on_1.layout == on_0.layout
        out = cp.empty(64, dtype=cp.float64)
        on_1((1,), (64,), (out, 2.0, 64))
        np.testing.assert_array_equal(out.get(), 2.0 + np.arange(64))
    out = cp.empty(64, dtype=cp.float64)
    on_0((1,), (64,), (out, 3.0, 64))
    np.testing.assert_array_equal(out.get(), 3.0 + np.arange(64))


@pytest.mark.gpu
@pytest.mark.parametrize("setting", [True, False, "auto"])
def test_eight_threads_launching_at_once(fill_kernel, monkeypatch, setting):
    """Eight threads share one Kernel and launch 200 times each, holding or releasing the GIL;
    every result equals NumPy's."""
    cp = cuda.cupy()
    monkeypatch.setattr(cuda, "LAUNCH_HOLDS_GIL", setting)
    kernel = fill_kernel(np.float32)
    outs = [[cp.empty(300, dtype=cp.float32) for _ in range(200)] for _ in range(8)]
    start = threading.Barrier(8)
    errors = []

    def launch(t):
        try:
            start.wait()
            for k, out in enumerate(outs[t]):
                kernel((3,), (128,), (out, np.float32(1000 * t + k), np.int32(300)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=launch, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    cp.cuda.Device().synchronize()
    for t in range(8):
        got = cp.stack(outs[t]).get()
        want = (1000 * t + np.arange(200, dtype=np.float32))[:, None] + np.arange(300)
        np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.gpu
def test_a_fallback_on_the_device_is_counted(monkeypatch):
    """Where the driver cannot give the layout, CuPy launches: the same result, counted by
    reason, warned once; under the tests' setting, an error."""
    cp = cuda.cupy()
    monkeypatch.setattr(cuda, "_driver", lambda: cuda._Driver(missing="a test's old driver"))
    kernel = cuda.Kernel(cp.RawKernel(_ECHO, "echo"))
    out = cp.zeros(16, dtype=cp.float64)
    args = (*_echo_args(cp)[:-3], np.int32(-9), np.float32(0.125), np.bool_(True), out)
    with pytest.raises(LaunchFallbackError, match="a test's old driver"):
        kernel((1,), (1,), args)
    monkeypatch.setenv(cuda.FALLBACK_ENV, "warn")
    before = cuda.launch_counts()
    with pytest.warns(LaunchFallbackWarning, match="a test's old driver"):
        kernel((1,), (1,), args)
    np.testing.assert_array_equal(out.get(), _ECHO_WANT)
    after = cuda.launch_counts()
    assert after["cupy"] == before["cupy"] + 1 and after["driver"] == before["driver"]
    assert after["fallback_reasons"]["a test's old driver"] == \
        before["fallback_reasons"].get("a test's old driver", 0) + 1
