"""The ``chunkernels`` command: list, describe, check (CPU part here), errors and exit codes."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import MOVING_SUM, random_array

import chunkernels
from chunkernels import __version__
from chunkernels.cli import _short_dtypes, main

HEADER = ["name", "kind", "ndim", "dtypes (GPU path)", "CUDA source"]


def run(capsys, *argv):
    """``(exit code, stdout, stderr)`` of ``chunkernels ARGV`` run in this process."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def list_rows(out: str) -> dict[str, tuple[list[str], str]]:
    """``chunkernels list`` output as {name: (row cells, halo rule)}; the cells split on runs of
    two or more spaces, the halo rule joined from its wrapped lines."""
    rows, name = {}, None
    for line in out.splitlines()[2:]:
        if line.startswith(" "):
            cells, halo = rows[name]
            rows[name] = (cells, " ".join(filter(None, [halo, line.strip()])))
        else:
            cells = re.split(r"\s{2,}", line)
            name = cells[0]
            rows[name] = (cells, "")
    return {name: (cells, halo.removeprefix("halo: ")) for name, (cells, halo) in rows.items()}


def test_list(capsys):
    code, out, err = run(capsys, "list")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == HEADER
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = list_rows(out)
    assert list(rows) == chunkernels.kernels()
    assert rows["broadcast_add"] == (["broadcast_add", "raw", "any", "int32/64, float32/64",
                                      "broadcast_add.cu"], "0")
    assert rows["label"][0][3] == "bool, (u)int8-64, float16-64"
    assert rows["gaussian_gradient_magnitude"][1] == chunkernels.get(
        "gaussian_gradient_magnitude").halo_rule  # wrapped, every word kept
    assert all(line == line.rstrip() for line in lines)


def test_list_fits_a_100_column_terminal(capsys):
    _, out, _ = run(capsys, "list")
    too_wide = [line for line in out.splitlines() if len(line) > 100]
    assert not too_wide, f"{len(too_wide)} lines wider than 100 columns: {too_wide}"


@pytest.mark.parametrize("dtypes, text", [
    (("float32", "float64", "int32", "int64"), "int32/64, float32/64"),
    (("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
      "uint64"), "(u)int8-64, float32/64"),
    (("bool", "int8", "uint8", "float16", "float32", "float64"), "bool, (u)int8, float16-64"),
    (("uint8", "uint16", "int32"), "int32, uint8/16"),
    (("float32", "complex64"), "float32, complex64"),
    ((), ""),
])
def test_list_shortens_dtypes(dtypes, text):
    assert _short_dtypes(dtypes) == text


def test_list_shows_user_kernels(capsys, moving_sum):
    chunkernels.register(name="inline_k", cpu=np.negative, code="__global__ void k() {}")
    _, out, _ = run(capsys, "list")
    rows = list_rows(out)
    assert rows["moving_sum"] == (["moving_sum", "raw", ">=1", "int32/64, float32/64", "-"],
                                  "radius (last axis)")
    assert rows["inline_k"][0][-1] == "inline"
    assert list(rows) == sorted(rows)


def test_describe(capsys):
    code, out, err = run(capsys, "describe", "broadcast_add")
    assert code == 0 and err == ""
    assert out == chunkernels.describe("broadcast_add") + "\n\n"
    assert "kernels_cuda/broadcast_add.cu" in out
    assert "chunkernels.kernels.broadcast_add.reference" in out


def test_describe_several(capsys, moving_sum):
    _, out, _ = run(capsys, "describe", "broadcast_add", "moving_sum")
    blocks = out.strip().split("\n\n")
    assert [b.splitlines()[0].split() for b in blocks] == [["name", "broadcast_add"],
                                                           ["name", "moving_sum"]]


REGISTERED = ", ".join(chunkernels.registered())


