# gpupool: `make demo` shows the pool at work; `make test` passes the suite. Both set up what they need.
# The interpreter of the .venv: the operating system's own Python 3 where it is 3.11 or newer and can make a
# venv and compile extensions (its Python.h), else python3 on PATH; `make PYTHON=...` chooses another.
# Distributions (Debian, Ubuntu, Fedora) build theirs with profile-guided and link-time optimization,
# which version managers such as pyenv leave out unless asked: the scheduler and the simulator spend most
# of their time in the interpreter, and the Philly week replays in about 13% less CPU on Debian's build
# than on this box's pyenv one (docs/benchmarks.md, "The interpreter").
SYSTEM_PYTHON := /usr/bin/python3
SYSTEM_PYTHON_FITS := import sys, os, sysconfig, ensurepip, venv; \
	sys.exit(sys.version_info < (3, 11) or not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))
PYTHON ?= $(shell $(SYSTEM_PYTHON) -c '$(SYSTEM_PYTHON_FITS)' >/dev/null 2>&1 && echo $(SYSTEM_PYTHON) || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit lint bench clean native

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(STAMP)

# The scheduler core and the simulator's engine compiled with mypyc (tools/build_native.py compiles each
# only when one of its sources changed; with GCC profile-guided, trained by tools/native_training.py: about
# three minutes). Without a C compiler the source runs; gpupool.scheduler.NATIVE and gpupool.sim.NATIVE say
# which.
native: $(STAMP)
	$(BIN)/python tools/build_native.py

demo: $(STAMP) native
	$(BIN)/python examples/demo.py

# Most of the suite waits on real processes, servers and clocks (one core is about half busy), so it runs
# in TEST_WORKERS processes, each test file whole in one of them (a file's module-wide fixtures, such as
# its Slurm cluster, are started once): about 13 instead of 23 minutes on 2 cores. TEST_WORKERS=0: one
# process.
TEST_WORKERS ?= 4

test: $(STAMP) native lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-unit: $(STAMP) native
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples tools
	$(BIN)/ruff format --check src tests examples tools
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/submit_throughput.py
	$(BIN)/python benchmarks/submit_to_running.py
	$(BIN)/python benchmarks/job_throughput.py

clean:
	rm -rf $(VENV) .demo build src/gpupool/scheduler/_native src/gpupool/sim/_native *.egg-info .pytest_cache .mypy_cache .ruff_cache
