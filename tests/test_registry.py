"""The kernel registry: listing, lookup, registration, and KernelSpec validation."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

import chunkernels
from chunkernels import KernelSpec, _registry
from chunkernels._errors import DuplicateKernelError, KernelSpecError, UnknownKernelError
from chunkernels._registry import _ORIGIN, ensure_registered


def _negate(x):
    return np.negative(x)


# -- listing and lookup ---------------------------------------------------------------------------


def test_registered_lists_builtins_sorted():
    names = chunkernels.registered()
    assert "broadcast_add" in names
    assert names == sorted(names)


def test_kernels_is_the_subpackage_and_calling_it_is_deprecated():
    """``chunkernels.kernels`` names the built-ins' subpackage; calling it, the former name of
    ``registered()``, still lists the kernels and says it is deprecated."""
    import chunkernels.kernels.broadcast_add  # noqa: F401 - what loading the built-ins does

    assert isinstance(chunkernels.kernels, types.ModuleType)
    with pytest.warns(DeprecationWarning, match=r"chunkernels\.kernels\(\) is deprecated: call "
                                                r"chunkernels\.registered\(\)"):
        names = chunkernels.kernels()
    assert names == chunkernels.registered() and "broadcast_add" in names


# -- built-in kernels are found, not listed ------------------------------------------------------


def test_every_public_module_of_the_kernels_package_is_a_registered_builtin():
    """A kernel module added to chunkernels/kernels/ is registered with no list to extend, under
    its module's name ("one kernel, one place, four names"); helpers start with an underscore."""
    folder = Path(chunkernels.kernels.__file__).parent
    on_disk = sorted({p.stem for p in folder.glob("*.py")} |
                     {p.parent.name for p in folder.glob("*/__init__.py")})
    expected = [name for name in on_disk if not name.startswith("_")]
    assert list(chunkernels.kernels.builtin_modules()) == expected
    for name in expected:
        assert chunkernels.get(name).name == name
        assert _ORIGIN[name] == f"chunkernels.kernels.{name}"


def test_a_public_module_without_spec_in_the_kernels_package_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "not_a_kernel.py").write_text("HELPER = 1\n")
    (tmp_path / "_helper.py").write_text("raise AssertionError('helpers are not imported')\n")
    monkeypatch.setattr(chunkernels.kernels, "__path__", [*chunkernels.kernels.__path__,
                                                          str(tmp_path)])
    assert "not_a_kernel" in chunkernels.kernels.builtin_modules()
    assert "_helper" not in chunkernels.kernels.builtin_modules()
    try:
        with pytest.raises(KernelSpecError, match=r"chunkernels\.kernels\.not_a_kernel has no "
                                                  r"SPEC .*rename it _not_a_kernel\.py"):
            list(chunkernels.kernels.builtin_specs())
    finally:
        sys.modules.pop("chunkernels.kernels.not_a_kernel", None)
        vars(chunkernels.kernels).pop("not_a_kernel", None)


def test_the_registry_needs_the_builtins_provider_from_the_package(monkeypatch):
    monkeypatch.setattr(_registry, "_builtin_provider", None)
    _registry._REGISTRY.clear()  # the autouse fixture restores the registry
    _registry._loaded["builtins"] = False
    with pytest.raises(RuntimeError, match=r"set_builtin_provider.*after `import chunkernels`"):
        chunkernels.get("broadcast_add")


