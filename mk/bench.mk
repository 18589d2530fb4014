# Speed benchmarks: experiments/bench/.
.PHONY: bench bench-tiny
BENCH_SIZE := full
BENCH_ARGS :=
KNOWN_bench := BENCH_SIZE BENCH_ARGS
KNOWN_bench-tiny := BENCH_ARGS

bench: setup ## speed vs HF transformers / x-transformers -> results/bench/<ts>.json, docs/BENCH.md (BENCH_SIZE=tiny, BENCH_ARGS="--threads 1 --sections train,mapper")
	$(PY) -m experiments.bench --size $(call shq,$(BENCH_SIZE)) $(BENCH_ARGS)

bench-tiny: setup ## the bench at a tiny size, end to end in seconds (what tests/test_bench.py runs)
	$(PY) -m experiments.bench --size tiny --threads 1 $(BENCH_ARGS)

# The full evaluation of one checkpoint, one process per benchmark, timed (docs/BENCH.md):
#   make bench-eval CKPT=<run dir|.pt> BENCH_DATA=<dir> [TASKS=original|all|a,b] [WORKERS=2]
#                   [THREADS=1] [LIMIT=n] [OUT=<dir>]
# Re-running with the same OUT reuses the benchmarks that finished.
.PHONY: bench-eval
KNOWN_bench-eval := CKPT BENCH_DATA TASKS WORKERS THREADS LIMIT OUT
bench-eval: setup ## time the full evaluation of one checkpoint per benchmark: CKPT= BENCH_DATA= [TASKS=original|all] [WORKERS=2]
	@test -n $(call shq,$(call arg,CKPT)) -a -n $(call shq,$(call arg,BENCH_DATA)) || { echo \
	  "usage: make bench-eval CKPT=<run dir or checkpoint> BENCH_DATA=<benchmarks dir>" \
	  "[TASKS=original|all|a,b] [WORKERS=2] [THREADS=1] [LIMIT=n] [OUT=<dir>]"; exit 2; }
	$(PY) -m pipelines.full_eval $(call shq,$(CKPT)) \
	  --data=$(call shq,$(abspath $(BENCH_DATA))) $(call opt,TASKS,--tasks) \
	  $(call opt,WORKERS,--workers) $(call opt,THREADS,--threads) $(call opt,LIMIT,--limit) \
	  $(call opt,OUT,--out)
