# The Makefile is the menu: `make help` lists the targets in pipeline order (each mk/*.mk adds one
# area's targets; they are included below in that order).
#
# One convention for arguments (docs/MAKE.md): a user variable counts only when it is given on the
# command line, `make sweep NAME=main KAPPA="0.5 2"`. The environment never leaks in (WSL sets
# NAME, some tools set DATA), and every value reaches the program shell-quoted, quotes included.
# A boolean (DRY, HELP, EVAL, RETRY_FAILED, CHECK) is read one way (`flag` below); hydra
# overrides are OVERRIDES and the synthetic sweep's name SYN_NAME on every target.
SHELL := /bin/bash
PY_SYS := python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
EVALPLUS_PIN := evalplus==0.3.1
STAMP := $(VENV)/.setup-stamp

# $(call given,VAR): non-empty when VAR was given on the command line (set-but-empty counts).
given = $(filter command line,$(origin $1))
# $(call arg,VAR): VAR's value when given on the command line, else empty.
arg = $(if $(call given,$1),$($1))
# $(call shq,text): one shell word, whatever quotes the text holds.
shq = '$(subst ','\'',$1)'
# $(call opt,VAR,--flag): `--flag='value'` when VAR was given on the command line, else nothing.
opt = $(if $(call given,$1),$2=$(call shq,$($1)))
# $(call flag,VAR): a boolean given on the command line, read one way everywhere: 1 for
# 1/true/yes, 0 for 0/false/no or empty, nothing when VAR was not given; any other value stops
# make (one line naming VAR and the allowed values, exit 2) before any recipe runs.
TRUE_WORDS := 1 true yes
FALSE_WORDS := 0 false no
flag = $(if $(call given,$1),$(call _flag,$1,$(strip $($1))))
_flag = $(if $2,$(if $(and $(filter $(TRUE_WORDS),$2),$(if $(word 2,$2),,1)),1,$(if $(and \
  $(filter $(FALSE_WORDS),$2),$(if $(word 2,$2),,1)),0,$(error $1=$2: not a boolean; use \
  1/true/yes for true, 0/false/no or empty for false))),0)
# $(call flag_opt,VAR,--flag): `--flag='1'` or `--flag='0'` when VAR was given, else nothing.
flag_opt = $(if $(call given,$1),$2=$(call shq,$(call flag,$1)))
# $(call on,VAR): non-empty when VAR was given and reads true.
on = $(filter 1,$(call flag,$1))
FLAGS := DRY HELP EVAL RETRY_FAILED CHECK
FLAGS_READ := $(foreach v,$(FLAGS),$(call flag,$v))
# One name per thing on every target: hydra overrides are OVERRIDES, the synthetic sweep's name
# is SYN_NAME (docs/MAKE.md). The old names stop make with the new one.
ifneq ($(call given,SYN_ARGS),)
$(error SYN_ARGS: renamed OVERRIDES, the hydra overrides of every target: make synthetic OVERRIDES="train.seed=1")
endif
ifneq ($(call given,SYNTH),)
$(error SYNTH: renamed SYN_NAME, the synthetic sweep's name on every target: make report NAME=<sweep> SYN_NAME=<synthetic name>)
endif
ifneq ($(and $(call given,ARGS),$(filter-out lm-eval,$(or $(MAKECMDGOALS),help))),)
$(error ARGS: hydra overrides are OVERRIDES on every target, as in make train OVERRIDES="model=1M train.tokens=20k"; ARGS is only lm-eval's own flags, make lm-eval ARGS="--tasks ...")
endif
# `make train OVERRIDES=model=1M train.tokens=20k` without quotes makes `train.tokens` a make
# variable and drops it silently; any command-line variable whose name has a dot is such a stray
# key.
STRAY_KEYS := $(strip $(foreach v,$(.VARIABLES),$(if $(and $(call given,$v),$(findstring .,$v)),$v)))
ifneq ($(STRAY_KEYS),)
$(error $(STRAY_KEYS): looks like a config key outside OVERRIDES; quote them all, as in make train OVERRIDES="model=1M train.tokens=20k")
endif

.DEFAULT_GOAL := help
.PHONY: help

help: ## list the targets, in pipeline order
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}'

include mk/setup.mk mk/smoke.mk mk/demo.mk mk/corpus.mk mk/train.mk mk/sweep.mk mk/eval.mk \
  mk/probe.mk mk/report.mk mk/paper.mk mk/synthetic.mk mk/study.mk mk/calibrate.mk mk/bench.mk mk/gpu.mk \
  mk/test.mk
