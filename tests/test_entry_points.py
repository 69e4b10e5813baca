"""Third-party kernels through the ``chunkernels.kernels`` entry-point group.

Each test installs a fake distribution in a temporary folder on ``sys.path`` (a module and a
``*.dist-info`` folder, which is all ``importlib.metadata`` looks at) and makes the registry load
entry points again.
"""

from __future__ import annotations

import sys
import uuid
import warnings

import dask.array as da
import numpy as np
import pytest

import chunkernels
from chunkernels import _registry
from chunkernels.testing import assert_close

PLUGIN = '''
import numpy as np
from chunkernels import KernelSpec


def negate(x):
    return np.negative(x)


def twice(x):
    return np.add(x, x)


SPEC = KernelSpec(name="plugin_negate", cpu=negate, summary="-x")


def more():
    return [KernelSpec(name="plugin_twice", cpu=twice), KernelSpec(name="plugin_twice2", cpu=twice)]


CLASH = KernelSpec(name="broadcast_add", cpu=np.add, operands=("other",))
NOT_A_SPEC = 42
'''


@pytest.fixture
def install_plugin(tmp_path, monkeypatch):
    """``install_plugin({name: "module:attr"})`` installs a distribution publishing these entry
    points, with the module above; returns the module name."""

    def install(entries):
        module = f"ck_plugin_{uuid.uuid4().hex[:8]}"  # fresh name: no stale sys.modules entry
        (tmp_path / f"{module}.py").write_text(PLUGIN)
        info = tmp_path / f"{module}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        lines = [f"{name} = {target.replace('MODULE', module)}" for name, target in entries.items()]
        (info / "entry_points.txt").write_text("[chunkernels.kernels]\n" + "\n".join(lines) + "\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, module, raising=False)
        _registry._loaded["entry_points"] = False  # the autouse fixture restores it
        return module

    yield install


def test_entry_point_spec_is_registered_and_applies(install_plugin):
    module = install_plugin({"negate": "MODULE:SPEC"})
    assert "plugin_negate" in chunkernels.registered()
    assert "broadcast_add" in chunkernels.registered()
    assert _registry._ORIGIN["plugin_negate"] == f"entry point 'negate' ({module}:SPEC)"
    x = np.arange(6.0).reshape(2, 3)
    assert_close(chunkernels.apply(x, "plugin_negate"), -x)
    assert_close(chunkernels.apply(da.from_array(x, chunks=1), "plugin_negate").compute(), -x)


def test_entry_points_load_on_first_lookup(install_plugin):
    install_plugin({"negate": "MODULE:SPEC"})
    # get() of an unknown name loads the entry points before giving up; registered() is not needed
    assert chunkernels.get("plugin_negate").summary == "-x"


def test_entry_point_callable_returning_several_specs(install_plugin):
    install_plugin({"more": "MODULE:more"})
    names = chunkernels.registered()
    assert {"plugin_twice", "plugin_twice2"} <= set(names)
    assert_close(chunkernels.apply(np.arange(3), "plugin_twice2"), np.array([0, 2, 4]))


@pytest.mark.parametrize("target, error", [
    ("ck_plugin_missing:SPEC", r"ModuleNotFoundError: No module named 'ck_plugin_missing'"),
    ("MODULE:NOPE", r"AttributeError: .*NOPE"),
    ("MODULE:NOT_A_SPEC", r"TypeError: 'int' object is not iterable"),
    ("MODULE:CLASH", r"DuplicateKernelError: a kernel named 'broadcast_add' is already registered "
                     r"\(from chunkernels\.kernels\.broadcast_add\).*replace=True"),
])
def test_broken_entry_point_warns_and_the_rest_still_loads(install_plugin, target, error):
    module = install_plugin({"broken": target, "negate": "MODULE:SPEC"})
    shown = target.replace("MODULE", module)
    with pytest.warns(RuntimeWarning, match=rf"could not load chunkernels kernels from entry point "
                                            rf"'broken' \({shown}\): {error}"):
        names = chunkernels.registered()
    assert "plugin_negate" in names and "broadcast_add" in names
    assert chunkernels.get("broadcast_add").cpu.__module__ == "chunkernels.kernels.broadcast_add"


def test_entry_points_load_once(install_plugin):
    install_plugin({"broken": "ck_plugin_missing:SPEC"})
    with pytest.warns(RuntimeWarning):
        chunkernels.registered()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second listing must not warn (nor load) again
        chunkernels.registered()
        with pytest.raises(chunkernels.UnknownKernelError):
            chunkernels.get("plugin_negate")
