# splitfed: `make run` (the main job) and `make test` (the whole suite) set everything up themselves.
# pyproject.toml's requires-python (>=3.11,<3.12): the only Python .venv is built with or taken from
PYTHON_VERSION := 3.11
# python3.11 where one runs (python3 may be another version, and a pyenv shim may exist and not run); PYTHON=...
# picks the interpreter. Expanded only where .venv is built
PYTHON ?= $(if $(shell python$(PYTHON_VERSION) -c '' 2>/dev/null && echo y),python$(PYTHON_VERSION),python3)
VENV ?= .venv
# install's version check: an interpreter's "major.minor", and the words for it once the shell holds it in v
# ("Python 3.12", or that it does not run)
VERSION_OF := import sys; print("%d.%d" % sys.version_info[:2])
IS_V := $${v:+Python }$${v:-not a Python that runs}
PY := $(VENV)/bin/python
OUT ?= runs/main
# CI has 2 cores: 2 pytest workers at most
WORKERS ?= 2
# the sources' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (it is on the machines this project
# is built on), every process (a tier, a Flower actor, a test's child) compiled splitfed anew, ~0.3 s of CPU each;
# a tree it cannot write to (read-only) is no error: the processes compile in memory as before
COMPILE = $(PY) -m compileall -q splitfed server clients simulations benchmarks > /dev/null || true

.PHONY: install run test test-fast test-explore lint typecheck bench clean proto

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@# a .venv of another Python is refused, not replaced: pip refused to install into it (requires-python), and
	@# it stayed, so PYTHON=python3.11 given afterwards changed nothing; a user's venv is not deleted unasked
	@if [ -x $(PY) ]; then v=$$($(PY) -c '$(VERSION_OF)' 2>/dev/null); [ "$$v" = $(PYTHON_VERSION) ] || { \
	  echo "splitfed needs Python $(PYTHON_VERSION) (pyproject.toml), and $(PY) is $(IS_V): rm -rf $(VENV), then" \
	       "make install PYTHON=python$(PYTHON_VERSION)" >&2; exit 1; }; \
	else v=$$($(PYTHON) -c '$(VERSION_OF)' 2>/dev/null); [ "$$v" = $(PYTHON_VERSION) ] || { \
	  echo "splitfed needs Python $(PYTHON_VERSION) (pyproject.toml), and PYTHON=$(PYTHON) is $(IS_V): give" \
	       "make install PYTHON=python$(PYTHON_VERSION) (or the path of a Python $(PYTHON_VERSION))" >&2; exit 1; }; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the pinned CPU wheel first: an unpinned torch would pull a multi-GB CUDA build (from PyPI the pinned one
	# does too: TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU build from PyTorch's index)
	$(PY) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m splitfed.transport.protogen
	$(COMPILE)
	touch $@

proto: install
	$(PY) -m splitfed.transport.protogen --force

run: install
	$(VENV)/bin/splitfed simulate --config simulations/configs/main.toml --out $(OUT) --overwrite

test: install
	$(COMPILE)
	$(VENV)/bin/pytest -n $(WORKERS) --dist loadgroup -q --durations=30  # the slowest tests, for whoever keeps CI short

test-fast: install
	$(COMPILE)
	$(VENV)/bin/pytest -n $(WORKERS) --dist loadgroup -q -m "not slow"

# the property tests (hypothesis) on examples CI never draws: new ones each run; repeat it now and then
test-explore: install
	SPLITFED_HYPOTHESIS_PROFILE=explore $(VENV)/bin/pytest -n $(WORKERS) --dist loadgroup -q -m "hypothesis and not slow"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# the type hints of splitfed, server, clients, simulations and benchmarks ([tool.mypy] in pyproject.toml)
typecheck: install
	$(VENV)/bin/mypy

bench: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/engine.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/transport.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/optimizer.py
	$(PY) benchmarks/simulation.py
	$(PY) benchmarks/weights.py
	$(PY) benchmarks/startup.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis .mypy_cache splitfed/transport/proto/splitfed
