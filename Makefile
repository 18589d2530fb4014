# The Makefile is the menu: `make help` lists the targets in pipeline order (each mk/*.mk adds one
# area's targets; they are included below in that order).
#
# One convention for arguments (docs/MAKE.md): a user variable counts only when it is given on the
# command line, `make sweep NAME=main KAPPA="0.5 2"`. The environment never leaks in (WSL sets
# NAME, some tools set DATA), and every value reaches the program shell-quoted, quotes included.
# A boolean (DRY, HELP, EVAL, ...) is read one way (`flag` below); hydra overrides are OVERRIDES
# and the synthetic sweep's name SYN_NAME on every target. A variable that no target in the goal
# list takes is refused, naming the nearest one (KNOWN_<target> beside each target, end of file).
SHELL := /bin/bash
PY_SYS := python3
VENV := .venv
# PYTHON=/path/to/python runs every target on an environment we did not build (a node's own
# torch): setup then checks it and never installs (mk/setup.mk). PY is its name inside the files.
PYTHON :=
PY := $(or $(PYTHON),$(VENV)/bin/python)
TORCH_PIN := torch==2.13.0
EVALPLUS_PIN := evalplus==0.3.1
STAMP := $(VENV)/.setup-stamp
# such an environment has not installed the project: its processes import it from here
ifneq ($(filter command line,$(origin PYTHON) $(origin PY)),)
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
endif

# $(call given,VAR): non-empty when VAR was given on the command line (set-but-empty counts).
# With _TRACE_VARS=1 each question is printed while recipes expand: tests/test_make_flags.py
# checks that every variable a recipe reads is in its target's KNOWN_ table.
given = $(if $(_TRACING),$(info given[$(MAKELEVEL)]: $1))$(filter command line,$(origin $1))
# $(call arg,VAR): VAR's value when given on the command line, else empty.
arg = $(if $(call given,$1),$($1))
# $(call shq,text): one shell word, whatever quotes the text holds.
shq = '$(subst ','\'',$1)'
# $(call opt,VAR,--flag): `--flag='value'` when VAR was given on the command line, else nothing.
opt = $(if $(call given,$1),$2=$(call shq,$($1)))
# $(call names,A:a B:b): A B, the variables of a VAR:option table (SWEEP_VARS, PAPER_VARS)
names = $(foreach v,$1,$(word 1,$(subst :, ,$v)))
comma := ,
space := $() $()
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
FLAGS := DRY HELP EVAL RETRY_FAILED CHECK ALLOW_DIRTY GPU_CHECK_CPU
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

# colour only on a terminal: a pipe or a file gets plain text
help: ## list the targets, in pipeline order
	@if [ -t 1 ]; then on=$$'\e[36m' off=$$'\e[0m'; fi; \
	grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -v on="$$on" -v off="$$off" \
	  'BEGIN {FS = ":.*?## "}; {printf "  %s%-16s%s %s\n", on, $$1, off, $$2}'; \
	echo "Variables go on the command line (make sweep KAPPA=\"0.5 2\"); on every target also" \
	  "$(GLOBAL_VARS) (docs/MAKE.md)."
KNOWN_help :=

include mk/setup.mk mk/smoke.mk mk/demo.mk mk/corpus.mk mk/train.mk mk/sweep.mk mk/eval.mk \
  mk/probe.mk mk/report.mk mk/paper.mk mk/synthetic.mk mk/study.mk mk/calibrate.mk mk/bench.mk mk/gpu.mk \
  mk/test.mk

# A mistyped variable (`make sweep KAPA=1`, `SEED=1`, `kappa=1`) would otherwise be ignored and
# the default experiment run: any command-line variable that no target in the goal list takes
# stops make before any recipe, in one line naming the nearest known one (mk/venv.py unknown).
# Each target's table is KNOWN_<target>, beside it; GLOBAL_VARS are setup's, which every target
# runs first. Checked only in the make the user started: a sub-make gets the variables we pass.
GLOBAL_VARS := PYTHON VENV TORCH_INDEX
# make's own variables when given (make SHELL=... MAKEFLAGS=...), PY (PYTHON's name inside these
# files) and the tests' tracing switch pass too
MAKE_OWN_VARS := SHELL MAKEFLAGS MFLAGS GNUMAKEFLAGS MAKEFILES MAKEOVERRIDES MAKE MAKELEVEL \
  .SHELLFLAGS .RECIPEPREFIX VPATH PY _TRACE_VARS
ifeq ($(MAKELEVEL),0)
GOALS := $(or $(MAKECMDGOALS),$(.DEFAULT_GOAL))
KNOWN := $(sort $(GLOBAL_VARS) $(foreach g,$(GOALS),$(KNOWN_$g)))
UNKNOWN := $(strip $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $v)),\
  $(filter-out $(KNOWN) $(MAKE_OWN_VARS),$v))))
ifneq ($(UNKNOWN),)
# the targets that do take $1, comma-separated
TAKERS = $(subst $(space),$(comma),$(strip $(foreach t,$(patsubst KNOWN_%,%,$(filter KNOWN_%,\
  $(.VARIABLES))),$(if $(filter $1,$(KNOWN_$t)),$t))))
$(error $(or $(shell $(PY_SYS) mk/venv.py unknown $(call shq,$(GOALS)) $(call shq,$(KNOWN)) \
  $(call shq,$(GLOBAL_VARS)) $(foreach v,$(UNKNOWN),$(call shq,$v=$(call TAKERS,$v)))),$(UNKNOWN): unknown variable for make $(GOALS)))
endif
ifneq ($(_TRACE_VARS),)
$(info known: $(KNOWN))
endif
endif
_TRACING := $(_TRACE_VARS)
