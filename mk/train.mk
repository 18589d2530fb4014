# Training (issue 3): one entry point for both arms, experiments/train.py.
#   make train ARGS="model=16M model.latent_bits=16 model.kappa_bits=0.5"  [DRY=1] [NPROC=2]
# DRY=1 prints params, FLOPs/token of both arms, FT overhead, tokens, steps and batch, then exits.
# NPROC=n runs n processes through torchrun (DDP; gloo on CPU, nccl on GPUs).
.PHONY: train train-test
TRAIN_LAUNCH = $(if $(NPROC),$(PY) -m torch.distributed.run --standalone --nproc_per_node $(NPROC) -m experiments.train,$(PY) -m experiments.train)

train: setup ## train one run: make train ARGS="model=1M model.latent_bits=16 ..." [DRY=1] [NPROC=2]
	$(TRAIN_LAUNCH) $(ARGS) $(if $(filter-out 0,$(DRY)),train.dry_run=true)

train-test: setup ## run the training, data and tokenizer tests only
	$(PY) -m pytest tests/test_train.py tests/test_data.py tests/test_tokenizer.py $(PYTEST_ARGS)
