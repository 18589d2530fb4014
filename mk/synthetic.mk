# The paper's synthetic experiment (section 4.1, Figure 4).
# make synthetic                           default CPU setting, kappa 1/64 1/8 1 8 bits + baseline
# make synthetic SYN_KAPPA="1/8 1" SYN_NAME=mid SYN_SETTING=gpu OVERRIDES="train.seed=1"
# (OVERRIDES: hydra overrides of experiments.train for every arm, as on make train and sweep)
# make synthetic-seeds SYN_SEEDS="0 1 2"  one run per seed (<SYN_NAME>-s<seed>), all at once (SYN_JOBS=N:
#                                         N at once; each seed's log in results/synthetic/), then the per-seed
#                                         and mean tables (results/synthetic/<SYN_NAME>-seeds)
# make synthetic-doc                      those tables into measured/synthetic/<SYN_SETTING>, and
#                                         docs/SYNTHETIC.md re-rendered from them (docs/SYNTHETIC.md)
SYN_NAME := default
SYN_SETTING := cpu
SYN_KAPPA := 1/64 1/8 1 8
SYN_SEEDS := 0 1 2
syn_seed_names = $(foreach s,$(SYN_SEEDS),$(call shq,$(SYN_NAME)-s$(s)))
.PHONY: synthetic synthetic-report synthetic-gpu synthetic-seeds synthetic-doc
KNOWN_synthetic := SYN_NAME SYN_SETTING SYN_KAPPA OVERRIDES
KNOWN_synthetic-gpu := SYN_KAPPA OVERRIDES
KNOWN_synthetic-report := SYN_NAME
KNOWN_synthetic-seeds := SYN_NAME SYN_SEEDS SYN_JOBS SYN_SETTING SYN_KAPPA OVERRIDES
KNOWN_synthetic-doc := SYN_NAME SYN_SEEDS SYN_SETTING

synthetic: setup ## synthetic task: train FT at each kappa + baseline, then table + Figure-4 PNG
	$(PY) -m experiments.synthetic --name $(call shq,$(SYN_NAME)) \
	  --setting $(call shq,$(SYN_SETTING)) --kappa $(call shq,$(SYN_KAPPA)) $(call arg,OVERRIDES)
	$(PY) -m analysis.synthetic --name $(call shq,$(SYN_NAME))

synthetic-gpu: setup ## synthetic task, the larger setting for a GPU (results/synthetic/gpu)
	$(MAKE) synthetic SYN_SETTING=gpu SYN_NAME=gpu

synthetic-report: setup ## re-render table + figure from results/synthetic/$(SYN_NAME)/samples.jsonl
	$(PY) -m analysis.synthetic --name $(call shq,$(SYN_NAME))

synthetic-seeds: setup ## synthetic task once per seed in SYN_SEEDS (SYN_JOBS at once, default all), then per-seed and mean tables
	$(PY) -m pipelines.synthetic_seeds --name $(call shq,$(SYN_NAME)) --seeds $(call shq,$(SYN_SEEDS)) \
	  $(call opt,SYN_JOBS,--jobs) --setting $(call shq,$(SYN_SETTING)) --kappa $(call shq,$(SYN_KAPPA)) \
	  $(call arg,OVERRIDES)
	$(PY) -m analysis.synthetic --names $(syn_seed_names) \
	  --out "$${FTBENCH_RESULTS:-results}"/synthetic/$(call shq,$(SYN_NAME))-seeds

synthetic-doc: setup ## the seeds' tables into measured/synthetic/<setting>, docs/SYNTHETIC.md re-rendered
	$(PY) -m analysis.synthetic --names $(syn_seed_names) --out measured/synthetic/$(call shq,$(SYN_SETTING))
	$(PY) -m analysis.synthetic render-doc
