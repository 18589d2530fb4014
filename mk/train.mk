# Training: one entry point for both arms, experiments/train/trainer.py.
#   make train OVERRIDES="model=16M model.latent_bits=16 model.kappa_bits=0.5"  [DRY=1] [NPROC=2]
#   make train HELP=1        every config key with its default and its docstring
# DRY=1 prints params, FLOPs/token of both arms, FT overhead, tokens, steps, batch and an
# estimated wall time, then exits. NPROC=n runs n processes through torchrun (gloo on CPU, nccl
# on GPUs). OVERRIDES is hydra's override list: quote it whole. DRY and HELP are booleans
# (1/true/yes, 0/false/no or empty; docs/MAKE.md).
.PHONY: train
TRAIN_LAUNCH = $(if $(call arg,NPROC),$(PY) -m torch.distributed.run --standalone \
  --nproc_per_node $(call shq,$(NPROC)) -m experiments.train,$(PY) -m experiments.train)

train: setup ## train one run: OVERRIDES="model=1M model.latent_bits=16 ..." [DRY=1] [NPROC=2] [HELP=1]
	$(if $(call on,HELP),$(PY) -m experiments.train --help,\
	  $(TRAIN_LAUNCH) $(call arg,OVERRIDES) $(if $(call on,DRY),train.dry_run=true))
