# The paper's synthetic experiment (section 4.1, Figure 4).
# make synthetic                           default CPU setting, kappa 1/64 1/8 1 8 bits + baseline
# make synthetic SYN_KAPPA="1/8 1" SYN_NAME=mid SYN_SETTING=gpu OVERRIDES="train.seed=1"
# (OVERRIDES: hydra overrides of experiments.train for every arm, as on make train and sweep)
SYN_NAME := default
SYN_SETTING := cpu
SYN_KAPPA := 1/64 1/8 1 8
.PHONY: synthetic synthetic-report synthetic-gpu

synthetic: setup ## synthetic task: train FT at each kappa + baseline, then table + Figure-4 PNG
	$(PY) -m experiments.synthetic --name $(call shq,$(SYN_NAME)) \
	  --setting $(call shq,$(SYN_SETTING)) --kappa $(call shq,$(SYN_KAPPA)) $(call arg,OVERRIDES)
	$(PY) -m analysis.synthetic --name $(call shq,$(SYN_NAME))

synthetic-gpu: setup ## synthetic task, the larger setting for a GPU (results/synthetic/gpu)
	$(MAKE) synthetic SYN_SETTING=gpu SYN_NAME=gpu

synthetic-report: setup ## re-render table + figure from results/synthetic/$(SYN_NAME)/samples.jsonl
	$(PY) -m analysis.synthetic --name $(call shq,$(SYN_NAME))
