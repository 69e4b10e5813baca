"""The built distributions carry the CUDA sources, and an installed wheel finds and runs them.

In a source checkout the kernels live in ``kernels_cuda/`` at the top; the wheel must carry them
inside the package (``chunkernels/kernels_cuda``), where ``chunkernels.cuda.source_dir()`` looks
first. These tests build the sdist and a wheel from it (as ``pip install`` from an sdist would),
install the wheel into a fresh virtual environment and run it from outside the checkout.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from chunkernels import __version__
from chunkernels._registry import get, registered

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                            **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from it, by ``python -m build``."""
    if importlib.util.find_spec("hatchling") is None:
        pytest.fail("hatchling is not installed: pip install -e '.[test]' (it is in the test extra)")
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend comes from this environment (the test extra), so the
    # build needs no network and takes seconds. Without --sdist/--wheel, build makes the sdist and
    # then the wheel *from the sdist*, which also proves the sdist is complete.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], cwd=out)
    wheels = list(out.glob("*.whl"))
    sdists = list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def _sources() -> list[str]:
    return sorted({get(name).source for name in registered() if get(name).source})


def test_wheel_contents(dists):
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        dist_info = f"chunkernels-{__version__}.dist-info"
        entry_points = configparser.ConfigParser()
        entry_points.read_string(whl.read(f"{dist_info}/entry_points.txt").decode())

    for src in ["broadcast_add.cu", *_sources()]:
        assert f"chunkernels/kernels_cuda/{src}" in names
    # Every module of the checkout's package (the built-in kernels are found by their modules,
    # so a kernel module left out of the wheel would be a kernel missing from it).
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "chunkernels").rglob("*.py")}
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"
    assert "chunkernels/cli.py" in names
    assert entry_points.get("console_scripts", "chunkernels") == "chunkernels.cli:main"
    stray = sorted(n for n in names
                   if not n.startswith(("chunkernels/", f"{dist_info}/")))
    assert not stray, f"files outside the package in the wheel: {stray}"


def test_sdist_contents(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        names = set(sdist.getnames())
    top = f"chunkernels-{__version__}"
    for src in ["broadcast_add.cu", *_sources()]:
        assert f"{top}/kernels_cuda/{src}" in names
    for path in ("pyproject.toml", "README.md", "chunkernels/__init__.py"):
        assert f"{top}/{path}" in names


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed; returns its ``bin`` folder."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    # The wheel alone, by this environment's pip (--python: no pip bootstrapped into the new one).
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
          "--no-index", "--disable-pip-version-check", dists["wheel"]])
    # Dependencies (numpy, scipy, dask, distributed) come from this environment's site-packages,
    # appended to the new one's sys.path by a .pth file: what is tested is that the installed
    # wheel finds its kernels_cuda and runs, not pip's resolver, and this needs no network and
    # no minutes of downloads. A plain path line adds the folder without processing the .pth
    # files in it, so this environment's editable install of chunkernels (the checkout) stays
    # out; the new environment's own site-packages comes first in sys.path anyway.
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                .stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_chunkernels_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    return venv / "bin"


def _isolated_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def test_installed_wheel_runs_check(installed, tmp_path):
    # From tmp_path: the checkout is not on sys.path, so only the installed wheel can answer.
    result = _run([installed / "chunkernels", "check"], cwd=tmp_path, env=_isolated_env())
    assert "broadcast_add" in result.stdout
    assert "pass" in result.stdout
    assert "0 failed" in result.stdout


def test_installed_wheel_uses_its_own_sources(installed, tmp_path):
    code = ("import chunkernels, chunkernels.cuda as c, sysconfig; "
            "print(sysconfig.get_paths()['purelib']); print(chunkernels.__file__); "
            "print(c.source_dir()); print(c.source('broadcast_add') == "
            "(c.source_dir() / 'broadcast_add.cu').read_text())")
    result = _run([installed / "python", "-c", code], cwd=tmp_path, env=_isolated_env())
    site, module, source_dir, same = result.stdout.split("\n")[:4]
    site = Path(site).resolve()
    assert site.is_relative_to(installed.parent.resolve())
    assert Path(module).resolve().is_relative_to(site / "chunkernels"), module
    assert Path(source_dir).resolve() == site / "chunkernels" / "kernels_cuda"
    assert not Path(source_dir).resolve().is_relative_to(ROOT)
    assert same == "True"
