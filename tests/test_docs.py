"""The documentation's generated parts: the Kernels navigation comes from the kernel modules.

``docs/hooks.py`` finds the built-in kernel modules with pkgutil (no list), adds a page per
module to the Kernels section of the navigation, and warns (failing ``mkdocs build --strict``)
when a module has no page. The whole strict build runs in CI as ``make docs``.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

import chunkernels

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("chunkernels_docs_hooks", ROOT / "docs/hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_kernel_module_is_a_registered_kernel_with_a_page(hooks):
    modules = hooks.kernel_modules()
    assert modules == sorted(modules) and "broadcast_add" in modules
    assert set(modules) == set(chunkernels.registered())  # the registry's built-ins, one module each
    pages = {p.stem for p in (ROOT / "docs/kernels").glob("*.md")} - {"index"}
    assert pages == set(modules), (f"modules without a page: {sorted(set(modules) - pages)}; "
                                   f"pages without a module: {sorted(pages - set(modules))}")


def test_kernels_nav_appends_a_page_per_module(hooks):
    nav = [{"Home": "index.md"}, {"Kernels": ["kernels/index.md"]}, {"API": "api.md"}]
    got = hooks.kernels_nav(nav, ["kernels/a.md", "kernels/b_c.md"])
    assert got[1] == {"Kernels": ["kernels/index.md", {"a": "kernels/a.md"},
                                  {"b_c": "kernels/b_c.md"}]}
    assert got[0] == {"Home": "index.md"} and got[2] == {"API": "api.md"}
    with pytest.raises(ValueError, match=r"nav has no 'Kernels' section .* sections: \['Home'\]"):
        hooks.kernels_nav([{"Home": "index.md"}], [])


def test_a_module_without_a_page_is_a_warning(hooks, tmp_path, monkeypatch, caplog):
    pytest.importorskip("mkdocs")
    from mkdocs.structure.files import File, Files

    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in ("alpha", "beta", "_helpers"):
        (kernels / f"{name}.py").write_text("")
    (kernels / "gamma").mkdir()  # a kernel that is a package (kernels/label/ becomes one)
    (kernels / "gamma" / "__init__.py").write_text("")
    monkeypatch.setattr(hooks, "KERNELS_DIR", kernels)
    docs = tmp_path / "docs"
    files = Files([File(page, str(docs), str(tmp_path / "site"), use_directory_urls=True)
                   for page in ("index.md", "kernels/index.md", "kernels/alpha.md",
                                "kernels/gamma.md")])
    config = {"nav": [{"Home": "index.md"}, {"Kernels": ["kernels/index.md"]}]}
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.chunkernels"):
        hooks.on_files(files, config)
    assert config["nav"][1] == {"Kernels": ["kernels/index.md", {"alpha": "kernels/alpha.md"},
                                            {"gamma": "kernels/gamma.md"}]}
    assert [r.getMessage() for r in caplog.records] == [
        "built-in kernel module chunkernels/kernels/beta has no page docs/kernels/beta.md "
        "(copy docs/kernels/broadcast_add.md)"]
