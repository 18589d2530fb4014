# Tests. `make test` is the fast tier (tests not marked slow), spread over TEST_JOBS pytest-xdist
# workers (default 2; TEST_JOBS=0 runs it in one process). `make test-all` is what CI (.ci/run)
# runs: every test but the `serial` ones on TEST_JOBS workers (a module stays on one worker, so
# its module fixtures are built once), then the serial ones in one process (several processes of
# their own, SLURM, timing: tests/conftest.py names them), each part printing its 25 slowest
# tests. Every test has a timeout (pytest-timeout: pyproject's `timeout` for the fast tier,
# tests/conftest.py's for the slow one, @pytest.mark.timeout beside a longer test), so a hang
# fails that test, not CI's 90 minutes. PYTEST_ARGS passes options on.
.PHONY: test test-all lint clean
PYTEST_ARGS :=
TEST_JOBS := 2
KNOWN_test := TEST_JOBS PYTEST_ARGS
KNOWN_test-all := TEST_JOBS PYTEST_ARGS
KNOWN_lint :=
KNOWN_clean :=

test: setup ## the fast test tier (not marked slow) on TEST_JOBS=2 workers (about 2 min on 2 cores, measured)
	$(PY) -m pytest -m "not slow" -n $(TEST_JOBS) $(PYTEST_ARGS)

test-all: setup ## every test (what CI runs): all but the serial ones on TEST_JOBS workers, then those
	@# both parts run whatever the first gives, so one CI run shows every failure
	$(PY) -m pytest -m "not serial" -n $(TEST_JOBS) --dist loadscope --durations=25 \
	  $(PYTEST_ARGS); rest=$$?; \
	$(PY) -m pytest -m serial -n 0 --durations=25 $(PYTEST_ARGS); serial=$$?; \
	exit $$(( rest ? rest : serial ))

lint: setup ## ruff check
	$(PY) -m ruff check .

clean: ## remove the venv and caches (results/ is kept)
	rm -rf $(VENV) .pytest_cache