def test_importing_chunkernels_imports_no_kernel_until_one_is_looked_up():
    code = ("import sys, chunkernels\n"
            "def loaded():\n"
            "    return sorted(m for m in sys.modules if m.startswith('chunkernels.kernels.'))\n"
            "print(loaded())\n"
            "chunkernels.get('broadcast_add')\n"
            "kernels = {m.split('.')[2] for m in loaded()}  # a package's modules count once\n"
            "print(kernels >= set(chunkernels.kernels.builtin_modules()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


def test_get_returns_the_builtin_spec():
    spec = chunkernels.get("broadcast_add")
    assert spec.name == "broadcast_add"
    assert spec.source == "broadcast_add.cu"
    assert spec.operands == ("other",)
    assert spec.gpu is not None


@pytest.mark.parametrize("name", chunkernels.registered())
def test_every_builtin_spec_pickles_by_reference(name):
    """A spec travels inside every task of its graph: the standard pickle must take it (no
    lambda nor closure, which cloudpickle would pickle by value, task by task)."""
    import pickle

    spec = chunkernels.get(name)
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec  # the same functions, found by their names


def test_always_is_a_constant_result_dtype_that_pickles():
    import pickle

    f = chunkernels.always(np.bool_)
    assert f(np.dtype(np.float64), np.dtype(np.int8), mode="x") == np.dtype(np.bool_)
    assert pickle.loads(pickle.dumps(f)) == f
    assert repr(f) == "always(bool)"
    assert f != chunkernels.always(np.float64)


def test_describe_shows_every_fact():
    text = chunkernels.describe("broadcast_add")
    rows = dict(line.split(None, 1) if not line.startswith("cpu reference") else
                ("cpu reference", line[len("cpu reference"):].strip())
                for line in text.splitlines())
    assert rows["name"] == "broadcast_add"
    assert rows["kind"] == "raw"
    assert rows["source"] == "kernels_cuda/broadcast_add.cu"
    assert rows["dtypes"] == "float32, float64, int32, int64"
    assert rows["halo"] == "0"
    assert rows["operands"] == "other"
    assert rows["gpu"] == "yes"
    assert rows["cpu reference"] == "chunkernels.kernels.broadcast_add.reference"


def test_describe_user_kernel(moving_sum):
    text = chunkernels.describe("moving_sum")
    assert "halo           radius (last axis)" in text
    assert "no (CPU reference only)" in text
    assert "source         -" in text
    inline = chunkernels.register(name="inline_k", cpu=_negate, code="__global__ void k() {}")
    assert "source         inline" in inline.describe()


def test_unknown_kernel_is_a_keyerror_with_close_matches():
    with pytest.raises(UnknownKernelError, match=r"no kernel named 'broadcast_ad'; did you mean "
                                                 r"'broadcast_add'\? registered kernels: ") as info:
        chunkernels.get("broadcast_ad")
    assert isinstance(info.value, KeyError)
    # str() shows the message as written, not KeyError's quoted repr
    assert str(info.value).startswith("no kernel named")


def test_unknown_kernel_without_close_match_lists_the_registry():
    with pytest.raises(UnknownKernelError, match="no kernel named 'zzz'; registered kernels: .*"
                                                 "broadcast_add") as info:
        chunkernels.get("zzz")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("name", ["../x", "a/b", "x.cu", "kernels_cuda/broadcast_add.cu", "", "1x"])
def test_paths_are_not_kernel_names(name):
    with pytest.raises(UnknownKernelError, match=r"is not a kernel name: .*never paths"):
        chunkernels.get(name)
    with pytest.raises(KernelSpecError, match=r"is not an identifier: .*never paths"):
        KernelSpec(name=name, cpu=_negate)


def test_non_string_name_is_rejected():
    with pytest.raises(UnknownKernelError, match="None is not a kernel name"):
        chunkernels.get(None)


# -- registration ---------------------------------------------------------------------------------


def test_duplicate_name_error_says_how_to_fix_it():
    spec = KernelSpec(name="broadcast_add", cpu=np.add, operands=("other",))
    with pytest.raises(DuplicateKernelError, match=r"'broadcast_add' is already registered "
                                                   r"\(from chunkernels\.kernels\.broadcast_add\)"
                                                   r".*replace=True.*"
                                                   r"chunkernels\.unregister\('broadcast_add'\)"):
        chunkernels.register(spec)
    assert chunkernels.get("broadcast_add").cpu.__name__ == "reference"


def test_register_replace_overrides_and_unregister_removes():
    mine = KernelSpec(name="broadcast_add", cpu=np.add, operands=("other",), summary="mine")
    assert chunkernels.register(mine, replace=True, origin="this test") is mine
    assert chunkernels.get("broadcast_add") is mine
    assert _ORIGIN["broadcast_add"] == "this test"
    assert chunkernels.unregister("broadcast_add") is mine
    assert "broadcast_add" not in chunkernels.registered()
    with pytest.raises(UnknownKernelError, match="no kernel named 'broadcast_add'"):
        chunkernels.get("broadcast_add")
    with pytest.raises(UnknownKernelError):
        chunkernels.unregister("broadcast_add")


def test_a_replaced_kernel_gets_new_keys_so_a_cluster_never_returns_the_old_results():
    """A cluster that holds the results of a kernel since replaced under the same name must
    not hand them back for the new kernel: its keys differ (the spec's serial, not its name)."""
    from chunkernels import cluster

    x = da.from_array(np.zeros((8, 6)), chunks=(4, 6))
    first = chunkernels.register(KernelSpec(name="plus_k", cpu=lambda b: b + 1))
    again = chunkernels.apply(x, "plus_k")
    assert again.name == chunkernels.apply(x, "plus_k").name  # one spec: the same keys
    with cluster.client(gpus=0, dashboard_address=None) as c:
        held = c.persist(chunkernels.apply(x, "plus_k"))
        chunkernels.register(KernelSpec(name="plus_k", cpu=lambda b: b + 2), replace=True)
        z = chunkernels.apply(x, "plus_k")
        assert z.name != held.name
        np.testing.assert_array_equal(z.compute(), np.full((8, 6), 2.0))
        np.testing.assert_array_equal(held.compute(), np.full((8, 6), 1.0))
    assert _registry.spec_serial(first) != _registry.spec_serial(chunkernels.get("plus_k"))
    assert _registry.spec_serial(first) == _registry.spec_serial(first)


def test_a_task_still_running_does_not_bring_back_a_kernel_unregistered_here():
    """A block function of a kernel that was unregistered (or replaced) in this process runs
    with its own spec and leaves the registry alone (a thread of the local scheduler may still
    run a task of a failed graph); one unpickled from elsewhere (a worker) registers its spec."""
    import pickle

    spec = chunkernels.register(name="negate", cpu=_negate, dtypes=["float64"])
    fn = chunkernels.blockwise("negate")
    chunkernels.unregister("negate")
    np.testing.assert_array_equal(fn(np.ones(3)), -np.ones(3))
    assert "negate" not in chunkernels.registered()
    mine = chunkernels.register(name="negate", cpu=np.negative, dtypes=["float64"])  # no clash
    np.testing.assert_array_equal(fn(np.ones(3)), -np.ones(3))
    assert chunkernels.get("negate") is mine
    chunkernels.unregister("negate")
    arrived = pickle.loads(pickle.dumps(fn))  # as a worker receives it: a spec new here
    assert arrived.spec is not spec
    np.testing.assert_array_equal(arrived(np.ones(3)), -np.ones(3))
    assert chunkernels.get("negate") is arrived.spec
    assert _ORIGIN["negate"] == "a task sent by the client"


def test_registry_is_restored_between_tests():
    # The autouse fixture in conftest undoes the previous test's unregister.
    assert chunkernels.get("broadcast_add").cpu.__module__ == "chunkernels.kernels.broadcast_add"


def test_register_with_keyword_fields():
    spec = chunkernels.register(name="negate", cpu=_negate, dtypes=["float64"], summary="-x")
    assert isinstance(spec, KernelSpec)
    assert chunkernels.get("negate") is spec
    assert spec.dtypes == ("float64",)  # lists become tuples: the spec stays hashable
    hash(spec)
    assert _ORIGIN["negate"] == __name__  # default origin: the CPU reference's module
    np.testing.assert_array_equal(chunkernels.apply(np.arange(3.0), "negate"), [-0.0, -1.0, -2.0])


@pytest.mark.parametrize("fields, message", [
    ({"name": "my_add", "gpu": None},
     r"^register\(\) of kernel 'my_add': missing cpu \(a KernelSpec needs name and cpu: the "
     r"kernel's name and its CPU reference, which defines the result\)\. E\.g\. "
     r"chunkernels\.register\(name='my_add', cpu=reference, gpu=dispatch, code=CUDA_SOURCE\), "
     r"where reference\(x, \*operands, \*\*params\) returns the result as a NumPy array$"),
    ({"cpu": _negate}, r"^register\(\) of a kernel without a name: missing name \(a KernelSpec "
                       r"needs name and cpu: .* E\.g\. chunkernels\.register\(name='my_add', "),
    ({}, r"^register\(\) of a kernel without a name: missing name and cpu "),
    ({"name": "k", "cpu": _negate, "halo_depth": 2},
     r"^register\(\) of kernel 'k': unknown KernelSpec field\(s\) 'halo_depth' \(did you mean "
     r"'halo_rule' or 'halo'\?\); the fields are name, cpu, gpu, kind, "),
])
def test_register_names_the_missing_or_unknown_fields(fields, message):
    """Issue #20: ``register()`` without ``cpu=`` raised the dataclass's bare TypeError
    (``KernelSpec.__init__() missing 1 required positional argument: 'cpu'``)."""
    with pytest.raises(TypeError, match=message):
        chunkernels.register(**fields)


def test_unknown_parameter_names_the_kernel_its_parameters_and_a_close_match(moving_sum):
    """Issue #20: an unknown keyword said "validate() got an unexpected keyword argument
    'sigmaa'", naming neither the kernel nor what it takes."""
    x = np.zeros((6, 8))
    takes = (r"gaussian_filter takes sigma \(required\), order, mode, cval, truncate, radius, "
             r"axes, output$")
    unknown = r"^gaussian_filter got unknown parameter 'sigmaa' \(did you mean 'sigma'\?\); "
    for call in (lambda: chunkernels.apply(x, "gaussian_filter", sigma=1, sigmaa=2),
                 lambda: chunkernels.apply(da.from_array(x, chunks=3), "gaussian_filter",
                                           sigma=1, sigmaa=2),
                 lambda: chunkernels.blockwise("gaussian_filter", sigma=1, sigmaa=2).params(2),
                 lambda: chunkernels.pipeline([("gaussian_filter", {"sigma": 1, "sigmaa": 2})])):
        with pytest.raises(TypeError, match=unknown + takes):
            call()
    with pytest.raises(TypeError, match=r"^gaussian_filter needs parameter 'sigma', which has no "
                                        r"default; " + takes[:-1] + r"\. E\.g\. chunkernels\."
                                        r"apply\(x, 'gaussian_filter', sigma=\.\.\.\)$"):
        chunkernels.apply(x, "gaussian_filter")
    with pytest.raises(TypeError, match=r"^threshold got unknown parameters 'valeu' \(did you mean "
                                        r"'value'\?\), 'colour'; threshold takes value, upper$"):
        chunkernels.apply(x, "threshold", valeu=1, colour="red")
    # a validate that takes **params checks its own (moving_sum's names what it got)
    assert chunkernels.get("moving_sum").parameters is None
    with pytest.raises(TypeError, match=r"moving_sum got unexpected parameters \['sigma'\]"):
        chunkernels.apply(x, "moving_sum", sigma=2)


def test_parameters_of_a_kernel_without_validate_are_its_references():
    spec = chunkernels.register(name="scale_by", cpu=lambda x, other, *, factor=2: x * factor,
                                operands=("other",))
    assert spec.parameters == ("factor",)
    with pytest.raises(TypeError, match=r"^scale_by got unknown parameter 'factr' \(did you mean "
                                        r"'factor'\?\); scale_by takes factor$"):
        chunkernels.apply(np.ones(3), "scale_by", np.ones(3), factr=3)
    bare = chunkernels.register(name="negate", cpu=_negate)
    assert bare.parameters == ()
    with pytest.raises(TypeError, match=r"^negate got unknown parameter 'scale'; negate takes no "
                                        r"parameters$"):
        chunkernels.apply(np.ones(3), "negate", scale=2)


def test_register_rejects_spec_and_fields_together_and_non_specs():
    spec = KernelSpec(name="negate", cpu=_negate)
    with pytest.raises(TypeError, match="either a KernelSpec or its fields"):
        chunkernels.register(spec, summary="x")
    with pytest.raises(TypeError, match="register\\(\\) takes a KernelSpec, got str"):
        chunkernels.register("negate")


def test_ensure_registered_adds_a_spec_sent_to_a_worker():
    spec = KernelSpec(name="negate", cpu=_negate)
    ensure_registered(spec)
    assert chunkernels.get("negate") is spec
    assert _ORIGIN["negate"] == "a task sent by the client"
    other = KernelSpec(name="negate", cpu=np.negative)
    ensure_registered(other)  # a name already known keeps its spec
    assert chunkernels.get("negate") is spec


# -- KernelSpec validation ------------------------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"kind": "cuda"}, r"kind='cuda'; expected one of \('raw', 'elementwise', 'reduction'\)"),
    ({"alignment": "left"}, r"alignment='left'; expected one of \('broadcast', 'same'\)"),
    ({"source": "../evil.cu"}, r"source='../evil.cu' must be a bare file name"),
    ({"source": "kernels_cuda/k.cu"}, r"source='kernels_cuda/k.cu' must be a bare file name like "
                                     r"'my_kernel.cu' in kernels_cuda/"),
    ({"source": "k.cpp"}, r"source='k.cpp' must be a bare file name"),
    ({"source": "k.cu", "code": "..."}, r"give either source \(a file in kernels_cuda/\) or code "
                                       r"\(inline\), not both"),
    ({"ndim": (2, 1)}, r"ndim=\(2, 1\) is not a \(min, max\) range"),
    ({"ndim": (-1, None)}, r"ndim=\(-1, None\) is not a \(min, max\) range"),
    ({"operands": ("a/b",)}, r"operand name 'a/b' is not an identifier"),
    ({"gpu": "kernel.cu"}, r"gpu must be a dispatch function or None"),
    ({"cpu": None}, r"cpu must be the CPU reference function"),
    ({"dtypes": ("float32", "flaot64")}, r"dtypes: 'flaot64' is not a NumPy dtype"),
    # values where functions belong, and names where sequences do: refused when registered,
    # not when a Dask graph first calls them
    ({"halo": 2}, r"halo=2 must be a function of the parameters, not a value: e\.g\. "
                  r"halo=lambda ndim, \*\*params: \(2,\) \* ndim"),
    ({"boundary": "reflect"}, r"boundary='reflect' must be a function of the parameters"),
    ({"result_dtype": np.float32}, r"result_dtype=<class 'numpy\.float32'> must be a function"),
    ({"result_dtype": np.dtype("f8")}, r"result_dtype=dtype\('float64'\) must be a function"),
    ({"validate": 3}, r"validate=3 must be a function, or None"),
    ({"supports": True}, r"supports=True must be a function, or None"),
    ({"dtypes": "float32"}, r"dtypes='float32' must be a sequence of names, e\.g\. "
                            r"dtypes=\('float32',\)"),
    ({"operands": "other"}, r"operands='other' must be a sequence of names"),
    ({"ndim": 2}, r"ndim=2; expected a \(min, max\) pair of dimension counts"),
    ({"ndim": (1, 2, 3)}, r"ndim=\(1, 2, 3\); expected a \(min, max\) pair"),
])
def test_kernelspec_validation(fields, message):
    base = {"name": "k", "cpu": _negate}
    with pytest.raises(KernelSpecError, match=rf"kernel 'k': {message}"):
        KernelSpec(**{**base, **fields})


