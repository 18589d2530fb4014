# The first-GPU-node smoke test: bf16 + flash SDPA + compile on both arms, loss vs fp32,
# tokens/s and MFU on one GPU, the mapper's share of a step (about 5 min).
#   make gpu-check [PRESET=16M] [STEPS=30] [TOL=0.05]     -> results/gpu_check/<ts>.json
# DDP and FSDP on 1 node and on 2 nodes simulated as two torchrun agents (c10d, each its half of
# the GPUs) against one process, with the resume round trip. Without a GPU it exits 2 with one
# line.
# GPU_CHECK_CPU=1: the reduced mode on CPU (gloo, preset 1M): DDP and FSDP on 1 node and on 2
# nodes simulated as two torchrun agents on localhost (c10d), the checkpoint resume round trip
# and the bf16 export -> results/gpu_check/cpu-<ts>.json
#
# The paper's shape, the first command on a new cluster (under 10 min at paper-1.5B):
#   make gpu-check RECIPE=paper-1.5B [STEPS=20]  -> measured/gpu_check/<ts>-<gpu>-<recipe>.json
# the recipe's vocabulary, context, micro-batch per GPU, precision, compile and parallelism on
# random tokens, for STEPS steps with validations, a checkpoint and a resume from it; the
# allocator's peak per phase (train, validation, evaluation batch, save) beside the plan's
# fake-tensor figures (experiments/memory.py), tokens/s and MFU, which the dry runs then read
# (train.mfu). A model that does not fit the GPUs present (8B on one) keeps its widths and loses
# layers, and says so. With GPU_CHECK_CPU=1 it rehearses the flow on CPU (no peaks, no speed),
# e.g. at a tiny width: OVERRIDES="model=1M model.vocab_size=4096 train.seq_len=256
# model.max_seq_len=256".
.PHONY: gpu-check
KNOWN_gpu-check := PRESET STEPS TOL RECIPE GPU_CHECK_CPU OVERRIDES

gpu-check: setup ## smoke-test a GPU node: bf16, flash, compile, DDP, FSDP, MFU [RECIPE= PRESET STEPS TOL GPU_CHECK_CPU=1 OVERRIDES]
	$(PY) -m pipelines.gpu_check $(call opt,PRESET,--preset) $(call opt,STEPS,--steps) \
	  $(call opt,TOL,--tol) $(call opt,RECIPE,--recipe) $(if $(call on,GPU_CHECK_CPU),--cpu) \
	  $(if $(call given,OVERRIDES),--set $(call arg,OVERRIDES))
