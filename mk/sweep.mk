# Sweeps (issue 4): the grid over kappa x H x seed (+ controls) through submitit, sweeps/.
#   make sweep KAPPA="0.5 2 4" H="16" SEEDS="0 1 2"           local, JOBS at once (default 1 per core)
#   make sweep KAPPA="0.5 2 4" DRY=1                           grid, per-cell and total FLOPs only
#   make sweep ... LAUNCHER=slurm                              job array; needs sweeps/cluster.yaml
#   make sweep ... CONTROLS="flops plus1" EVAL=1 NAME=main     equal-compute arms, chained eval jobs
#     (EVAL_ARGS and task names are checked when the sweep is planned, DRY=1 too; a failed
#      evaluation is a failure in the summary and the exit code)
#   make sweep-status NAME=main                                pending/running/done/failed table
# Re-running the same command skips done cells, resumes interrupted ones, and reruns failed ones
# only with RETRY_FAILED=1. Variables left unset take the defaults of `python -m sweeps run -h`;
# set but empty (KAPPA="") they are passed on, and rejected as an empty grid.
# Other knobs: PRESET DATA TOKENS|FLOPS OVERRIDES="optim.lr=..." EVAL_ARGS="--limit 20" CLUSTER=...
.PHONY: sweep sweep-status sweep-test

SWEEP_VARS := KAPPA:kappa H:h SEEDS:seeds PRESET:preset DATA:data TOKENS:tokens FLOPS:flops \
  CONTROLS:controls OVERRIDES:overrides NAME:name LAUNCHER:launcher JOBS:jobs EVAL:eval \
  EVAL_ARGS:eval-args DRY:dry RETRY_FAILED:retry-failed CLUSTER:cluster
# --opt 'value' for each variable given on the command line or in the environment
SWEEP_ARGS = $(foreach v,$(SWEEP_VARS),$(if $(filter undefined,$(origin $(word 1,$(subst :, ,$(v))))),,--$(word 2,$(subst :, ,$(v)))='$($(word 1,$(subst :, ,$(v))))'))

sweep: setup ## grid of baseline + Free Transformers: KAPPA="0.5 2 4" H=16 SEEDS="0 1 2" [PRESET DATA TOKENS|FLOPS CONTROLS NAME LAUNCHER=local|slurm JOBS EVAL=1 DRY=1 RETRY_FAILED=1]
	$(PY) -m sweeps run $(SWEEP_ARGS)

sweep-status: setup ## table of a sweep's pending, running, done and failed cells: NAME=<sweep>
	@test -n "$(NAME)" || { echo "usage: make sweep-status NAME=<sweep>; sweeps here:" \
	  $$(ls $${FTBENCH_RESULTS:-results}/sweeps 2>/dev/null); exit 2; }
	@$(PY) -m sweeps status '$(NAME)'

sweep-test: setup ## run the sweep tests only
	$(PY) -m pytest tests/test_sweep.py tests/test_sweep_e2e.py $(PYTEST_ARGS)
