# Setup: .venv with torch pinned first (a CPU build here, the CUDA build on a GPU machine), then
# the project with its extras, then evalplus without its own requirements (they pull openai,
# anthropic and google-generativeai; what it needs at run time is in pyproject). System tools:
# bubblewrap (the code sandbox) and Chromium (the report's render check) are installed with apt
# when we are root, else named in one line each; without Chromium the browser tests skip and say
# why, without bubblewrap code evaluation is refused unless FTBENCH_SANDBOX=weak.
.PHONY: setup
SYSTEM_TOOLS := bwrap:bubblewrap chromium:chromium prlimit:util-linux setpriv:util-linux

$(STAMP): pyproject.toml Makefile mk/setup.mk
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m pip install -q --no-deps $(EVALPLUS_PIN)
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || \
	  missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "setup: installing$$missing (apt)"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq $$missing >/dev/null; } || echo "setup: apt-get install failed"; \
	fi; \
	for t in $(SYSTEM_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || echo "setup: MISSING" \
	  "$${t%%:*} (Debian package $${t#*:}): install it as root, e.g. apt-get install $${t#*:}"; done
	touch $(STAMP)

setup: $(STAMP) ## create .venv; install torch==2.13.0, the project, evalplus, bubblewrap and Chromium (idempotent)