def test_kernelspec_is_frozen():
    spec = KernelSpec(name="k", cpu=_negate)
    with pytest.raises(AttributeError):
        spec.name = "other"


def test_halo_depth_is_checked():
    spec = KernelSpec(name="k", cpu=_negate, halo=lambda ndim, **_: (1,))
    with pytest.raises(KernelSpecError, match=r"halo\(\) returned \(1,\) for ndim=2; expected 2 "
                                              r"non-negative integers"):
        spec.depth(2, {})
    scalar = KernelSpec(name="k", cpu=_negate, halo=lambda ndim, **_: np.int64(2))
    assert scalar.depth(3, {}) == (2, 2, 2)  # one integer means every axis


def test_ndim_text():
    texts = {(0, None): "any", (2, None): ">=2", (2, 2): "2", (1, 3): "1..3"}
    for ndim, text in texts.items():
        assert KernelSpec(name="k", cpu=_negate, ndim=ndim).ndim_text == text


def test_out_dtype_follows_numpy_promotion():
    spec = chunkernels.get("broadcast_add")
    assert spec.out_dtype("int32", ["int64"]) == np.int64
    assert spec.out_dtype("float32", ["int64"]) == np.float64
    assert spec.out_dtype(np.float32, [np.float32]) == np.float32


def test_check_block_reasons_on_numpy_blocks():
    """The GPU path's acceptance rules are plain Python: check them on NumPy blocks."""
    spec = KernelSpec(name="k", cpu=np.add, gpu=np.add, operands=("other",), ndim=(1, 2),
                      supports=lambda x, o: (x.shape[-1] % 2 == 0, "odd rows"))
    assert spec.check_block(np.ones((2, 4), "f4"), np.ones(4, "f4")) == (True, "")
    assert spec.check_block(np.ones((2, 4), "f2"), np.ones(4, "f4")) == (
        False, "x has dtype float16; the GPU path takes float32, float64")
    assert spec.check_block(np.ones((2, 4), "f4"), np.ones(4, "i4")) == (
        False, "other has dtype int32; the GPU path takes float32, float64")
    assert spec.check_block(np.ones((2, 2, 4), "f4"), np.ones(4, "f4")) == (
        False, "x has ndim=3; the GPU path takes 1..2")
    assert spec.check_block(np.ones((2, 3), "f4"), np.ones(3, "f4")) == (False, "odd rows")
    cpu_only = KernelSpec(name="k", cpu=np.add)
    assert cpu_only.check_block(np.ones(3)) == (False, "k has no GPU implementation")


