# Training: one entry point for both arms, experiments/train/trainer.py.
#   make train OVERRIDES="model=16M model.latent_bits=16 model.kappa_bits=0.5"  [DRY=1] [NPROC=2]
#   make train HELP=1        every config key with its default and its docstring
#   make train NPROC=8 NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0> [MASTER_PORT=29500]
#                            one of four nodes: torchrun's c10d rendezvous at MASTER_ADDR:PORT
#                            (run the same command on every node, NODE_RANK its own)
# DRY=1 prints params, FLOPs/token of both arms, FT overhead, tokens, steps, batch, memory per
# GPU, checkpoint size and an estimated wall time for NPROC x NNODES GPUs (else the cluster
# file's, else one), then the measured peak memory of each phase (training step, validation, an
# evaluation batch, a save; experiments/memory.py, on fake tensors, cached under paths.cache)
# beside the GPU's capacity, then exits; it launches nothing. NPROC=n runs n processes through torchrun
# (gloo on CPU, nccl on GPUs). OVERRIDES is hydra's override list: quote it whole. DRY and HELP
# are booleans (1/true/yes, 0/false/no or empty; docs/MAKE.md).
.PHONY: train
KNOWN_train := OVERRIDES DRY HELP NPROC NNODES NODE_RANK MASTER_ADDR MASTER_PORT
TRAIN_PORT = $(or $(call arg,MASTER_PORT),29500)
TRAIN_RDZV = $(if $(call given,NNODES),--nnodes $(call shq,$(NNODES)) \
  --node_rank $(call shq,$(or $(call arg,NODE_RANK),0)) --rdzv_backend c10d \
  --rdzv_endpoint $(call shq,$(call arg,MASTER_ADDR):$(TRAIN_PORT)) \
  --rdzv_id $(call shq,ftbench-$(TRAIN_PORT)),--standalone)
TRAIN_LAUNCH = $(if $(or $(call given,NPROC),$(call given,NNODES)),$(PY) -m torch.distributed.run \
  $(TRAIN_RDZV) --nproc_per_node $(call shq,$(or $(call arg,NPROC),1)) -m experiments.train,\
  $(PY) -m experiments.train)
# the dry run plans for the GPUs the launch would have, from one process
TRAIN_DRY = FTBENCH_PLAN_NPROC=$(call shq,$(call arg,NPROC)) \
  FTBENCH_PLAN_NNODES=$(call shq,$(call arg,NNODES)) $(PY) -m experiments.memory --dry-run

train: setup ## train one run: OVERRIDES="model=1M model.latent_bits=16 ..." [DRY=1] [NPROC=2] [NNODES NODE_RANK MASTER_ADDR MASTER_PORT] [HELP=1]
	@$(if $(and $(call given,NNODES),$(if $(call on,DRY),,1)),test -n $(call shq,$(call arg,MASTER_ADDR)) \
	  || { echo "NNODES: give MASTER_ADDR=<node 0's address> (and NODE_RANK=<this node>) on every node"; exit 2; })
	@$(if $(and $(or $(call given,NODE_RANK),$(call given,MASTER_ADDR),$(call given,MASTER_PORT)),$(if $(call given,NNODES),,1)),\
	  { echo "NODE_RANK/MASTER_ADDR/MASTER_PORT: multi-node runs need NNODES=<nodes> too"; exit 2; })
	$(if $(call on,HELP),$(PY) -m experiments.train --help,\
	  $(if $(call on,DRY),$(TRAIN_DRY) $(call arg,OVERRIDES) train.dry_run=true,\
	  $(TRAIN_LAUNCH) $(call arg,OVERRIDES)))
