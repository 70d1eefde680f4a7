# Two commands a new user runs: `make demo` and `make test`.
# Each bootstraps .venv when it is missing. torch is pinned through constraints.txt so that pip takes
# the CPU wheel on this machine's disk instead of a multi-GB CUDA build; pyproject keeps a range.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --constraint constraints.txt --disable-pip-version-check -q

.PHONY: demo lint test test-fast system-packages soak bench bench-scale bench-report bench-files clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Base install: the library alone, as `pip install .` from a clone gives it.
$(VENV)/.base: $(VENV)/bin/python pyproject.toml constraints.txt
	$(PIP) "torch==2.13.0"
	$(PIP) -e .
	touch $@

# Docs install: the extras the pages of docs/ use (object storage, pictures, export, YAML policies, TensorBoard), so
# each example there runs in the demo's venv; the verl and TRL pages start with their own install line.
DOCS_EXTRAS := s3,timeline,export,yaml,tensorboard
$(VENV)/.docs: $(VENV)/.base
	$(PIP) -e ".[$(DOCS_EXTRAS)]"
	touch $@

# Test install: adds the verl, TRL and docs extras the adapter and sharing tests run against, and the test tools.
$(VENV)/.test: $(VENV)/.docs
	$(PIP) -e ".[test,verl,trl,$(DOCS_EXTRAS)]"
	touch $@

demo: $(VENV)/.docs
	$(PY) -m stepjournal.adapters.demo

# Both run on every core (pytest-xdist); tests/conftest.py says which tests share a worker.
PARALLEL := -n auto --dist loadfile --no-loadscope-reorder

# The bytecode of the package (and of the tests' and benchmarks' modules), as `pip install` of a wheel writes
# it: an editable install never gets it where PYTHONDONTWRITEBYTECODE is set, as it is on these machines, and
# then every command-line process a test or a benchmark starts compiles each module it imports (40-60 ms a
# start; a CLI figure of `make bench` is what an installed stepjournal pays). Python checks each file against
# its source, so an edited module is never run from stale bytecode.
BYTECODE := $(PY) -m compileall -q journal policies adapters tests benchmarks

# The system packages the tests use besides Python's: zsh (the completion tests run it) and Chromium (the
# report's tests drive it headless). Each is a Debian package whose command has its name. `make test` checks
# them before anything else: as root, where apt-get is, it installs the missing ones; otherwise it stops at
# once with the one command to run, before building the venv or starting a test.
SYSTEM_PACKAGES := zsh chromium
system-packages:
	@missing=""; for name in $(SYSTEM_PACKAGES); do command -v "$$name" >/dev/null 2>&1 || missing="$$missing $$name"; done; \
	[ -z "$$missing" ] && exit 0; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "make: the tests need$$missing, which this machine lacks: install$$missing with its package manager, then run make again" >&2; exit 1; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "make: the tests need$$missing, which this machine lacks; install them first with:" >&2; \
		echo "    sudo apt-get install -y$$missing" >&2; exit 1; \
	fi; \
	echo "make: installing the system packages the tests need:$$missing"; \
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q$$missing; } >/dev/null \
		|| { echo "make: apt-get could not install$$missing (apt-get's errors are above)" >&2; exit 1; }

# The linter and the type checker over the package (pyproject.toml's [tool.ruff] and [tool.mypy]); `make test` runs
# them first and stops when either finds anything. mypy reads the package as it is installed: the folders are not
# named after the packages (journal/ is `stepjournal`, policies/ `stepjournal.policies`) and mypy does not run
# setuptools' editable finder, so the recipe links them into build/typecheck/stepjournal, afresh each run (a file
# added or removed since is seen), and checks `-p stepjournal` there.
TYPECHECK := build/typecheck/stepjournal
LINT_DIRS := journal policies adapters
lint: $(VENV)/.test
	$(VENV)/bin/ruff check --no-cache $(LINT_DIRS)
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK) && \
	for entry in journal/*; do [ "$${entry##*/}" = __pycache__ ] || ln -s "$(CURDIR)/$$entry" $(TYPECHECK)/; done && \
	ln -s "$(CURDIR)/policies" $(TYPECHECK)/policies && ln -s "$(CURDIR)/adapters" $(TYPECHECK)/adapters
	$(VENV)/bin/mypy

test: system-packages $(VENV)/.test lint
	$(BYTECODE)
	$(VENV)/bin/pytest -q -m "not soak" $(PARALLEL)

# The fast tier, for the edit-test loop: everything but the soak runs and the end-to-end (`e2e`) files.
# Its temporary folders (every test's journals) live in memory, in a folder of its own under /dev/shm where
# the machine has one: on this machine's disk the commits, fsyncs and file writes cost a sixth of the run.
# Nothing it checks needs a disk (the full-disk and read-only tests mount their own tmpfs); `make test`, which
# CI runs, keeps the disk. The folder goes when the run passes; when it fails, the failed tests' folders stay
# and their place is printed.
FAST_TMP := $(or $(wildcard /dev/shm),$(or $(TMPDIR),/tmp))
test-fast: system-packages $(VENV)/.test
	$(BYTECODE)
	@tmp=$$(mktemp -d "$(FAST_TMP)/stepjournal-test-fast.XXXXXX") || exit 1; \
	trap 'rm -rf "$$tmp"; exit 130' INT TERM HUP; \
	TMPDIR="$$tmp" $(VENV)/bin/pytest -q -m "not soak and not e2e" $(PARALLEL) -o tmp_path_retention_policy=failed; \
	status=$$?; \
	if [ $$status -eq 0 ]; then rm -rf "$$tmp"; else echo "make test-fast: the failed tests' folders are in $$tmp"; fi; \
	exit $$status

$(VENV)/.soak: $(VENV)/.test
	$(PIP) -e ".[test,verl,trl,s3,soak]"
	touch $@

soak: $(VENV)/.soak
	$(BYTECODE)
	$(VENV)/bin/pytest -q -m soak

bench: $(VENV)/.test
	$(BYTECODE)
	$(PY) -m benchmarks

# A journal of 1 000 000 events and what each answer then costs (issue 17); about 10 minutes here.
bench-scale: $(VENV)/.test
	$(BYTECODE)
	$(PY) -m benchmarks._scale
	$(PY) -m benchmarks._scale_big

# `stepjournal report` of 10 000 steps of 500 samples: its time, memory and file size; about 5 minutes here.
bench-report: $(VENV)/.test
	$(BYTECODE)
	$(PY) -m benchmarks._bench_report

# Where payload files start to pay: a durable record in LMDB vs as a file, by payload size (issue 29).
bench-files: $(VENV)/.test
	$(BYTECODE)
	$(PY) -m benchmarks._bench_file_threshold

clean:
	rm -rf $(VENV) .stepjournal-demo build dist *.egg-info
	find journal policies adapters tests benchmarks -name __pycache__ -prune -exec rm -rf {} +
