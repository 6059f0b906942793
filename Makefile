# The README's two commands: `make demo` and `make test`. Both create .venv from nothing.
# torch is the CPU wheel pinned to 2.13.0 (on the build machines' disk); it is installed
# first and on its own so that nothing can pull another torch build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check

SITE   := site
# pytest processes of `make test` (pytest-xdist; work stealing: a worker done with its share
# takes tests queued behind another's slow one).
TEST_WORKERS ?= 2

.PHONY: demo test test-gpu test-kernels-cudasim test-kernels-boundscheck asv-check docs bench bench-machine bench-record bench-report bench-continuous clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench,plot,docs]'
	touch $@ $(VENV)/.demo-installed $(VENV)/.docs-installed $(VENV)/.bench-installed

$(VENV)/.docs-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[docs]'
	touch $@

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[bench]'
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/posenc demo

# The docs are built first (strictly); tests/test_docs_html.py then checks that site.
test: $(VENV)/.test-installed
	$(MAKE) docs
	POSENC_DOCS_SITE=$(CURDIR)/$(SITE) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal
	$(MAKE) -j2 --output-sync=target test-kernels-cudasim test-kernels-boundscheck
	$(MAKE) asv-check

# The kernel suite again, in fresh processes: CUDA kernels on the numba CUDA simulator,
# and every Numba kernel with bounds checking compiled in. `make test` runs the two side by
# side (each keeps mostly one core busy; each one's output printed whole when it ends).
test-kernels-cudasim: $(VENV)/.test-installed
	NUMBA_ENABLE_CUDASIM=1 $(BIN)/python -m pytest -q -m kernels -p no:cacheprovider tests

test-kernels-boundscheck: $(VENV)/.test-installed
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(CURDIR)/.venv/numba-boundscheck-cache $(BIN)/python -m pytest -q -m kernels -p no:cacheprovider tests

# The whole suite on a GPU: CuPy arrays and torch CUDA tensors through the numba.cuda
# kernels (not the simulator). GPU_PYTHON is an interpreter that has numba-cuda and CuPy
# or a CUDA build of torch (.venv holds the CPU torch); without a GPU it stops at once.
# JAX is kept from preallocating the GPU's memory and Numba's low-occupancy warning is off
# (tests/conftest.py sets both too); with pytest-xdist installed (the gpu-test extra) the
# suite runs on GPU_WORKERS processes, each stealing work from the others once its own is
# done (tests/gpu/workers.py), each compiling torch.compile's code in-process
# (TORCHINDUCTOR_COMPILE_THREADS=1, rather than a pool of processes per worker) and each
# with GPU_THREADS CPU threads for torch and Numba (not one per core each: sixteen workers
# with sixteen threads apiece oversubscribe the CPU some tests run on).
GPU_PYTHON ?= python3
GPU_WORKERS ?= $(shell nproc 2>/dev/null || echo 4)
GPU_THREADS ?= 2
test-gpu:
	@$(GPU_PYTHON) tests/gpu/ready.py
	PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} POSENC_TEST_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 TORCHINDUCTOR_COMPILE_THREADS=1 \
		OMP_NUM_THREADS=$(GPU_THREADS) NUMBA_NUM_THREADS=$(GPU_THREADS) \
		$(GPU_PYTHON) -m pytest -p no:cacheprovider -p no:benchmark $$($(GPU_PYTHON) tests/gpu/workers.py $(GPU_WORKERS)) tests

# asv as maintainers use it (docs/benchmarks.md, "Tracking performance"). The machine file
# (~/.asv-machine.json) is written first, so a fresh clone needs no interactive `asv machine`.
# `make bench`: a smoke test, every benchmark once (asv --quick: one sample of each row,
# nothing stored) against this checkout's .venv. `make bench-record`: the whole suite with
# full sampling, stored for HEAD. `make bench-report`: those results as a site that renders
# with no network, in asv_benchmarks/.asv/report/. `make bench-continuous`: the regression
# check, BENCH_BASE against BENCH_HEAD, each built into asv's own virtualenv (torch==2.13.0
# installed first and alone), on BENCH_REGRESSION: the hot paths' ratios to an in-process
# floor (a copy, a fill, the framework's own decode step), flagged beyond BENCH_FACTOR;
# it exits 1 on a regression, and prints every row of the comparison.
ASV_ARGS ?=
ASV := cd asv_benchmarks && ../$(BIN)/asv
BENCH_BASE ?= main
BENCH_HEAD ?= HEAD
BENCH_FACTOR ?= 1.1
BENCH_REGRESSION ?= \
	-b '^rope\.RopeRotate\.track_in_place_time_over_copy\(.1x8x256x128' \
	-b '^bias\.(T5|Alibi)Bias\.track_[a-z0-9]+_out_time_over_fill\(256\)' \
	-b '^decode\.DecodeStep\.track_ratio\(.((rope|apply_rope) numpy \[1,32,1,128\]|(t5_bias|alibi_bias) numpy 16 heads, 1 x 512|HF apply_rotary_pos_emb .*|rope torch \[1,32,1,128\]|t5_bias torch 16 heads, 1 x 512).\)$$'

bench-machine: $(VENV)/.bench-installed
	$(ASV) machine --yes > /dev/null

bench: bench-machine
	$(ASV) run --quick --show-stderr -E existing:$(CURDIR)/$(BIN)/python $(ASV_ARGS)

bench-record: bench-machine
	$(ASV) run --show-stderr --set-commit-hash $$(git rev-parse HEAD) -E existing:$(CURDIR)/$(BIN)/python $(ASV_ARGS)

bench-report: $(VENV)/.bench-installed
	$(BIN)/python asv_benchmarks/report.py asv_benchmarks/.asv/results asv_benchmarks/.asv/report

bench-continuous: bench-machine
	base=$$(git rev-parse $(BENCH_BASE)) head=$$(git rev-parse $(BENCH_HEAD)); \
	($(ASV) continuous --factor $(BENCH_FACTOR) --show-stderr $(BENCH_REGRESSION) $(ASV_ARGS) $$base $$head); \
	status=$$?; \
	($(ASV) compare --factor $(BENCH_FACTOR) $$base $$head); \
	exit $$status

asv-check: $(VENV)/.test-installed
	cd asv_benchmarks && ../$(BIN)/asv check -E existing:$(CURDIR)/$(BIN)/python

# The docs site (Sphinx: numpydoc API reference, MyST pages, MathJax served from the site,
# figures regenerated), warnings as errors, into $(SITE)/.
docs: $(VENV)/.docs-installed
	$(BIN)/python -m sphinx -b html -W --keep-going -q -E docs $(SITE)
	@echo "docs: site built in $(CURDIR)/$(SITE); open file://$(CURDIR)/$(SITE)/index.html"

clean:
	rm -rf $(VENV) .pytest_cache asv_benchmarks/.asv $(SITE)
