#!/usr/bin/env bash
# First contact with one offline H100 node (issue 45), run once through the device tool:
#   run(command="bash dev/gpu/first_contact.sh", carry=[".whl"], timeout_s=600)
# Expects ./.whl/ with the five wheels a node with torch but no registry lacks, and
# ./.whl/plan.json (the fake-tensor plan of gpu-check paper-1.5B at world 1, computed on the CPU
# side: dev/gpu/plan_for_node.py). Order: cheap probes first, the log written as it goes, the
# primary result (gpu-check) before the secondary ones (a baseline at the same shape, a 16M
# throughput probe), each bounded so the whole ends by ~560 s.
OUT=${OUT:-/tmp/gpu-first-contact}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv; nproc; free -g
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 R=/mnt/ft
mkdir -p $R; mount -t tmpfs -o size=110g tmpfs $R || R=/tmp/ftr; export FTBENCH_RESULTS=$R
df -h $R
python3 - <<'E'
import shutil, time, torch as t
from pathlib import Path as P
from sweeps.recipe import load
from pipelines.gpu_check import recipe_args as ra
from experiments.memory import measure_key as K
from experiments.train.config import compose
c = compose(ra(load('paper-1.5B'), 'H100-80GB', 1, 12, 85.5, [])[0])
f = P(c.paths.cache) / 'memory' / (K(c, 1, 'none', 'cuda', 16, 3) + '.json')
f.parent.mkdir(parents=True, exist_ok=True); shutil.copy('.whl/plan.json', f)
print('torch', t.__version__, 'cuda', t.version.cuda, t.cuda.get_device_name(),
      'visible', t.cuda.is_available(), t.cuda.device_count())
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B
from torch.nn.attention.bias import causal_lower_right as clr
d = dict(device='cuda', dtype=t.bfloat16)
def pick(q, k, **a):
    try:
        return B(t._fused_sdp_choice(q, k, k, **a)).name
    except Exception as e:  # noqa: BLE001
        return f'error {type(e).__name__}: {str(e)[:80]}'
# 1.5B: 12 query heads, 2 KV heads, head_dim 128
q = t.randn(2, 12, 4096, 128, **d); k = t.randn(2, 2, 4096, 128, **d)
kx = k.repeat_interleave(6, 1)
m = t.ones(4096, 4096, dtype=t.bool, device='cuda').tril()
pm = t.rand(2, 1, 4096, 4096, device='cuda') < 0.5  # a per-row prefix mask (the encoder's)
print('sdpa train  gqa is_causal  :', pick(q, k, is_causal=True, enable_gqa=True))
print('sdpa train  gqa bool mask  :', pick(q, k, attn_mask=m, enable_gqa=True))
print('sdpa encoder gqa prefix mask:', pick(q, k, attn_mask=pm, enable_gqa=True))
print('sdpa encoder expanded kv + prefix mask:', pick(q, kx, attn_mask=pm))
print('sdpa encoder gqa no mask (non-causal):', pick(q, k, enable_gqa=True))
# the KV-cache extend: 512 new queries on top of 3584 cached keys
qe = q[:, :, :512]
me = t.ones(512, 4096, dtype=t.bool, device='cuda').tril(3584)
print('sdpa extend gqa bool mask  :', pick(qe, k, attn_mask=me, enable_gqa=True))
print('sdpa extend expanded kv + mask:', pick(qe, kx, attn_mask=me))
for name, fn in (('extend gqa bool mask', lambda: F.scaled_dot_product_attention(
                     qe, k, k, attn_mask=me, enable_gqa=True)),
                 ('extend gqa causal_lower_right', lambda: F.scaled_dot_product_attention(
                     qe, k, k, attn_mask=clr(512, 4096), enable_gqa=True)),
                 ('extend expanded kv causal_lower_right', lambda: F.scaled_dot_product_attention(
                     qe, kx, kx, attn_mask=clr(512, 4096))),
                 ('encoder gqa prefix mask', lambda: F.scaled_dot_product_attention(
                     q, k, k, attn_mask=pm, enable_gqa=True)),
                 ('encoder expanded kv prefix mask', lambda: F.scaled_dot_product_attention(
                     q, kx, kx, attn_mask=pm))):
    try:
        fn(); t.cuda.synchronize(); t.cuda.reset_peak_memory_stats(); base = t.cuda.memory_allocated()
        s = time.time(); [fn() for _ in range(5)]; t.cuda.synchronize()
        print(f'attn {name}: {(time.time() - s) / 5 * 1e3:.2f} ms, peak +'
              f'{(t.cuda.max_memory_allocated() - base) / 1e9:.2f} GB')
    except Exception as e:  # noqa: BLE001
        print(f'attn {name}: error {type(e).__name__}: {str(e)[:120]}')
del q, k, kx, m, pm, qe, me
x = t.empty(2**32, dtype=t.uint8, device='cuda'); h = t.empty(x.shape, dtype=x.dtype, pin_memory=True)
for n, g in (('pinned', lambda: h.copy_(x)), ('pageable', x.cpu)):
    t.cuda.synchronize(); s = time.time(); g(); t.cuda.synchronize()
    print('d2h', n, f'{4.295 / (time.time() - s):.1f} GB/s')
E
echo "== gpu-check paper-1.5B at ${SECONDS}s"
timeout -k 20 350 python3 -m pipelines.gpu_check --recipe paper-1.5B --steps 12 --out $OUT
echo "== baseline at the same shape at ${SECONDS}s"
A=$(python3 -c "from sweeps.recipe import load;from pipelines.gpu_check import recipe_args as r;print(*r(load('paper-1.5B'),'H100-80GB',1,8,85.5,['model.latent_bits=0','logging.ckpt_every=99'])[0])")
TORCH_LOGS=recompiles,graph_breaks timeout -k 10 $((490-SECONDS)) python3 -m experiments.train $A paths.results=$R/base
echo "== 16M throughput probe at ${SECONDS}s"
for hb in "0 16" "8 16" "0 64" "8 64"; do set -- $hb
  [ $SECONDS -gt 545 ] && break
  timeout -k 5 $((560-SECONDS)) python3 -m experiments.train model=16M model.latent_bits=$1 \
    model.kappa_bits=0.25 data=random train.batch_size=$2 train.tokens=$(( $2 * 256 * 60 )) \
    logging.log_every=10 logging.val_every=1000 logging.progress=false train.force=true \
    paths.results=$R/p16m-$1-$2 2>&1 | tail -4
done
(cd $R && find . \( -name metrics.jsonl -o -name train.log -o -name '*stderr*' -o -name '*.json' \) \
  -size -20M -print0 | tar czf $OUT/runs.tgz --null -T -)
echo "== done at ${SECONDS}s"; ls -l $OUT
