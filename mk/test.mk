# Tests. `make test` is the fast tier (tests not marked slow), spread over TEST_JOBS pytest-xdist
# workers (default 2; TEST_JOBS=0 runs it in one process). `make test-all` is what CI (.ci/run)
# runs: the fast tier the same way, then the slow tier in one process (its multi-process, SLURM
# and timing tests want the cores to themselves), each printing its 25 slowest tests. Every test
# has a timeout (pyproject's `timeout`, @pytest.mark.timeout on the long ones): a hang fails
# that test, not CI's 90 minutes. PYTEST_ARGS passes options on to both.
.PHONY: test test-all lint clean
PYTEST_ARGS :=
TEST_JOBS := 2
KNOWN_test := TEST_JOBS PYTEST_ARGS
KNOWN_test-all := TEST_JOBS PYTEST_ARGS
KNOWN_lint :=
KNOWN_clean :=

test: setup ## the fast test tier (not marked slow) on TEST_JOBS=2 workers (under 2 min on 2 cores)
	$(PY) -m pytest -m "not slow" -n $(TEST_JOBS) $(PYTEST_ARGS)

test-all: setup ## every test (what CI runs): the fast tier on TEST_JOBS workers, then the slow tier
	@# both tiers run whatever the first gives, so one CI run shows every failure
	$(PY) -m pytest -m "not slow" -n $(TEST_JOBS) --durations=25 $(PYTEST_ARGS); fast=$$?; \
	$(PY) -m pytest -m slow -n 0 --durations=25 $(PYTEST_ARGS); slow=$$?; \
	exit $$(( fast ? fast : slow ))

lint: setup ## ruff check
	$(PY) -m ruff check .

clean: ## remove the venv and caches (results/ is kept)
	rm -rf $(VENV) .pytest_cache
