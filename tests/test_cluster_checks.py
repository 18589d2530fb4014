"""Pre-submission checks (issue 37, sweeps/checks.py): the cluster file is the source of the
world size (a world that does not split the batch is refused with the nearest node counts);
hours per cell against timeout_min x (max_num_timeout + 1), with the nodes or requeues that
would fit; the trainer's grace inside the signal's lead against the planned save; the corpus
shards every rank maps against open files and memory maps; disk with the corpus counted once.
Each says its values and what to change in one line; a failing one refuses to submit, with
nothing written. The paper-8B figures (1,075 h against 504 h) are in the slow tier."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sweeps import api, backend
from sweeps import checks as C
from sweeps.job import GRACE_MARGIN_S

ROOT = Path(__file__).resolve().parents[1]
SMALL = "train.batch_size=16 train.seq_len=32"


@pytest.fixture(autouse=True)
def _results(tmp_path, monkeypatch, request):
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "res"))
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FTBENCH_CLUSTER", str(tmp_path / "none.yaml"))
    # each test plans the same request several times (plan, dry run, run): compose a cell once
    composed: dict = {}
    real = backend.compose

    def compose_once(cell):
        if cell.overrides not in composed:
            composed[cell.overrides] = real(cell)
        return composed[cell.overrides]

    monkeypatch.setattr(backend, "compose", compose_once)
    if not request.node.get_closest_marker("real_memory"):
        # the memory check's fake-tensor measurement (most of these tests' time, asserted by
        # none of them) is the slow test's below
        monkeypatch.setattr(C, "memory", lambda p, cluster: C.Check("memory", True, "memory"))


def _cluster(tmp_path: Path, text: str, name: str = "cluster.yaml") -> str:
    f = tmp_path / name
    f.write_text("partition: gpu\n" + text)
    return str(f)


def _req(cluster: str, overrides: str = SMALL, **kw) -> api.SweepRequest:
    return api.SweepRequest(kappa="1", h="4", seeds="0", tokens="2k", preset="1M",
                            overrides=overrides, cluster=cluster, **kw)


def test_the_cluster_file_sets_the_world_or_is_refused_with_the_nearest_nodes(tmp_path):
    ok = _cluster(tmp_path, "gpus_per_node: 8\nnodes: 2\n")
    p = api.plan(_req(ok))
    assert all("train.plan_world_size=16" in c.cell.overrides for c in p.cells)
    assert "world       16 GPU(s), from train.plan_world_size" in api.dry_run(_req(ok))
    bad = _cluster(tmp_path, "gpus_per_node: 8\nnodes: 3\n", "three.yaml")
    with pytest.raises(api.UsageError) as e:
        api.plan(_req(bad))
    msg = str(e.value)
    assert "\n" not in msg and "3 node(s) x 8 GPU(s) = 24 ranks" in msg
    assert "train.batch_size=16 does not split" in msg and "nodes=2 (16 GPUs)" in msg
    # a world asked for beside the file (GPUS=) must be the file's
    with pytest.raises(api.UsageError, match=r"train.plan_world_size=32 \(GPUS=\) but .* = 16"):
        api.plan(_req(ok, SMALL + " train.plan_world_size=32"))


def test_time_signal_files_and_disk_say_their_values_and_what_to_change(tmp_path, monkeypatch):
    cl = _cluster(tmp_path, "gpus_per_node: 8\nnodes: 1\ntimeout_min: 60\nmax_num_timeout: 2\n"
                            "signal_delay_s: 60\nwrite_gbps: 0.000001\nnofile: 300\n")
    over = (SMALL + " data.max_bytes=100000 data.shard_bytes=1000"  # 100 units, 200 shards
            " logging.keep_eval_checkpoints=4")
    r = api._resolve(_req(cl, over))
    # disk: the corpus counted once (two cells, one corpus), exports as weights only
    d = C.disk_need(r.plan, gpus=True)
    corpus = backend.corpus_of(r.plan.cells[0].cfg)["bytes"]
    assert d["corpus"] == corpus > 0
    per = 0
    for c in r.plan.cells:
        ck = backend.checkpoint_sizes(c.cfg, True)
        assert ck["export"] * 6 == ck["full"]  # bf16 weights vs fp32 weights + AdamW
        per += (c.cfg.logging.keep_checkpoints + 1) * ck["full"] + 4 * ck["export"]
    assert d["cells"] == per and d["total"] == per + corpus
    big = max(r.plan.cells, key=lambda c: c.flops)
    # a rate at which the costliest cell needs 10 h on its 8 GPUs: 3 h allowed
    monkeypatch.setattr(backend, "gpu_rate", lambda cfg: (big.flops / (10 * 3600 * 8), 8, "x",
                                                             "assumed"))
    cs = {c.name: c for c in C.checks(r.plan, r.cluster, r.cluster_file)}
    t = cs["time"]
    assert not t.ok and "needs ~10 h on 8 GPU(s)" in t.line
    assert "timeout_min=60 x (max_num_timeout=2 + 1) allows 3 h" in t.line
    assert "max_num_timeout=9" in t.line  # 10 one-hour attempts
    assert "nodes=" not in t.line  # the batch of 16 splits over no more than 2 nodes of 8
    s = cs["signal"]
    ck = backend.checkpoint_sizes(big.cfg, True)
    save = ck["full"] / 1e3
    assert not s.ok and f"leaves the trainer {60 - GRACE_MARGIN_S:.0f} s" in s.line
    assert f"signal_delay_s={60 * math.ceil((2 * save + GRACE_MARGIN_S) / 60)}" in s.line
    f = cs["files"]
    assert not f.ok and "each rank keeps at most 64 of 200 corpus shards open" in f.line
    assert "open files 320 > nofile=300" in f.line and "data.shard_bytes" in f.line
    d = cs["disk"]
    assert d.ok and "+ the corpus once" in d.line
    for c in cs.values():
        assert "\n" not in c.line
    # the dry run lists them; a submission is refused on the first, nothing written
    dry = api.dry_run(_req(cl, over))
    assert "pre-submission checks" in dry and "FAILS time:" in dry and "FAILS files:" in dry
    with pytest.raises(api.UsageError, match=r"^time: .* \(and 2 more: DRY=1 lists them\)$"):
        api.run(_req(cl, over, launcher="slurm"))
    assert not (tmp_path / "res" / "sweeps").exists()


def test_without_a_cluster_file_the_files_check_uses_this_hosts_limits(tmp_path, monkeypatch):
    over = SMALL + " data.max_bytes=100000 data.shard_bytes=1000"
    monkeypatch.setattr(C, "host_limits", lambda: (300, 100_000))
    dry = api.dry_run(_req("", over))
    assert "FAILS files:" in dry and "open files 320 > this host's 300" in dry
    monkeypatch.setattr(C, "host_limits", lambda: (100_000, 100_000))
    assert "pre-submission" not in api.dry_run(_req("", over))  # local and fine: silent


@pytest.mark.slow
def test_paper_8b_on_the_example_cluster_needs_more_hours_than_it_allows():
    r = api._resolve(api.SweepRequest(recipe="paper-8B", gpu="H100-80GB",
                                      cluster=str(ROOT / "sweeps" / "cluster.example.yaml")))
    t = next(c for c in C.checks(r.plan, r.cluster, r.cluster_file) if c.name == "time")
    assert not t.ok and "needs ~1,075 h on 8 GPU(s)" in t.line
    assert "allows 504 h" in t.line and "nodes=4 (32 GPUs" in t.line
    assert "max_num_timeout=44" in t.line


@pytest.mark.slow
def test_paper_8b_on_three_nodes_is_refused_with_the_nearest_valid_values(tmp_path):
    cl = _cluster(tmp_path, "gpus_per_node: 8\nnodes: 3\n")
    with pytest.raises(api.UsageError) as e:
        api.plan(api.SweepRequest(recipe="paper-8B", gpu="H100-80GB", cluster=cl))
    assert "= 24 ranks" in str(e.value) and "nodes=2 (16 GPUs) or nodes=4 (32 GPUs)" \
        in str(e.value)


@pytest.mark.real_memory
@pytest.mark.slow  # three fake-tensor measurements at world 2: 108 s under load
def test_the_costliest_cell_is_measured_at_the_clusters_world_and_refused_or_rechosen(
        tmp_path):
    """Issue 45, plans for the cluster you have: the memory check measures the costliest cell
    (fake tensors, experiments/memory.py, at the world the cluster file gives) and refuses a
    micro-batch whose training, validation or save peak exceeds the GPU less a margin, naming
    what fits (the same search `make paper` uses to choose it), or that nothing does."""
    import dataclasses

    from experiments import memory as MEM

    cl = _cluster(tmp_path, "gpus_per_node: 2\nnodes: 1\n")
    ddp = f"{SMALL} train.parallel=ddp"  # auto would turn FSDP on the smaller GPU below
    cfg = C.largest_config(api.plan(_req(cl, ddp)))
    assert cfg.train.plan_world_size == 2
    assert cfg.model.latent_bits > 0  # the Free Transformer, not a baseline tied on FLOPs
    own = MEM.fit(cfg, cache=tmp_path / "cache")  # 80 GB: its own micro-batch of 8 per GPU
    assert (own.micro_batch_size, len(own.tries)) == (8, 1)
    four = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_size=4))
    recs, _ = MEM.measure_cached(four, world_size=2, cache=tmp_path / "cache")
    peak4 = max(r.peak_bytes for r in recs if r.phase in MEM.FIT_PHASES)
    gb = (own.tries[0][2] + peak4) / 2 / MEM.USABLE_FRACTION / 1e9  # 8 over it, 4 within

    def memory(extra: str) -> C.Check:
        r = api._resolve(_req(cl, f"{ddp} train.gpu_memory_gb={gb!r} {extra}"))
        return next(c for c in C.checks(r.plan, r.cluster, r.cluster_file) if c.name == "memory")

    m = memory("")
    assert not m.ok and "\n" not in m.line and "over 2 GPU(s)" in m.line
    assert ('OVERRIDES="train.micro_batch_size=4 train.activation_checkpointing=false" fits'
            in m.line), m.line
    assert memory("train.micro_batch_size=4").ok
    with pytest.raises(api.UsageError, match=r"^memory: .* fits \(make paper chooses it"):
        api.run(_req(cl, f"{ddp} train.gpu_memory_gb={gb!r}", launcher="slurm"))
    gb = 1e-6  # nothing fits, activation checkpointing included
    m = memory("")
    assert not m.ok and "nothing fits" in m.line and "with act. ckpt" in m.line


@pytest.mark.slow  # a fake-tensor fit of cpu-mini at world 2 (~7 s); paper.py's fast tests
# are test_paper's and the refusal table's
def test_make_paper_chooses_the_micro_batch_for_the_clusters_world(tmp_path):
    """cpu-mini's micro-batch (8, for its one GPU) does not split over a node of 2 GPUs: make
    paper re-chooses it for that world, by measurement, and says so; run-ids do not change."""
    import dataclasses

    from pipelines import paper

    cl = _cluster(tmp_path, "gpus_per_node: 2\nnodes: 1\n")
    a = paper.parse(["--recipe", "cpu-mini", "--gpu", "H100-80GB", "--cluster", cl])
    rec, req = paper.check(a)
    fitted, lines, world = paper.fit_to_cluster(rec, req)
    assert world == 2 and len(lines) == 1 and "chosen here" in lines[0], lines
    assert "train.micro_batch_size=4" in fitted.overrides
    ids = {c.run_id for c in api.plan(fitted).cells}
    assert ids == {c.run_id for c in api.plan(dataclasses.replace(req, cluster="")).cells}