def test_a_replaced_kernel_compiles_its_new_code(monkeypatch):
    """A kernel registered again with new CUDA code: nothing compiled from the old code is
    reused. Registered again with code already compiled, it reuses that; ``cuda.forget`` drops
    all of a kernel's functions (the benchmarks count a cold start's compilations)."""
    from chunkernels import cuda

    compiled = []

    class RawModule:  # stands in for CuPy's: records what NVRTC would compile
        def __init__(self, code, options, name_expressions):
            compiled.append(code)
            self.code = code

        def get_function(self, name):
            return f"{name} from {self.code}"

    device = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))
    fake_cupy = types.SimpleNamespace(RawModule=RawModule, cuda=device)
    monkeypatch.setattr(cuda, "cupy", lambda: fake_cupy)
    monkeypatch.setattr(cuda, "Kernel", lambda raw, name: raw)  # the launcher is not tested here
    monkeypatch.setattr(cuda, "_FUNCTIONS", {})

    spec = chunkernels.KernelSpec(name="recompiled", cpu=np.negative, code="// v1")
    chunkernels.register(spec)
    assert cuda.function("recompiled", "f<float>") == "f<float> from // v1"
    assert cuda.function("recompiled", "f<float>") == "f<float> from // v1"
    chunkernels.register(dataclasses.replace(spec, code="// v2"), replace=True)
    assert cuda.function("recompiled", "f<float>") == "f<float> from // v2"
    chunkernels.unregister("recompiled")
    chunkernels.register(spec)
    assert cuda.function("recompiled", "f<float>") == "f<float> from // v1"
    assert compiled == ["// v1", "// v2"]
    cuda.forget("recompiled")
    assert cuda.function("recompiled", "f<float>") == "f<float> from // v1"
    assert compiled == ["// v1", "// v2", "// v1"]


