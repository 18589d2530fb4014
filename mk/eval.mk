# Evaluation: lm-eval (GSM8K, MMLU, ARC-E/C, CommonsenseQA, ...) + evalplus (HumanEval+, MBPP+)
# + gold-answer bits per byte, with the Free-Transformer-aware adapter.
#   make eval CKPT=results/runs/<id> [TASKS=gsm8k,mmlu] [LIMIT=20] [Z=prior|prior-k|posterior]
#             [K=4] [FEWSHOT=0] [BENCH_DATA=<benchmarks dir>] [SEED=0] [GEN=<tokens>] [BS=16]
#             [THREADS=1]  (torch threads; 1 is several times faster on a shared, busy CPU)
#             [NPROC=2]    (data-parallel over torchrun processes)
# BENCH_DATA (or $FTBENCH_DATA) = offline benchmark dir, checked against its sha256 sums; without
# it the stock datasets download as usual. GEN = generation budget (default 256, at most half the
# model's window; prompts are cut only when they alone fill the window, and every cut is
# recorded). Arguments, task names, the checkpoint and the output dir are checked first (one
# line, exit 2, nothing written). Results: one file per spec,
# <run dir>/eval/<suite>[.<z>][.limit<n>].<spec_id>.step<N>.json, lm-eval's own results JSON and
# per-sample JSONL beside it in <that name>.lm_eval/<run id>/, the evalplus samples in
# eval/.evalplus/ and the offline task YAMLs in eval/.tasks/ (docs/RESULTS.md). A task that dies
# is recorded as null with its reason and the command exits 1. Re-running the same spec resumes
# from the request cache in <run dir>/eval/.cache.
#   make lm-eval CKPT=<run dir|.pt> [BENCH_DATA=<dir>] ARGS="--tasks arc_easy --limit 20 ..."
# runs lm-eval's own CLI (`lm_eval run`, any of its flags in ARGS) with our model registered as
# `ftbench` (--model ftbench --model_args checkpoint=...; more model args via
# ARGS="--model_args z=prior-k,k=4"); the device is cuda when there is one, else cpu.
#   make tasks BENCH_DATA=<dir> [OUT=results/lm_eval_tasks]
# writes the offline task YAMLs (stock task names, local verified files) for any lm-eval backend:
# lm_eval --model hf ... --include_path results/lm_eval_tasks.
# NPROC=n scores over n processes through torchrun (gloo on CPU, NCCL on GPU): rank 0 runs
# lm-eval and writes every file, each rank scores its share of every batch of requests, and the
# items equal one process's. The window is the run's trained train.seq_len (recorded in the
# spec as `context`); on CUDA the model runs under bf16 autocast; only the weights load.
.PHONY: eval hf-export lm-eval tasks
KNOWN_eval := CKPT NPROC BENCH_DATA TASKS LIMIT Z K FEWSHOT SEED GEN BS THREADS
KNOWN_hf-export := CKPT OUT
KNOWN_lm-eval := CKPT ARGS BENCH_DATA
KNOWN_tasks := BENCH_DATA OUT
EVAL_LAUNCH = $(if $(call arg,NPROC),$(PY) -m torch.distributed.run --standalone \
  --nproc_per_node $(call shq,$(NPROC)) -m experiments.eval,$(PY) -m experiments.eval)
EVAL_OPTS = $(call opt,TASKS,--tasks) $(call opt,LIMIT,--limit) $(call opt,Z,--z) \
  $(call opt,K,--k) $(call opt,FEWSHOT,--fewshot) \
  $(if $(call arg,BENCH_DATA),--data=$(call shq,$(abspath $(BENCH_DATA)))) \
  $(call opt,SEED,--seed) $(call opt,GEN,--max-gen-toks) $(call opt,BS,--batch-size) \
  $(call opt,THREADS,--threads)

eval: setup ## score a checkpoint: CKPT=<run dir|.pt> [TASKS= LIMIT=n (per task; per subject in mmlu) Z= K= FEWSHOT= BENCH_DATA= NPROC=]
	@test -n $(call shq,$(call arg,CKPT)) || { echo "usage: make eval CKPT=<run dir or checkpoint>" \
	  "[TASKS=...] [LIMIT=n] [Z=prior|prior-k|posterior] [K=k] [FEWSHOT=n]" \
	  "[BENCH_DATA=<benchmarks dir>]"; exit 2; }
	$(if $(call arg,BENCH_DATA),HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1) \
	  $(EVAL_LAUNCH) $(call shq,$(CKPT)) $(EVAL_OPTS)

hf-export: setup ## export a baseline to HF LlamaForCausalLM: CKPT=<run dir|.pt> OUT=<dir>
	@test -n $(call shq,$(call arg,CKPT)) -a -n $(call shq,$(call arg,OUT)) || { \
	  echo "usage: make hf-export CKPT=<run dir or checkpoint> OUT=<dir>"; exit 2; }
	$(PY) -m experiments.eval.hf_export $(call shq,$(CKPT)) $(call shq,$(OUT))

lm-eval: setup ## lm-eval's own CLI on a checkpoint: CKPT=<run dir|.pt> ARGS="--tasks .. --limit .." [BENCH_DATA=]
	@test -n $(call shq,$(call arg,CKPT)) -a -n $(call shq,$(call arg,ARGS)) || { echo "usage: make" \
	  "lm-eval CKPT=<run dir or checkpoint> ARGS=\"--tasks arc_easy --limit 20 ...\"" \
	  "[BENCH_DATA=<benchmarks dir>]"; exit 2; }
	$(if $(call arg,BENCH_DATA),HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1) \
	  $(PY) -m experiments.eval.lm_eval_cli --ckpt=$(call shq,$(CKPT)) \
	  $(if $(call arg,BENCH_DATA),--data=$(call shq,$(abspath $(BENCH_DATA)))) $(call arg,ARGS)

tasks: setup ## write the offline lm-eval task YAMLs: BENCH_DATA=<dir> [OUT=results/lm_eval_tasks]
	@test -n $(call shq,$(call arg,BENCH_DATA)) || { echo "usage: make tasks" \
	  "BENCH_DATA=<benchmarks dir> [OUT=<dir>, default results/lm_eval_tasks]"; exit 2; }
	$(PY) -m experiments.eval.tasks $(call shq,$(abspath $(BENCH_DATA))) \
	  $(if $(call arg,OUT),$(call shq,$(OUT)))