@pytest.mark.parametrize("argv, message", [
    (("describe", "broadcast_ad"), "chunkernels: no kernel named 'broadcast_ad'; did you mean "
                                   f"'broadcast_add'? registered kernels: {REGISTERED}\n"),
    (("describe", "broadcast_add", "nope"), "chunkernels: no kernel named 'nope'; registered "
                                            f"kernels: {REGISTERED}\n"),
    (("check", "../broadcast_add.cu"), "chunkernels: '../broadcast_add.cu' is not a kernel name: "
                                       "names are identifiers like 'broadcast_add', never paths; "
                                       "chunkernels.registered() lists them\n"),
])
def test_unknown_kernel_exits_2_with_the_message_on_stderr(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err == message
    assert "Traceback" not in out + err


def test_check_cpu_part(capsys):
    code, out, err = run(capsys, "check")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["kernel", "path", "cases", "result", "detail"]
    assert lines[2].split() == ["broadcast_add", "cpu,", "dask", "chunks", "10", "pass"]
    assert lines[3].split()[:5] == ["broadcast_add", "gpu", "0", "skip", "skipped:"]
    for name in chunkernels.registered():  # every kernel: a CPU row that passed, a skipped GPU row
        rows = [line.split() for line in lines if line.startswith(name + " ")]
        assert len(rows) == 2
        assert rows[0][1:4] == ["cpu,", "dask", "chunks"] and rows[0][5] == "pass"
        assert rows[1][1:4] == ["gpu", "0", "skip"]
    assert "GPU part skipped: no CUDA GPU found (CuPy missing or no device); the CPU path was " \
           "checked." in out
    assert out.rstrip().endswith(f"{len(chunkernels.registered())} passed, 0 failed")


def test_check_cpu_only_flag_and_names(capsys, moving_sum):
    chunkernels.register(dataclasses.replace(
        MOVING_SUM, cases=lambda rng: [(random_array(rng, (5, 9), "int64"), (), {"radius": r})
                                       for r in (1, 4)]), replace=True)
    code, out, _ = run(capsys, "check", "--cpu-only", "--seed", "3", "moving_sum")
    assert code == 0
    assert "GPU part skipped: --cpu-only given" in out
    assert "moving_sum  cpu, dask chunks  2      pass" in out
    assert "broadcast_add" not in out
    # a kernel with a GPU path: its row says why it was skipped, as the footer does
    code, out, _ = run(capsys, "check", "--cpu-only", "broadcast_add")
    assert code == 0 and "skipped: the GPU path not asked for" in out


def test_check_reports_a_kernel_that_depends_on_its_chunking(capsys):
    """A "reference" that is not blockwise (it subtracts the block's mean) fails on chunks."""

    def centre(x):
        return x - x.mean()

    chunkernels.register(name="centre", cpu=centre,
                         cases=lambda rng: [(rng.standard_normal((6, 8)), (), {})])
    code, out, _ = run(capsys, "check", "centre")
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("centre"))
    assert row.split()[:6] == ["centre", "cpu,", "dask", "chunks", "1", "FAIL"]
    assert "case 0 (x (6, 8) float64): AssertionError:" in row
    assert out.rstrip().endswith("0 passed, 1 failed")


def test_check_reports_a_reference_that_raises(capsys):
    """A CPU reference that raises fails its cases in the table; the other kernels still run."""

    def picky(x, *, scale=1.0):
        if scale < 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        return x * scale

    chunkernels.register(name="picky", cpu=picky,
                         cases=lambda rng: [(rng.standard_normal((4, 6)), (), {"scale": s})
                                            for s in (2.0, -1.0)])
    code, out, err = run(capsys, "check", "picky", "broadcast_add")
    assert code == 1
    assert "Traceback" not in out + err
    row = next(line for line in out.splitlines() if line.startswith("picky"))
    assert row.split()[:6] == ["picky", "cpu,", "dask", "chunks", "2", "FAIL"]
    assert ("case 1 (x (4, 6) float64): the CPU reference raised ValueError: scale must be >= 0, "
            "got -1.0") in row
    broadcast = next(line for line in out.splitlines() if line.startswith("broadcast_add"))
    assert broadcast.split()[4:6] == ["10", "pass"]
    assert out.rstrip().endswith("1 passed, 1 failed")


def test_kernel_without_cases_is_skipped(capsys):
    chunkernels.register(name="negate", cpu=np.negative)
    code, out, _ = run(capsys, "check", "negate")
    assert code == 0
    assert "negate  cpu, dask chunks  0      skip" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"chunkernels {__version__}\n"


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "usage: chunkernels" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-5", "abc", "1.5"])
def test_check_refuses_a_seed_that_is_not_a_whole_number(seed, capsys):
    """A usage error (exit 2) naming the value, not a traceback from NumPy's generator."""
    with pytest.raises(SystemExit) as info:
        main(["check", "--seed", seed])
    assert info.value.code == 2
    assert f"argument --seed: {seed!r} is not a whole number of at least 0" in (
        capsys.readouterr().err)


def test_module_entry_point(tmp_path):
    """``python -m chunkernels``, run from elsewhere, as the console script runs it."""
    proc = subprocess.run([sys.executable, "-m", "chunkernels", "list"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.split(r"\s{2,}", proc.stdout.splitlines()[0]) == HEADER
    assert "broadcast_add" in proc.stdout and "broadcast_add.cu" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "chunkernels", "describe", "nope"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("chunkernels: no kernel named 'nope'")
