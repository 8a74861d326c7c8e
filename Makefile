# `make demo` and `make test` each create .venv if missing and install the
# project into it first. The venv (about 2 GB with TensorFlow) is reused.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lingvo_pipe_trainer --mode=train_and_eval --logdir=logs/demo

test: $(STAMP)
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) tests

clean:
	rm -rf $(VENV) logs
