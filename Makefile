# The Makefile is the menu: `make help` lists every target with its `## comment`.
SHELL := /bin/bash
PY_SYS ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
EVALPLUS_PIN := evalplus==0.3.1
STAMP := $(VENV)/.setup-stamp

.DEFAULT_GOAL := help
.PHONY: help setup test lint clean

# Each area adds its targets in mk/<area>.mk (train, sweep, eval, report, demo, synthetic, bench).
-include mk/*.mk

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: a CPU build here, the CUDA build on a GPU machine.
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m pip install -q --no-deps $(EVALPLUS_PIN)
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install torch==2.13.0, the project and its extras (idempotent)

test: setup ## run setup, then the test suite
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup ## ruff check
	$(VENV)/bin/ruff check .

clean: ## remove the venv and caches (results/ is kept)
	rm -rf $(VENV) .pytest_cache
