# The README's two commands: `make demo` and `make test`. Both create .venv from nothing.
# torch is the CPU wheel pinned to 2.13.0 (on the build machines' disk); it is installed
# first and on its own so that nothing can pull another torch build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: demo test test-gpu test-kernels-cudasim test-kernels-boundscheck asv-check docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench,plot,docs]'
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/posenc demo

test: $(VENV)/.test-installed
	$(BIN)/python -m pytest
	$(MAKE) test-kernels-cudasim test-kernels-boundscheck asv-check docs

# The kernel suite again, in fresh processes: CUDA kernels on the numba CUDA simulator,
# then every Numba kernel with bounds checking compiled in.
test-kernels-cudasim: $(VENV)/.test-installed
	NUMBA_ENABLE_CUDASIM=1 $(BIN)/python -m pytest -q -m kernels -p no:cacheprovider tests

test-kernels-boundscheck: $(VENV)/.test-installed
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(CURDIR)/.venv/numba-boundscheck-cache $(BIN)/python -m pytest -q -m kernels -p no:cacheprovider tests

# The whole suite on a GPU: CuPy arrays and torch CUDA tensors through the numba.cuda
# kernels (not the simulator). GPU_PYTHON is an interpreter that has numba-cuda and CuPy
# or a CUDA build of torch (.venv holds the CPU torch); without a GPU it stops at once.
GPU_PYTHON ?= python3
test-gpu:
	@$(GPU_PYTHON) tests/gpu/ready.py
	PYTHONPATH=$(CURDIR)/src POSENC_TEST_GPU=1 $(GPU_PYTHON) -m pytest -p no:cacheprovider tests

asv-check: $(VENV)/.test-installed
	cd asv_benchmarks && ../$(BIN)/asv check -E existing:$(CURDIR)/$(BIN)/python

# The docs site (mkdocs, API reference from the docstrings), warnings as errors.
docs: $(VENV)/.test-installed
	$(BIN)/posenc plot --out docs/figures > /dev/null
	$(BIN)/mkdocs build --strict -q -d $(VENV)/site

clean:
	rm -rf $(VENV) .pytest_cache asv_benchmarks/.asv
