# The study (docs/STUDY.md): the suite's first finding, one command, offline, on 2 CPU cores,
# resumable (pipelines/study.py says what each stage does).
#   make study [STUDY_SIZE=full|tiny] [STUDY_NAME=] [BENCH_DATA=<dir>] [JOBS=n] [STUDY_DOCS=<dir>]
#              [DRY=1] [ALLOW_DIRTY=1]     tiny: the same pipeline at a test size (CI)
#   make study-render                      docs/STUDY.md from the committed docs/study/ tables
# The tables go to docs/study/ (full) or results/sweeps/<name>/docs/study/ (other sizes, so a
# test run never overwrites the committed ones). ALLOW_DIRTY=1 trains from uncommitted changes
# to tracked source (refused otherwise) and marks the cells (dirty.json). BENCH_DATA: else
# $FTBENCH_DATA, else (tiny) the repository's sample; full needs one of the two.
.PHONY: study study-render
STUDY_OFFLINE = HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
KNOWN_study := STUDY_SIZE STUDY_NAME BENCH_DATA JOBS STUDY_DOCS DRY ALLOW_DIRTY
KNOWN_study-render :=

study: setup ## the first finding, offline, resumable (~90 min on 2 cores): [STUDY_SIZE=full|tiny STUDY_NAME= BENCH_DATA= JOBS= DRY=1]
	$(STUDY_OFFLINE) $(PY) -m pipelines.study run $(call opt,STUDY_SIZE,--size) \
	  $(call opt,STUDY_NAME,--name) $(call opt,BENCH_DATA,--bench-data) \
	  $(call opt,JOBS,--jobs) $(call opt,STUDY_DOCS,--docs) $(if $(call on,DRY),--dry) \
	  $(if $(call on,ALLOW_DIRTY),--allow-dirty)

study-render: setup ## docs/STUDY.md from the committed tables in docs/study/
	$(PY) -m pipelines.study render
