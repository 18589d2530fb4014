# The first-GPU-node smoke test: bf16 + flash SDPA + compile on both arms, DDP and FSDP over all
# visible GPUs, loss vs fp32, tokens/s and MFU, the mapper's share of a step (about 5 min).
#   make gpu-check [PRESET=16M] [STEPS=30] [TOL=0.05]     -> results/gpu_check/<ts>.json
# DDP and FSDP also on 2 nodes simulated as two torchrun agents (c10d, each its half of the
# GPUs) with the resume round trip. Without a GPU it exits 2 with one line.
# GPU_CHECK_CPU=1: the reduced mode on CPU (gloo, preset 1M): DDP and FSDP on 1 node and on 2
# nodes simulated as two torchrun agents on localhost (c10d), the checkpoint resume round trip
# and the bf16 export -> results/gpu_check/cpu-<ts>.json
.PHONY: gpu-check

gpu-check: setup ## smoke-test a GPU node: bf16, flash, compile, DDP, FSDP, MFU [PRESET STEPS TOL GPU_CHECK_CPU=1]
	$(PY) -m pipelines.gpu_check $(call opt,PRESET,--preset) $(call opt,STEPS,--steps) \
	  $(call opt,TOL,--tol) $(if $(call on,GPU_CHECK_CPU),--cpu)
