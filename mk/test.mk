# Tests. `make test` is the fast tier (tests not marked slow), spread over TEST_JOBS pytest-xdist
# workers (default 2: about 3 min on 2 cores; TEST_JOBS=0 runs it in one process); `make test-all`
# runs everything in one process, the slow tier included, and is what CI (.ci/run) runs (its
# multi-process, SLURM and timing tests want the cores to themselves). PYTEST_ARGS passes options on.
.PHONY: test test-all lint clean
PYTEST_ARGS :=
TEST_JOBS := 2
KNOWN_test := TEST_JOBS PYTEST_ARGS
KNOWN_test-all := PYTEST_ARGS
KNOWN_lint :=
KNOWN_clean :=

test: setup ## the fast test tier (not marked slow) on TEST_JOBS=2 workers (~3 min on 2 cores)
	$(PY) -m pytest -m "not slow" -n $(TEST_JOBS) $(PYTEST_ARGS)

test-all: setup ## every test, the slow tier included, in one process (what CI runs)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup ## ruff check
	$(PY) -m ruff check .

clean: ## remove the venv and caches (results/ is kept)
	rm -rf $(VENV) .pytest_cache
