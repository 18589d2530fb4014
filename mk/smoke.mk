# The smoke test: the whole pipeline in under 2 minutes on 2 CPU cores, offline, with nothing
# from outside the repository. A baseline and a Free Transformer (preset 1M, H=4, kappa 2 bits,
# SMOKE_TOKENS tokens each, on a 2 MB slice of the embedded stdlib corpus) are trained through
# the sweep, each evaluated on a few items of the benchmark sample the repository ships
# (experiments/eval/smoke_data: checksummed), then the report is built and its path printed.
# The numbers mean nothing at this size: it checks that everything runs, first time.
SMOKE_NAME := smoke
SMOKE_TOKENS := 16k
SMOKE_TASKS := arc_easy,gsm8k
SMOKE_LIMIT := 5
SMOKE_DATA := $(CURDIR)/experiments/eval/smoke_data
SMOKE_OFFLINE = HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
.PHONY: smoke
# its sweep takes OVERRIDES and the rest from here: none of the user's reach it
KNOWN_smoke := SMOKE_NAME SMOKE_TOKENS SMOKE_TASKS SMOKE_LIMIT SMOKE_DATA

smoke: setup ## the whole pipeline in < 2 min, offline, nothing outside the repo: train, eval, report
	$(SMOKE_OFFLINE) $(MAKE) --no-print-directory sweep NAME=$(SMOKE_NAME) KAPPA=2 H=4 SEEDS=0 \
	  PRESET=1M DATA=stdlib TOKENS=$(SMOKE_TOKENS) CONTROLS= EVAL=1 \
	  OVERRIDES="data.max_bytes=2000000 data.val_tokens=4096 logging.val_every=0" \
	  EVAL_ARGS="--tasks $(SMOKE_TASKS) --limit $(SMOKE_LIMIT) --max-gen-toks 16 --data $(SMOKE_DATA)"
	$(MAKE) --no-print-directory report NAME=$(SMOKE_NAME)
	@echo "smoke: done; report: $$(realpath $${FTBENCH_RESULTS:-results}/sweeps/$(SMOKE_NAME)/report.html)"
