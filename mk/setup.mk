# Setup: .venv with torch pinned first, then the project with its extras, then evalplus without
# its own requirements (they pull openai, anthropic and google-generativeai; what it needs at run
# time is in pyproject). System tools: bubblewrap (the code sandbox) and Chromium (the report's
# render check) are installed with apt when we are root, else named in one line each; without
# Chromium the browser tests skip and say why, without bubblewrap code evaluation is refused
# unless FTBENCH_SANDBOX=weak.
#
# Why pip runs only when something is missing (mk/venv.py setup): most compute nodes have no
# package registry, and a date (a checkout touching pyproject.toml) says nothing about what the
# venv holds. The stamp records a hash of what pyproject.toml declares (its dependency lists) and
# the pins below; while it matches, the venv's interpreter is not even started. When it does not, the venv
# is asked whether it meets those requirements and imports the project; pip runs only if not.
#   TORCH_INDEX=https://download.pytorch.org/whl/cu126   the torch build for an older driver
#                (default PyPI's, a CUDA 13 build that needs driver >= 580); given for an existing
#                venv whose torch is another build (+cpu, +cu130), torch is reinstalled from it
#   PYTHON=/path/to/python   an environment we did not build (a node's own torch): checked, never
#                installed into; what it lacks comes from `make offline-bundle`
# On a host where GPUs are visible (nvidia-smi lists some, CUDA_VISIBLE_DEVICES or SLURM's GPU
# variables name some), setup then checks that torch sees them (after installing, with PYTHON=
# each time, and on `make setup`), else stops in one line naming the driver and torch's CUDA.
.PHONY: setup offline-bundle
SYSTEM_TOOLS := bwrap:bubblewrap chromium:chromium prlimit:util-linux setpriv:util-linux
# What a node that has torch (and the usual numpy/pandas/scipy/tokenizers/tensorboard stack) but
# no registry still lacks, all pure Python (~9 MB; found on an H100 image with torch 2.11+cu130,
# 2026-11). antlr4-python3-runtime has no wheel on PyPI: it is built here from its sdist.
BUNDLE_PINS := hydra-core==1.3.8 omegaconf==2.3.1 lm_eval==0.4.13 dill==0.4.1
BUNDLE_SDIST_PINS := antlr4-python3-runtime==4.9.3
SETUP_ARGS = --venv $(call shq,$(VENV)) --torch $(TORCH_PIN) --evalplus $(EVALPLUS_PIN) \
  --extras dev,bench $(call opt,TORCH_INDEX,--torch-index) \
  $(if $(or $(call given,PYTHON),$(call given,PY)),--python=$(call shq,$(PY))) \
  --bundle $(BUNDLE_PINS) $(BUNDLE_SDIST_PINS) --tools $(SYSTEM_TOOLS) \
  $(if $(filter setup,$(MAKECMDGOALS)),--gpu)
KNOWN_setup :=

setup: ## create or check .venv (pip only when pyproject's requirements are unmet): [TORCH_INDEX= PYTHON=]
	@$(PY_SYS) mk/venv.py setup $(SETUP_ARGS)

# The bundle for an offline node, made where a registry is reachable:
#   make offline-bundle OUT=<dir> [PY_VERSION=3.12] [PLATFORM=any]
# then, on the node (its python holds torch; --target <dir>/site with PYTHONPATH if read-only):
#   python3 -m pip install --no-index --no-deps <dir>/*.whl && make gpu-check PYTHON=python3
KNOWN_offline-bundle := OUT PY_VERSION PLATFORM
BUNDLE_PY = $(or $(call arg,PY_VERSION),$(shell $(PY_SYS) -c 'import sys; print("%d.%d" % sys.version_info[:2])'))

offline-bundle: setup ## wheels a node with torch but no registry needs: OUT=<dir> [PY_VERSION=3.12 PLATFORM=any]
	@$(if $(call arg,OUT),,echo "make offline-bundle: set OUT=<directory>" >&2; exit 2)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(call shq,$(BUNDLE_PY)) \
	  --platform $(call shq,$(or $(call arg,PLATFORM),any)) -d $(call shq,$(OUT)) $(BUNDLE_PINS)
	$(PY) -m pip wheel -q --no-deps -w $(call shq,$(OUT)) $(BUNDLE_SDIST_PINS)
	@echo "offline-bundle: $$(ls $(call shq,$(OUT))/*.whl | wc -l) wheels in $(OUT) for Python" \
	  "$(BUNDLE_PY); on the node: python3 -m pip install --no-index --no-deps $(OUT)/*.whl &&" \
	  "make gpu-check PYTHON=python3"
