# Tests. `make test` is the fast tier (tests not marked slow; about 3 min on 2 cores);
# `make test-all` runs everything, and is what CI (.ci/run) runs. PYTEST_ARGS passes options on.
.PHONY: test test-all lint clean
PYTEST_ARGS :=

test: setup ## the fast test tier (not marked slow; ~3 min on 2 cores)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: setup ## every test, the slow tier included (what CI runs)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup ## ruff check
	$(VENV)/bin/ruff check .

clean: ## remove the venv and caches (results/ is kept)
	rm -rf $(VENV) .pytest_cache
