"""Print pip constraints that pin every dependency of pyproject.toml at its minimum.

``make test-minimum`` installs chunkernels with these constraints (``pip install -c``) and runs
the suite: the ``>=`` lower bounds of ``[project] dependencies`` and of the extras named on the
command line become ``==`` pins, so what the package claims to support is what is tested. The
pins come from pyproject.toml itself and cannot drift from it.

Usage: python .ci/minimums.py EXTRA [EXTRA ...] > constraints.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# name, optional [extras], then the version specifiers ("dask[array]>=2025.1.0,<2027")
REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)")


def minimums(extras: list[str]) -> dict[str, str]:
    """{distribution name: its lowest allowed version} for the dependencies and ``extras``."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    unknown = sorted(set(extras) - set(project["optional-dependencies"]))
    if unknown:
        raise SystemExit(f"no extra {unknown} in pyproject.toml; extras: "
                         f"{sorted(project['optional-dependencies'])}")
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pins = {}
    for requirement in requirements:
        name, specifiers = REQUIREMENT.fullmatch(requirement).groups()
        lower = [s.strip()[2:] for s in specifiers.split(",") if s.strip().startswith(">=")]
        exact = [s.strip()[2:] for s in specifiers.split(",") if s.strip().startswith("==")]
        if lower or exact:
            pins[name.lower()] = (exact or lower)[0]
    return pins


if __name__ == "__main__":
    for name, version in sorted(minimums(sys.argv[1:]).items()):
        print(f"{name}=={version}")
