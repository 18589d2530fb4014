# Speed benchmarks: experiments/bench/.
.PHONY: bench bench-tiny
BENCH_SIZE := full
BENCH_ARGS :=

bench: setup ## speed vs HF transformers / x-transformers -> results/bench/<ts>.json, docs/BENCH.md (BENCH_SIZE=tiny, BENCH_ARGS="--threads 1 --sections train,mapper")
	$(PY) -m experiments.bench --size $(call shq,$(BENCH_SIZE)) $(BENCH_ARGS)

bench-tiny: setup ## the bench at a tiny size, end to end in seconds (what tests/test_bench.py runs)
	$(PY) -m experiments.bench --size tiny --threads 1 $(BENCH_ARGS)
