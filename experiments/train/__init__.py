"""Training: one loop for both arms, and its parts.

    config.py        the typed config tree (hydra structured configs) and compose(); the
                     data section and the tokenizer live below, in experiments/corpus/
    plan.py          run-id, the resolved plan (steps, tokens, FLOPs) and the whole dry run
    data.py          the training and validation streams of a corpus, in the seeded order
    parallel.py      one process, DDP or FSDP2; the meta build and its materialisation
    trainer.py       train(cfg) and the Trainer: the loop (`python -m experiments.train`)
    checkpointer.py  the Checkpointer and TrainState: checkpoints/, metrics.jsonl, resume
"""