def test_device_constants_upload_once_per_device_and_value(monkeypatch):
    """cuda.device_constant copies a host array to the current device once per device, dtype and
    value (a stand-in CuPy counts the uploads), and drops the oldest entry past its cap."""
    import types

    from chunkernels import cuda

    uploads, device = [], [0]

    def asarray(a):
        uploads.append(a)
        return a.copy()

    stub = types.SimpleNamespace(asarray=asarray, cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: device[0])))
    monkeypatch.setattr(cuda, "cupy", lambda: stub)
    monkeypatch.setattr(cuda, "_CONSTANTS", {})
    monkeypatch.setattr(cuda, "_MAX_CONSTANTS", 3)
    w = np.array([[0.25, 0.5], [0.75, 1.0]])
    first = cuda.device_constant(w.T, np.float32)  # any layout: uploaded C-ordered
    assert first.flags.c_contiguous and first.dtype == np.float32
    np.testing.assert_array_equal(first, w.T.astype(np.float32))
    assert cuda.device_constant(w.T.copy(), np.float32) is first  # same value: no upload
    assert len(uploads) == 1
    assert cuda.device_constant(w.T, np.float64) is not first  # another dtype
    device[0] = 1
    on_1 = cuda.device_constant(w.T, np.float32)  # another device
    assert on_1 is not first and len(uploads) == 3
    w[0, 0] = 9  # a changed value is another constant
    changed = cuda.device_constant(w.T, np.float32)
    assert changed[0, 0] == 9 and len(uploads) == 4
    assert len(cuda._CONSTANTS) == 3  # the cap: the oldest (device 0, float32) went first
    device[0] = 0
    w[0, 0] = 0.25
    assert cuda.device_constant(w.T, np.float32) is not first and len(uploads) == 5
