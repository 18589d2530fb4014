# make corpus: a sharded, pre-tokenized corpus, built once (pipelines/corpus.py over
# experiments/corpus). Train on it with OVERRIDES="data.corpus=<OUT>" (make train, make sweep).
# docs/DATA.md: FineWeb-Edu, DCLM and a code mix for the paper's presets, with the disk each needs.
#   DATA     a data config: stdlib | files | hf, or a YAML path (the keys of the data section)
#   OUT      output directory (required); re-running resumes an interrupted build
#   VOCAB    BPE vocabulary (default 131072 = 2^17, the paper's); ignored with OVERRIDES="tokenizer=<json>"
#   WORKERS  worker processes (local; default: the CPU count) or array tasks at once (slurm)
#   LAUNCHER local | slurm (a submitit job array through the one launcher; CLUSTER=<cluster file>,
#            default sweeps/cluster.yaml: its corpus section, sweeps/cluster.example.yaml)
#   OVERRIDES data key=value overrides, e.g. OVERRIDES="max_bytes=1000000 hf_max_bytes=null"
.PHONY: corpus
KNOWN_corpus := OUT DATA VOCAB WORKERS LAUNCHER CLUSTER OVERRIDES

corpus: setup ## build a sharded, pre-tokenized corpus once: OUT= DATA= VOCAB= WORKERS= LAUNCHER=
	@$(if $(call arg,OUT),,echo "make corpus: set OUT=<directory>" >&2; exit 2)
	$(PY) -m pipelines.corpus --data $(call shq,$(or $(call arg,DATA),stdlib)) \
	  --out $(call shq,$(OUT)) \
	  --vocab-size $(call shq,$(or $(call arg,VOCAB),131072)) \
	  $(call opt,WORKERS,--workers) $(if $(filter slurm,$(call arg,LAUNCHER)),--launcher slurm) \
	  $(call opt,CLUSTER,--cluster) $(call arg,OVERRIDES)
