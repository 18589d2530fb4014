# Calibration of the report's statistics: synthetic sweeps with planted truth, written as result
# files and run through the real analysis, plus a bulk Monte-Carlo through the same statistic
# functions. Writes docs/CALIBRATION.md (command, figures, Monte-Carlo CIs) and exits 1 when a
# target is missed. The harness is test support: tests/calibration.py (tests/test_calibration.py
# runs a fast version).
#   make calibrate                                   the full run (~10 min on 2 CPU cores)
#   make calibrate CALIB_ARGS="--sweeps 200 --full-path 5"   a quicker look
CALIB_ARGS :=
CALIB_OUT := docs/CALIBRATION.md
.PHONY: calibrate
KNOWN_calibrate := CALIB_ARGS CALIB_OUT

calibrate: setup ## calibrate the report's intervals and verdicts on planted truth -> docs/CALIBRATION.md
	$(PY) tests/calibration.py --out $(call shq,$(CALIB_OUT)) $(CALIB_ARGS)
