# Reports: analysis/ reads only results/ (docs/RESULTS.md) and writes
# results/sweeps/<NAME>/report.html (self-contained) + report/ (tables CSV/MD/TeX, PNGs, claims).
# make report NAME=demo                     the report of sweep "demo"
# make report NAME=demo CHECK=1             ... and render it in headless Chromium (screenshot)
# make report NAME=demo SYN_NAME=default    embed results/synthetic/default
.PHONY: report report-check
REPORT_NBOOT := 2000
KNOWN_report := NAME SYN_NAME CHECK REPORT_NBOOT
KNOWN_report-check := NAME

report: setup ## HTML report of a sweep: NAME=<sweep> [SYN_NAME=<synthetic name>] [CHECK=1]
	@test -n $(call shq,$(call arg,NAME)) || { echo "usage: make report NAME=<sweep>; sweeps here:" \
	  $$(ls $${FTBENCH_RESULTS:-results}/sweeps 2>/dev/null); exit 2; }
	$(PY) -m analysis.report --name $(call shq,$(NAME)) --n-boot $(REPORT_NBOOT) \
	  $(call opt,SYN_NAME,--synthetic) $(if $(call on,CHECK),--check)

report-check: setup ## render a report in headless Chromium, keep a screenshot: NAME=<sweep>
	@test -n $(call shq,$(call arg,NAME)) || { echo "usage: make report-check NAME=<sweep>"; exit 2; }
	R=$${FTBENCH_RESULTS:-results}; $(PY) -m analysis.browser "$$R/sweeps/"$(call shq,$(NAME))/report.html \
	  --screenshot "$$R/sweeps/"$(call shq,$(NAME))/report/report.png
