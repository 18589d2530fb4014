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
