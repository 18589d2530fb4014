"""The orchestration floor: what drives the other parts, one command each.

    paper.py            `make paper RECIPE=...`: corpus -> sweep with evaluation points -> report
    study.py            `make study`: the worked example (sweep, probes, report, docs/study/)
    shared.py           what paper and study share: the jobs' environment, the state file beside a
                        sweep, the fingerprint of a report's inputs
    synthetic_seeds.py  `make synthetic-seeds`: one synthetic run per seed, several at once
    corpus.py           `make corpus`: a sharded corpus built through the one launcher
    gpu_check.py        `make gpu-check`: bf16, flash, compile, DDP and FSDP on a first GPU node
    full_eval.py        `make bench-eval`: the full evaluation of one checkpoint, timed per task

Dependencies point one way: pipelines -> sweeps -> experiments -> model -> common. A pipeline
runs each stage in its own process through the stage's entry point: a sweep through sweeps'
typed front door (`sweeps.api`: plan, run, status), a report through analysis' build_report;
its jobs go through the one launcher interface (`sweeps.launcher`), bench-eval's timed
processes excepted (a job wrapper would change the wall time it measures). It learns progress
from the records jobs write, never from their printed lines. Nothing imports pipelines.
"""
