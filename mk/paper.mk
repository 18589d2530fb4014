# The paper as one command (pipelines/paper.py, docs/RECIPES.md): corpus -> sweep with the
# evaluations along training -> report, each stage resumable; a second run does no work.
#   make paper RECIPE=paper-1.5B DRY=1                 the whole plan: what the recipe fills in,
#                                                      corpus, cells, GPU-hours, disk, eval cost
#   make paper RECIPE=paper-1.5B LAUNCHER=slurm CLUSTER=sweeps/cluster.yaml [GPU=H100-80GB]
#   make paper RECIPE=cpu-mini BENCH_DATA=experiments/eval/smoke_data EVAL_ARGS="--limit 2"
# Other knobs: NAME SEEDS GPUS (plan for this many GPUs) JOBS WORKERS (corpus) OVERRIDES
# LIKELIHOOD_ROWS RETRY_FAILED=1. Without BENCH_DATA the benchmarks are the stock online ones.
# ALLOW_DIRTY=1: train from a working tree with uncommitted changes to tracked source (refused
# otherwise); the cells are marked with the diff's hash (dirty.json).
.PHONY: paper

PAPER_VARS := RECIPE:recipe NAME:name LAUNCHER:launcher CLUSTER:cluster JOBS:jobs SEEDS:seeds \
  GPU:gpu GPUS:gpus BENCH_DATA:bench-data EVAL_ARGS:eval-args LIKELIHOOD_ROWS:likelihood-rows \
  WORKERS:workers OVERRIDES:overrides
KNOWN_paper := $(call names,$(PAPER_VARS)) RETRY_FAILED DRY ALLOW_DIRTY

paper: setup ## the paper's protocol in one command: RECIPE=paper-1.5B|paper-8B|paper-8B-1T|cpu-mini [LAUNCHER=slurm CLUSTER= GPU= DRY=1]
	$(if $(call on,ALLOW_DIRTY),FTBENCH_ALLOW_DIRTY=1) $(PY) -m pipelines.paper $(foreach v,$(PAPER_VARS),$(call opt,$(word 1,$(subst :, ,$v)),--$(word 2,$(subst :, ,$v)))) \
	  $(if $(call on,RETRY_FAILED),--retry-failed) $(if $(call on,DRY),--dry)
