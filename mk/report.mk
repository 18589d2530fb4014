# Reports (issue 7): analysis/ reads only results/ (docs/RESULTS.md) and writes
# results/sweeps/<NAME>/report.html (self-contained) + report/ (tables CSV/MD/TeX, PNGs, claims).
# make report NAME=demo                     the report of sweep "demo"
# make report NAME=demo CHECK=1             ... and render it in headless Chromium (screenshot)
# make report NAME=demo SYNTH=default       embed results/synthetic/default
# NAME is shared with mk/sweep.mk (the sweep's name); it is not given a default here.
REPORT_NBOOT ?= 2000
.PHONY: report report-check

report: setup ## HTML report of a sweep: NAME=<sweep> [SYNTH=<synthetic name>] [CHECK=1]
	@test -n "$(NAME)" || { echo "usage: make report NAME=<sweep>; sweeps here:" \
	  $$(ls $${FTBENCH_RESULTS:-results}/sweeps 2>/dev/null); exit 2; }
	$(PY) -m analysis.report --name $(NAME) --n-boot $(REPORT_NBOOT) \
	  $(if $(SYNTH),--synthetic $(SYNTH)) $(if $(filter 1,$(CHECK)),--check)

report-check: setup ## render a report in headless Chromium, keep a screenshot: NAME=<sweep>
	@test -n "$(NAME)" || { echo "usage: make report-check NAME=<sweep>"; exit 2; }
	R=$${FTBENCH_RESULTS:-results}; $(PY) -m analysis.browser $$R/sweeps/$(NAME)/report.html \
	  --screenshot $${FTBENCH_SCREENSHOT:-$$R/sweeps/$(NAME)/report/report.png}
