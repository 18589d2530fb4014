# The latent, measured (docs/PROBE.md): does a Free Transformer's decoder use Z, and how?
#   make probe CKPT=<run dir|.pt> [ROWS=16] [SEED=12345] [OUT=<dir>] [PROBE_ARGS="--draws 8 ..."]
# KL per latent bit and position, active bits, the collapse flag, Z ablations (one code per
# sequence, Z zeroed, the posterior: LEAKING) as CE changes against prior Z with bootstrap
# intervals over rows, and steering (one Z per group vs independent Z). Writes
# <run>/eval/probe.<spec_id>.step<N>.json, then its four PNGs beside it (analysis/probe.py).
# The same spec on the same checkpoint reuses the file. A baseline is refused (one line, exit 2).
.PHONY: probe
KNOWN_probe := CKPT ROWS SEED OUT PROBE_ARGS

probe: setup ## does the decoder use Z? KL per bit, Z ablations, steering: CKPT=<FT run dir|.pt> [ROWS=16]
	@test -n $(call shq,$(call arg,CKPT)) || { echo "usage: make probe CKPT=<Free Transformer" \
	  "run dir or checkpoint> [ROWS=n] [SEED=s] [OUT=<dir>] [PROBE_ARGS=\"--draws 8 ...\"]"; exit 2; }
	@out=$$($(PY) -m experiments.eval.probe $(call shq,$(CKPT)) $(call opt,ROWS,--rows) \
	  $(call opt,SEED,--seed) $(call opt,OUT,--out) $(call arg,PROBE_ARGS)) || exit $$?; \
	  echo "$$out"; f=$${out#probe: }; f=$${f#reused (same spec, same checkpoint) }; \
	  $(PY) -m analysis.probe "$$f"

# The sample test (docs/alive/kappa/PREREGISTERED.md): does generation with Z from the prior
# break? Prior samples of the Free Transformer, scored by the same seed's baseline, against a
# ladder of plain decoders (another seed's baseline's kept checkpoints) as bad in likelihood as
# the FT's ELBO: experiments/eval/samples.py. Re-running reuses every file it made.
.PHONY: samples
KNOWN_samples := CKPT BASELINE LADDER OUT

samples: setup ## does prior generation break? CKPT=<FT run> BASELINE=<same-seed baseline run> LADDER=<other baseline run> [OUT=<dir>]
	$(PY) -m experiments.eval.samples $(call shq,$(CKPT)) --scorer $(call shq,$(BASELINE)) \
	  --ladder $(call shq,$(LADDER)) $(call opt,OUT,--out)
