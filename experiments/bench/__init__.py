"""`make bench`: training, generation, mapper and evaluation speed, side by side (issue 8).

Every comparison runs its contenders in the same process, interleaved rep by rep (the order
rotates each rep), after warm-up; each figure is the median of the reps with min and max, and a
ratio is the median of the per-rep paired ratios, so drift on a shared machine cancels.

Sections (``--sections``, default all):
- ``train``:    our baseline vs HF ``LlamaForCausalLM`` (identical config); our Free Transformer
                vs x-transformers' ``FreeTransformer`` (closest config; mismatches listed in the
                output); fwd + bwd + AdamW step. Also the CPU analogue of MFU: model FLOPs/s
                (``model.train_flops_per_token``) over a dense fp32 matmul's FLOP/s, measured in
                the same interleaved loop.
- ``overhead``: step time of our Free Transformer / our baseline at several H, beside the
                analytic FLOPs ratio and the paper's 1/L.
- ``mapper``:   ``latent_embedding`` vs the dense ``(one_hot + G - G.detach()) @ W.T``: time of
                forward+backward and peak memory (see ``peak_alloc_bytes``).
- ``generate``: tokens/s with the KV cache vs recomputing the full forward each step, and vs HF
                ``generate`` on the exported baseline (``experiments.eval.hf_export``).
- ``generate_batch``: batched greedy generation (mixed prompt lengths, left-padded; token stop
                sequences that end rows at different steps) vs HF ``generate`` with a
                ``StoppingCriteria`` on the same sequences; rows must match HF's.
- ``eval``:     multiple-choice loglikelihood requests/s of our lm-eval adapter
                (``experiments.eval.lm_adapter``) vs lm-eval's ``hf`` backend on the exported
                baseline.

Output: ``$FTBENCH_RESULTS/bench/<timestamp>.json`` (default results root ``results/``) and a
Markdown table (``docs/BENCH.md`` for the full size, beside the JSON otherwise).

    python -m experiments.bench                 # full size (the README's figures)
    python -m experiments.bench --size tiny     # seconds; what the test runs

Modules: ``harness`` (sizes, interleaved timing, machine), ``contenders`` (the models and
workloads compared), ``sections`` (one function per section), ``report`` (targets, Markdown),
``__main__`` (the CLI and the result files; a bad argument is one line and exit 2).
The one-off measurements docs/BENCH.md quotes by hand are scripts in dev/bench/.
"""
