#!/usr/bin/env bash
# Second contact with one offline H100 (issue 45: r2-gpu's changes), for the device tool:
#   run(command="bash dev/gpu/second_contact.sh", carry=[".whl"], timeout_s=170)
# At most ~120 s on one H100 with its own torch (2.11+cu130) and no registry: ./.whl/ holds the
# five wheels the node lacks (docs/MAKE.md, make offline-bundle), as for first_contact.sh. What it
# confirms (dev/gpu/second_contact.py, each section bounded, results written as they come):
# gpu-check's plan read from the shipped key on a torch that did not make it; no synchronizing
# CUDA call on a training step that neither logs nor validates; the pinned, cached staging of a
# 1.5B step checkpoint against DCP's default; the compiled chunked cross-entropy at
# 8192 x 1536 x 2^17. Writes $OUT/second_contact.json and $OUT/log.txt.
# CPU rehearsal (the same code's CPU paths): OUT=/tmp/sc bash dev/gpu/second_contact.sh --cpu
OUT=${OUT:-/tmp/gpu-second-contact}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD  # this checkout's venv (the CPU rehearsal)
fi
PY=${PY:-$( [ -x .venv/bin/python ] && [ "$1" = --cpu ] && echo .venv/bin/python || echo python3 )}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-second-contact
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
timeout -k 5 115 "$PY" dev/gpu/second_contact.py "$OUT" "$@"
echo "== done at ${SECONDS}s"; ls -l "$OUT"
