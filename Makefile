# `make demo` and `make test` each create .venv if missing and install the
# project into it first. The venv (about 2 GB with TensorFlow) is reused.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: demo test test-slow test-all install clean bench-compare bench-docs bench-render

# Benchmarks (see docs/benchmarks.md); pass flags with BENCH_FLAGS, e.g.
#   make bench-docs BENCH_FLAGS='--sections=overhead --repeats=5'
# bench-compare: ours vs Lingvo's GPipe (benchmarks/lingvo_peer/; its venv is
#   built at PEER_VENV, default /tmp/lingvo-peer-venv, if missing), raw JSON +
#   table in docs/benchmarks/compare_lingvo.{json,md}.
# bench-docs: measures the paper-style tables and regenerates docs/benchmarks.md.
# bench-render: regenerates docs/benchmarks.md from the JSON, measuring nothing.
BENCH_FLAGS ?=

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	# setuptools boxes a warning about editable installs on every fresh set-up;
	# it says nothing about this project.
	PYTHONWARNINGS='ignore:Editable installation' $(PYTHON) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lingvo_pipe_trainer --mode=train_and_eval --logdir=logs/demo

# test leaves out the tests marked slow (pytest.ini): the rest of the (K, M)
# grids and matrices that it samples; test-slow runs only those, test-all both.
# test ends with its slowest tests and the total time, for keeping it short.
# --dist=loadfile keeps a file's tests on one worker, so a module-scoped
# fixture (a trained model) is built once, not once per worker; the suite
# passes under any --dist.
test: $(STAMP)
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow" --dist=loadfile --durations=25 tests

test-slow: $(STAMP)
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m slow tests

test-all: $(STAMP)
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) tests

bench-compare: $(STAMP)
	$(PYTHON) -m benchmarks.compare_lingvo $(BENCH_FLAGS)
	$(PYTHON) -m benchmarks.paper_tables --sections=

bench-docs: $(STAMP)
	$(PYTHON) -m benchmarks.paper_tables $(BENCH_FLAGS)

bench-render: $(STAMP)
	$(PYTHON) -m benchmarks.paper_tables --sections=

clean:
	rm -rf $(VENV) logs
