"""The fake-tensor plan of `gpu-check --recipe paper-1.5B --steps 12` at world 1, computed here
(CPU, about 80 s) and copied to .whl/plan.json for dev/gpu/first_contact.sh, which installs it
under the node's own cache key (the key holds torch's version, which differs on the node)."""
import shutil
import time
from pathlib import Path

from experiments import memory as MEM
from experiments.train.config import compose
from pipelines.gpu_check import recipe_args
from sweeps.recipe import load

t = time.time()
cfg = compose(recipe_args(load("paper-1.5B"), "H100-80GB", 1, 12, 85.5, [])[0])
recs, path = MEM.measure_cached(cfg, world_size=1, device_type="cuda",
                                cache=Path("/tmp/plancache"))
print(path, f"{time.time() - t:.0f} s")
for r in recs:
    print(r.phase, f"{r.peak_bytes / 1e9:.1f} GB")
Path(".whl").mkdir(exist_ok=True)
shutil.copy(path, ".whl/plan.json")
