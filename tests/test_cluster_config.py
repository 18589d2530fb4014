"""sweeps/cluster.py: the SLURM settings as a typed structured config (issue 14).

The sbatch parameters are pinned to what the plain-dict loader produced before the re-cut, for
the shipped example and for the edge cases of the `null or 0 = default` and eval-override rules.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

import sweeps.launcher as L
from common.errors import UsageError
from sweeps import cluster as C

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "sweeps" / "cluster.example.yaml"

# slurm_parameters(load_cluster(EXAMPLE)) as the dict-based loader computed it (main, eval)
EXAMPLE_PARAMS = (
    {"slurm_partition": "gpu", "timeout_min": 1440, "nodes": 1, "gpus_per_node": 8,
     "tasks_per_node": 8, "cpus_per_task": 10, "slurm_signal_delay_s": 300,
     "slurm_array_parallelism": 64, "mem_gb": 400.0, "slurm_account": "my-project",
     "slurm_setup": ["source .venv/bin/activate"]},
    {"slurm_partition": "gpu", "timeout_min": 240, "nodes": 1, "gpus_per_node": 1,
     "tasks_per_node": 1, "cpus_per_task": 10, "slurm_signal_delay_s": 300,
     "slurm_array_parallelism": 64, "mem_gb": 400.0, "slurm_account": "my-project",
     "slurm_setup": ["source .venv/bin/activate"]},
)


def _load(tmp_path: Path, text: str) -> C.ClusterConfig:
    p = tmp_path / "cluster.yaml"
    p.write_text(text)
    return C.load_cluster(p)


ZERO = ("partition: p\ngpus_per_node: 0\nnodes: 0\ncpus_per_task: null\ntimeout_min: 0\n"
        "signal_delay_s: 0\narray_parallelism: 0\nmax_num_timeout: 0\nmem_gb: 0\n"
        "account: null\nsetup: null\nadditional: null\neval: null\n")
ZERO_PARAMS = {"slurm_partition": "p", "timeout_min": 1440, "nodes": 1, "gpus_per_node": 0,
               "tasks_per_node": 1, "cpus_per_task": 8, "slurm_signal_delay_s": 300,
               "slurm_array_parallelism": 64}
INHERIT = ("partition: p\naccount: a\nqos: q\ntimeout_min: 99\nmem_gb: 12.5\nsetup: [a, b]\n"
           "additional: {x: 1}\neval: {qos: null, timeout_min: null, mem_gb: 3, "
           "additional: {y: 2}, setup: []}\n")
NODES = "partition: gpu\ngpus_per_node: 8\nnodes: 4\neval: {gpus_per_node: 1}\n"
CORPUS = ("partition: gpu\ngpus_per_node: 8\nnodes: 4\nmem_gb: 400\ntimeout_min: 1440\n"
          "account: a\ncorpus: {partition: cpu}\n")
FREE = ('partition: p\nsetup: ["export X=${HOME}/y", "module load ${M:-cuda}"]\n'
        "additional: {mail-type: END, gres: 'gpu:2', nested: {a: [1, 2]}}\n")
ABSENT = "<absent>"
PARAMS = [  # (cluster file, role, the sbatch parameters it gives: every key, or the ones named)
    (None, "train", EXAMPLE_PARAMS[0]),
    (None, "eval", EXAMPLE_PARAMS[1]),
    (ZERO, "train", ZERO_PARAMS),  # zero or null: the default, as before
    (ZERO, "eval", ZERO_PARAMS),
    # the eval section omitted inherits; a null or [] in it drops the key
    (INHERIT, "train", {"slurm_qos": "q", "timeout_min": 99, "mem_gb": 12.5,
                        "slurm_setup": ["a", "b"], "slurm_additional_parameters": {"x": 1}}),
    (INHERIT, "eval", {"slurm_qos": ABSENT, "slurm_setup": ABSENT, "slurm_account": "a",
                       "timeout_min": 1440, "mem_gb": 3.0,
                       "slurm_additional_parameters": {"y": 2}}),
    # `${VAR}` is the shell's, not an OmegaConf interpolation; nested options survive
    (FREE, "train", {"slurm_setup": ["export X=${HOME}/y", "module load ${M:-cuda}"],
                     "slurm_additional_parameters": {"mail-type": "END", "gres": "gpu:2",
                                                     "nested": {"a": [1, 2]}}}),
    # nodes > 1: every node runs gpus_per_node tasks (sweeps/job.py maps submitit's
    # JobEnvironment to RANK/WORLD_SIZE/...); an evaluation is one process group: one node
    (NODES, "train", {"nodes": 4, "gpus_per_node": 8, "tasks_per_node": 8}),
    (NODES, "eval", {"nodes": 1, "gpus_per_node": 1, "tasks_per_node": 1}),
    # a corpus unit tokenizes one shard in one process: no GPU, one core, one node, 240 min and
    # the partition's memory unless the corpus section says otherwise
    (CORPUS, "corpus", {"slurm_partition": "cpu", "gpus_per_node": 0, "tasks_per_node": 1,
                        "cpus_per_task": 1, "nodes": 1, "timeout_min": 240,
                        "slurm_account": "a", "mem_gb": ABSENT}),
    ("partition: gpu\ncorpus: {cpus_per_task: 2, timeout_min: 30, mem_gb: 8}\n", "corpus",
     {"cpus_per_task": 2, "timeout_min": 30, "mem_gb": 8.0}),
]


@pytest.mark.parametrize("text, role, want", PARAMS)
def test_the_cluster_file_gives_these_sbatch_parameters(tmp_path: Path, text: str | None,
                                                        role: str, want: dict) -> None:
    cfg = C.load_cluster(EXAMPLE) if text is None else _load(tmp_path, text)
    got = L.slurm_parameters(cfg, role)
    assert (got if text is None or text == ZERO else {k: got.get(k, ABSENT) for k in want}) \
        == want
    assert L.slurm_parameters(cfg) == L.slurm_parameters(cfg, "train")  # the main settings
    if text in (None, ZERO):
        assert cfg.or_default("max_num_timeout") == 20
    import sweeps.api as A

    assert A.load_cluster is C.load_cluster  # the one loader, as make sweep reaches it


def test_example_names_every_key_and_only_known_ones() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    assert set(raw) == {f.name for f in dataclasses.fields(C.ClusterConfig)}
    assert set(raw["eval"]) <= {f.name for f in dataclasses.fields(C.JobOverrides)}
    assert set(raw["corpus"]) <= {f.name for f in dataclasses.fields(C.JobOverrides)}


@pytest.mark.parametrize("text, message", [  # one row per check (OmegaConf's types: two)
    ("account: me\n", r"cluster\.yaml: 'partition' is required$"),
    ("partition: ''\n", r"cluster\.yaml: 'partition' is required$"),
    ("partition: gpu\ngpus: 8\n", r"cluster\.yaml: unknown key 'gpus'; allowed: \["),
    ("partition: gpu\neval: {max_num_timeout: 3}\n", r"unknown key 'eval\.max_num_timeout'"),
    ("partition: gpu\ngpus_per_node: eight\n", r"cluster\.yaml: gpus_per_node: Value 'eight'"),
    ("partition: gpu\neval: {timeout_min: soon}\n", r"cluster\.yaml: eval\.timeout_min: Value"),
    ("partition: [a, b]\n", r"cluster\.yaml: partition: Cannot convert"),
    ("partition: gpu\neval: {nodes: -2}\n",
     r"cluster\.yaml: eval\.nodes must be a non-negative integer, got -2$"),
    ("partition: gpu\neval: {partition: null}\n", r"cluster\.yaml: eval: 'partition' is required"),
    ("partition: gpu\nadditional: [a]\n", r"cluster\.yaml: additional must be a mapping"),
    ("partition: gpu\neval: {setup: x}\n", r"cluster\.yaml: eval\.setup must be a list"),
    ("partition: gpu\neval: [1]\n", r"cluster\.yaml: eval must be a mapping"),
    ("- partition\n", r"cluster\.yaml: expected a mapping of settings"),
    ("partition: [\n", r"cluster\.yaml: not valid YAML"),
    ("partition: gpu\nnodes: 4\neval: {nodes: 2}\n",
     r"cluster\.yaml: eval\.nodes=2: an evaluation job takes one node$"),
    ("partition: gpu\nwrite_gbps: -1\n", r"cluster\.yaml: write_gbps must be a non-negative"),
    ("partition: gpu\ncorpus: {nodes: 2}\n",
     r"cluster\.yaml: corpus\.nodes=2: a corpus unit takes one node$"),
    ("partition: gpu\ncorpus: {max_num_timeout: 3}\n", r"unknown key 'corpus\.max_num_timeout'"),
])
def test_bad_file_is_one_line_naming_file_and_key(tmp_path: Path, text: str,
                                                   message: str) -> None:
    with pytest.raises(UsageError, match=message) as e:
        _load(tmp_path, text)
    assert "\n" not in str(e.value)


def test_path_from_environment_and_argument(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    env, arg = tmp_path / "env.yaml", tmp_path / "arg.yaml"
    env.write_text("partition: from-env\n")
    arg.write_text("partition: from-arg\n")
    monkeypatch.setenv("FTBENCH_CLUSTER", str(env))
    assert C.load_cluster().partition == "from-env"
    assert C.load_cluster(arg).partition == "from-arg"
    monkeypatch.delenv("FTBENCH_CLUSTER")
    monkeypatch.setattr(C, "CLUSTER_FILE", tmp_path / "absent.yaml")
    with pytest.raises(UsageError, match=r"LAUNCHER=slurm needs .*absent\.yaml"):
        C.load_cluster()


# ------------------------------------------------------------------ synthetic presets (issue 14)
# experiments/synthetic.py's presets are dataclasses now; the overrides they produce are pinned to
# the lists the plain dict held before (they are recorded in samples.jsonl's meta); cpu changed
# on purpose in issue 28 (6400 steps, 8 checkpoints measured), gpu gained the 8 checkpoints.
SYNTHETIC_BEFORE = {
    "cpu": ["model=1M", "model.dim=64", "model.n_layers=4", "model.n_heads=4",
            "model.n_kv_heads=2", "model.ffn_dim=192", "train.batch_size=32",
            "train.tokens=13312000", "optim.lr=3e-3", "logging.val_every=800",
            "logging.ckpt_every=800", "logging.keep_eval_checkpoints=8",
            "logging.progress=false"],
    "gpu": ["model=1M", "model.dim=256", "model.n_layers=8", "model.n_heads=8",
            "model.n_kv_heads=4", "model.ffn_dim=768", "train.batch_size=128",
            "train.tokens=166400000", "optim.lr=1e-3", "logging.val_every=2000",
            "logging.ckpt_every=2000", "logging.keep_eval_checkpoints=8",
            "logging.progress=false"],
    "smoke": ["model=1M", "model.dim=32", "model.n_layers=2", "model.n_heads=2",
              "model.n_kv_heads=1", "model.ffn_dim=64", "train.batch_size=8",
              "train.tokens=1560", "data.val_tokens=650", "logging.val_every=0",
              "logging.ckpt_every=1000", "logging.progress=false"],
}


def test_synthetic_presets_give_the_same_overrides_as_before() -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    import experiments.synthetic as S

    assert {k: p.overrides() for k, p in S.PRESETS.items()} == SYNTHETIC_BEFORE
    st = S.SyntheticSettings(setting="smoke", seed=3)
    assert S.arm_overrides(st, 8, 0.5) == ["data=synthetic", *SYNTHETIC_BEFORE["smoke"],
                                           "model.latent_bits=8", "model.kappa_bits=0.5",
                                           "train.seed=3"]
    smoke = OmegaConf.structured(S.PRESETS["smoke"])  # a structured config: typed, closed
    with pytest.raises(ValidationError, match="'many' of type 'str' could not be converted"):
        OmegaConf.merge(smoke, {"steps": "many"})
    with pytest.raises(ConfigKeyError, match="Key 'stepz' not in 'SyntheticPreset'"):
        OmegaConf.merge(smoke, {"stepz": 5})
    assert OmegaConf.to_object(OmegaConf.merge(smoke, {"steps": 5})) == \
        dataclasses.replace(S.PRESETS["smoke"], steps=5)


def test_scratch_results_and_write_bandwidth_keys(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "partition: gpu\nresults: /scratch/me/ftbench\nwrite_gbps: 5\n")
    assert cfg.results == "/scratch/me/ftbench" and cfg.or_default("write_gbps") == 5.0
    assert _load(tmp_path, "partition: gpu\n").or_default("write_gbps") == 2.0
    with pytest.raises(ValueError, match="role 'gpu'"):
        cfg.for_role("gpu")


def test_every_role_gives_parameters_slurm_takes(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each role's jobs go through the one translation into an sbatch script (no srun here:
    pretend), the requeue budget into the executor, never a cluster key as it is."""
    from submitit.slurm.slurm import SlurmExecutor

    from sweeps.launcher import SlurmLauncher

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    cfg = C.load_cluster(EXAMPLE)
    for role, gpus in (("train", 8), ("eval", 1), ("corpus", 0)):
        ex = SlurmLauncher(tmp_path / role, cfg).executor(role, after="12" if role == "eval"
                                                          else None)
        assert ex._executor.max_num_timeout == 20
        text = ex._executor._make_submission_file_text("python -m x", "uid")
        assert "#SBATCH --partition=gpu" in text and "#SBATCH --account=my-project" in text
        assert f"#SBATCH --gpus-per-node={gpus}\n" in text, (role, text)
        assert ("#SBATCH --dependency=afterok:12" in text) == (role == "eval")
