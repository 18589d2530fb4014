# The first-GPU-node smoke test: bf16 + flash SDPA + compile on both arms, DDP and FSDP over all
# visible GPUs, loss vs fp32, tokens/s and MFU, the mapper's share of a step (about 5 min).
#   make gpu-check [PRESET=16M] [STEPS=30] [TOL=0.05]     -> results/gpu_check/<ts>.json
# Without a GPU it exits 2 with one line.
.PHONY: gpu-check

gpu-check: setup ## smoke-test a GPU node: bf16, flash, compile, DDP, FSDP, MFU [PRESET STEPS TOL]
	$(PY) -m experiments.gpu_check $(call opt,PRESET,--preset) $(call opt,STEPS,--steps) \
	  $(call opt,TOL,--tol)
