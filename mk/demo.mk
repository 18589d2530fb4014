demo: setup ## the whole pipeline on the embedded default, offline, on a CPU
	@echo "make demo: not built yet (issue 7)"
