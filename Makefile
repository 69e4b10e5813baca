# Development entry points. Everything runs from a fresh clone: targets that need the virtual
# environment depend on `venv`, which builds .venv from pyproject.toml and rebuilds it only when
# pyproject.toml or .ci/constraints.txt changes.
#
#   make demo      validate every kernel, then find the sources of a synthetic 8192² sky (the GPU
#                  lesson's four steps) on a local (CUDA) cluster, checked against the CPU
#   make test      the test suite (GPU tests skip without a GPU); the CI command is .ci/run
#   make test-newest  the suite with the newest Dask and distributed the registry offers
#                  (.venv-newest, upgraded on every run)
#   make test-minimum the suite with every dependency at its pyproject.toml minimum (.venv-minimum)
#   make test-gpu  GPU tests, `chunkernels check` and benchmarks on a GPU machine (.ci/gpu)
#   make docs      build the documentation into site/ (mkdocs --strict)
#   make bench     benchmarks (needs a GPU)
#   make nvcc-check  compile every CUDA source with nvcc (no GPU needed)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU suite on both cores; pytest-xdist comes with the test extra.
PYTEST_ARGS ?= -n auto
# The extras the suite imports (its tests of the benchmarks, the demo's readers, the docs).
EXTRAS := test,docs,bench,demo

.PHONY: help venv test test-newest test-minimum test-gpu docs demo bench nvcc-check clean distclean

help:
	@sed -n 's/^#   //p' Makefile

venv: $(STAMP)

# The stamp is newer than pyproject.toml once the install succeeded; an edit to pyproject.toml
# (dependencies, extras) reinstalls. An existing .venv is reused. .ci/constraints.txt holds
# .venv's Dask at the release the CUDA extras' dask-cuda pins, so `make test` tests what the
# GPU machines run and `make test-newest` the newest release.
$(STAMP): pyproject.toml .ci/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c .ci/constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The newest Dask and distributed the registry offers, past pyproject.toml's cap too, so that a
# new release is caught here before users meet it (pip then warns that chunkernels asks for less;
# that warning is the signal to raise the cap). Rebuilt from what the registry offers on every
# run. Before the suite, pip must resolve chunkernels together with each Dask named in
# RESOLVE_DASK (a dry run, nothing installed).
RESOLVE_DASK ?= 2026.7.1 2026.8.0
# Every test but two files that do not touch Dask and take about a fifth of the suite's test time
# (390 of 1840 s in one run): the nvcc compiles of the CUDA sources and the wheel build (make test
# runs both).
NEWEST_SKIP := --ignore=tests/test_nvcc.py --ignore=tests/test_packaging.py
test-newest:
	test -x .venv-newest/bin/python || $(PYTHON) -m venv .venv-newest
	.venv-newest/bin/python -m pip install --quiet --upgrade pip
	for v in $(RESOLVE_DASK); do \
	  .venv-newest/bin/python -m pip install --quiet --dry-run --ignore-installed \
	    . "dask[array]==$$v" "distributed==$$v" || exit 1; \
	  echo "pip resolves chunkernels with dask $$v"; done
	.venv-newest/bin/python -m pip install --quiet --upgrade -e '.[test,bench,demo]'
	.venv-newest/bin/python -m pip install --quiet --upgrade 'dask[array]' distributed
	.venv-newest/bin/python -c "import dask, distributed, numpy, scipy; \
	  print('newest: dask', dask.__version__, '| distributed', distributed.__version__, \
	        '| numpy', numpy.__version__, '| scipy', scipy.__version__)"
	.venv-newest/bin/python -m pytest -q $(PYTEST_ARGS) -p no:cacheprovider $(NEWEST_SKIP)

# Every dependency at its minimum (.ci/minimums.py turns pyproject.toml's lower bounds into pins),
# on the oldest Python pyproject.toml allows. Run by hand when a minimum changes; the result is
# recorded in docs/index.md.
PYTHON_MINIMUM ?= python3.11
test-minimum:
	rm -rf .venv-minimum
	$(PYTHON_MINIMUM) -m venv .venv-minimum
	.venv-minimum/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON_MINIMUM) .ci/minimums.py test bench demo > .venv-minimum/constraints.txt
	.venv-minimum/bin/python -m pip install --quiet -c .venv-minimum/constraints.txt \
	  -e '.[test,bench,demo]'
	.venv-minimum/bin/python -m pip list --format=freeze | \
	  grep -iE '^(numpy|scipy|dask|distributed|tifffile|zarr|astropy|pandas|xarray)=='
	.venv-minimum/bin/python -m pytest -q $(PYTEST_ARGS) -p no:cacheprovider

test-gpu:
	bash .ci/gpu

docs: venv
	$(BIN)/mkdocs build --strict --site-dir site

# The demo writes catalogue.csv and preview.png into chunkernels-demo/ (git-ignored).
demo: venv
	$(BIN)/chunkernels check
	$(BIN)/chunkernels demo --out chunkernels-demo

bench: venv
	$(BIN)/chunkernels bench

nvcc-check: venv
	$(BIN)/python -m pytest -q tests/test_nvcc.py

# Build outputs and caches; the environment stays (distclean removes it too). bench-results/
# holds measurements and is left alone.
clean:
	rm -rf build dist site .pytest_cache .hypothesis chunkernels-demo
	find . -path './.venv*' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path './.venv*' -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .venv-newest .venv-minimum
