# The Makefile is the menu: `make help` lists the targets in pipeline order (each mk/*.mk adds one
# area's targets; they are included below in that order).
#
# One convention for arguments: a user variable counts only when it is given on the command line,
# `make sweep NAME=main KAPPA="0.5 2"`. The environment never leaks in (WSL sets NAME, some tools
# set DATA), and every value reaches the program shell-quoted, quotes included.
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
# `make train ARGS=model=1M train.tokens=20k` without quotes makes `train.tokens` a make variable
# and drops it silently; any command-line variable whose name has a dot is such a stray key.
STRAY_KEYS := $(strip $(foreach v,$(.VARIABLES),$(if $(and $(call given,$v),$(findstring .,$v)),$v)))
ifneq ($(STRAY_KEYS),)
$(error $(STRAY_KEYS): looks like a config key outside ARGS (or SYN_ARGS, OVERRIDES); quote them all, as in make train ARGS="model=1M train.tokens=20k")
endif

.DEFAULT_GOAL := help
.PHONY: help

help: ## list the targets, in pipeline order
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}'

include mk/setup.mk mk/smoke.mk mk/demo.mk mk/train.mk mk/sweep.mk mk/eval.mk mk/report.mk \
  mk/synthetic.mk mk/calibrate.mk mk/bench.mk mk/gpu.mk mk/test.mk
