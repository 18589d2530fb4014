# Evaluation (issue 5): lm-eval (GSM8K, MMLU, ARC-E/C, CommonsenseQA) + evalplus (HumanEval+,
# MBPP+) + gold-answer bits per byte, with the Free-Transformer-aware adapter.
#   make eval CKPT=results/runs/<id> [TASKS=gsm8k,mmlu] [LIMIT=20] [Z=prior|prior-k|posterior]
#             [K=4] [FEWSHOT=0] [DATA=<benchmarks dir>] [SEED=0] [GEN=<tokens>] [BS=16]
#             [THREADS=1]  (torch threads; 1 is several times faster on a shared, busy CPU)
# DATA (or $FTBENCH_DATA) = offline benchmark dir, checked against its sha256 sums; without it
# the stock datasets download as usual. GEN = generation budget (default 256, at most half the
# model's window; prompts are cut only when they alone fill the window, and every cut is
# recorded). Arguments and task names are checked first (one line, exit 2). Results: one file
# per spec, <run dir>/eval/<suite>[.<z>][.limit<n>].<spec_id>.step<N>.json, with the evalplus
# samples in eval/.evalplus/ and the offline task YAMLs in eval/.tasks/ (docs/RESULTS.md). A
# task that dies is recorded as null with its reason and the command exits 1. Re-running the
# same spec resumes from the request cache in <run dir>/eval/.cache.
.PHONY: eval eval-test hf-export
EVAL_ARGS_MK = $(if $(TASKS),--tasks $(TASKS)) $(if $(LIMIT),--limit $(LIMIT)) \
  $(if $(Z),--z $(Z)) $(if $(K),--k $(K)) $(if $(FEWSHOT),--fewshot $(FEWSHOT)) \
  $(if $(DATA),--data $(abspath $(DATA))) $(if $(SEED),--seed $(SEED)) \
  $(if $(GEN),--max-gen-toks $(GEN)) $(if $(BS),--batch-size $(BS)) \
  $(if $(THREADS),--threads $(THREADS))

eval: setup ## score a checkpoint: make eval CKPT=<run dir|.pt> [TASKS= LIMIT= Z= K= FEWSHOT= DATA=]
	@test -n "$(CKPT)" || { echo "usage: make eval CKPT=<run dir or checkpoint> [TASKS=...]" \
	  "[LIMIT=n] [Z=prior|prior-k|posterior] [K=k] [FEWSHOT=n] [DATA=<benchmarks dir>]"; exit 2; }
	$(if $(DATA),HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1) $(PY) -m experiments.eval $(CKPT) \
	  $(EVAL_ARGS_MK)

eval-test: setup ## run the evaluation tests only
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest tests/test_eval_adapter.py \
	  tests/test_eval_protocol.py \
	  tests/test_eval_tasks.py tests/test_eval_run.py tests/test_hf_export.py \
	  tests/test_sandbox.py tests/test_benchdata.py $(PYTEST_ARGS)

hf-export: setup ## export a baseline to HF LlamaForCausalLM: make hf-export CKPT=... OUT=dir
	@test -n "$(CKPT)" -a -n "$(OUT)" || { echo "usage: make hf-export CKPT=... OUT=dir"; exit 2; }
	$(PY) -m experiments.hf_export $(CKPT) $(OUT)
