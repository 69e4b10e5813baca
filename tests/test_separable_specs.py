"""The separable filters' specs, field by field, against a snapshot (``separable_specs.json``).

The nine filters made of correlate1d passes take their shared fields from one factory
(:func:`chunkernels.kernels.correlate1d.separable_spec`); this test holds every field of every
spec to what it was before the factory existed: values by ``repr``, functions by the name they
are found under (and that name must lead back to the very function the spec holds), and
``describe()`` as printed. A spec changed on purpose is written into the snapshot by running
this file (``PYTHONPATH=$PWD python tests/test_separable_specs.py``); read the diff before
committing it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

import chunkernels

SNAPSHOT = Path(__file__).with_name("separable_specs.json")
FILTERS = ("correlate1d", "convolve1d", "gaussian_filter", "uniform_filter", "sobel", "prewitt",
           "laplace", "gaussian_laplace", "gaussian_gradient_magnitude")


def fingerprint(spec) -> dict[str, str]:
    """Every field of ``spec`` as text (functions by ``module.qualname``), and ``describe()``."""
    fields = {f.name: _text(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
    return {**fields, "describe()": spec.describe()}


def _text(value) -> str:
    if callable(value) and not isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def _found(name: str):
    """The object the dotted ``module.qualname`` ``name`` leads to."""
    module, _, rest = name.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
            break
        except ModuleNotFoundError:
            module, _, head = module.rpartition(".")
            rest = f"{head}.{rest}"
    for part in rest.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", FILTERS)
def test_the_spec_is_the_snapshot(name):
    want = json.loads(SNAPSHOT.read_text())[name]
    spec = chunkernels.get(name)
    got = fingerprint(spec)
    changed = {k: (want.get(k), got.get(k)) for k in want.keys() | got.keys()
               if want.get(k) != got.get(k)}
    assert not changed, (f"{name}'s spec differs from {SNAPSHOT.name} (field: (snapshot, now)); "
                         f"if on purpose, rewrite it by running tests/{Path(__file__).name}:\n"
                         + "\n".join(f"  {k}: {v}" for k, v in sorted(changed.items())))
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if callable(value) and not isinstance(value, type):
            assert _found(_text(value)) is value, (name, field.name)


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps({n: fingerprint(chunkernels.get(n)) for n in FILTERS},
                                   indent=1) + "\n")
    print(f"wrote {SNAPSHOT}")
