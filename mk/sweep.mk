# Sweeps: the grid over kappa x H x seed (+ controls) through submitit, sweeps/.
#   make sweep KAPPA="0.5 2 4" H="16" SEEDS="0 1 2"           local, JOBS at once (default 1 per core)
#   make sweep KAPPA="0.5 2 4" DRY=1                           grid, per-cell and total FLOPs only
#   make sweep ... LAUNCHER=slurm                              job array; needs sweeps/cluster.yaml
#   make sweep ... CONTROLS="flops plus1 plus1_flops" EVAL=1 NAME=main
#                                                              equal-compute arms, chained eval jobs
#     (EVAL_ARGS and task names are checked when the sweep is planned, DRY=1 too; a failed
#      evaluation is a failure in the summary and the exit code)
#   make sweep ... EVAL=1 EVAL_POINTS=6                          keep 6 evenly spaced checkpoints
#     (train.keep_eval_checkpoints) and evaluate each as it appears, while training goes on
#     (a one-node point job per checkpoint; the final one by the chained eval after training):
#     the report's curves and Table-3 pair (final value, mean over the last third); the chained
#     eval also writes the validation likelihood on LIKELIHOOD_ROWS rows (default 8; 0 = skip)
#   make sweep RECIPE=paper-1.5B EVAL=1 [SEEDS= GPU=H100-80GB]   a recipe's grid, settings and
#     evaluation (docs/RECIPES.md); KAPPA H PRESET DATA TOKENS FLOPS CONTROLS come from it
#   make sweep-status NAME=main                                pending/running (live step from
#                                                              metrics.jsonl, tokens/s, ETA)/done/failed
#   make sweeps                                                the sweeps present (python -m sweeps list)
# Re-running the same command skips done cells, resumes interrupted ones, and reruns failed ones
# only with RETRY_FAILED=1. Variables not given take the defaults of `python -m sweeps run -h`;
# given but empty (KAPPA="") they are passed on, and rejected as an empty grid. EVAL, DRY and
# RETRY_FAILED are booleans (1/true/yes, 0/false/no or empty; docs/MAKE.md), passed as 1 or 0.
# Other knobs: PRESET DATA (training corpus) TOKENS|FLOPS OVERRIDES="optim.lr=..."
# EVAL_ARGS="--limit 20" CLUSTER=...
.PHONY: sweep sweep-status sweeps

SWEEP_VARS := KAPPA:kappa H:h SEEDS:seeds PRESET:preset DATA:data TOKENS:tokens FLOPS:flops \
  CONTROLS:controls OVERRIDES:overrides NAME:name LAUNCHER:launcher JOBS:jobs \
  EVAL_ARGS:eval-args EVAL_POINTS:eval-points LIKELIHOOD_ROWS:likelihood-rows CLUSTER:cluster \
  RECIPE:recipe GPU:gpu
SWEEP_FLAGS := EVAL:eval DRY:dry RETRY_FAILED:retry-failed
KNOWN_sweep := $(call names,$(SWEEP_VARS) $(SWEEP_FLAGS))
KNOWN_sweep-status := NAME
KNOWN_sweeps :=
SWEEP_OPTS = $(foreach v,$(SWEEP_VARS),$(call opt,$(word 1,$(subst :, ,$v)),--$(word 2,$(subst :, ,$v)))) \
  $(foreach v,$(SWEEP_FLAGS),$(call flag_opt,$(word 1,$(subst :, ,$v)),--$(word 2,$(subst :, ,$v))))

sweep: setup ## grid of baseline + Free Transformers: KAPPA="0.5 2 4" H=16 SEEDS="0 1 2" [PRESET DATA TOKENS|FLOPS CONTROLS NAME LAUNCHER=local|slurm JOBS EVAL=1 EVAL_POINTS=n DRY=1 RETRY_FAILED=1]
	$(PY) -m sweeps run $(SWEEP_OPTS)

sweep-status: setup ## a sweep's pending, running (live step, tokens/s, ETA), done and failed cells: NAME=<sweep>
	@test -n $(call shq,$(call arg,NAME)) || { echo "usage: make sweep-status NAME=<sweep>; sweeps here:" \
	  $$(ls $${FTBENCH_RESULTS:-results}/sweeps 2>/dev/null); exit 2; }
	@$(PY) -m sweeps status $(call shq,$(NAME))

sweeps: setup ## the sweeps present: name, grid, cells done, last change
	@$(PY) -m sweeps list
