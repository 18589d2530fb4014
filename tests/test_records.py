"""common/records.py: round trips, schema versions, the one EvalSpec (ids and file names equal to
the suite's before records, computed here from their definition), a spec-less eval file refused."""

from __future__ import annotations

import hashlib
import json

import pytest

from common.records import (
    SCHEMAS,
    EvalFile,
    EvalRequest,
    EvalSpec,
    LikelihoodFile,
    Manifest,
    ManifestCell,
    MetricsLine,
    PointState,
    RecordError,
    RunRecord,
    effective_k,
)


def _sid(d: dict) -> str:  # docs/RESULTS.md's definition, written out independently
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()[:12]


SPEC = EvalSpec.from_args("lm-eval", ["gsm8k", "arc_easy"], 20, "prior-k", 4, None, 128,
                          {"gsm8k/test.jsonl": "c" * 64})
EP = EvalSpec.from_args("evalplus", ["humaneval_plus"], 20, "prior-k", 4, None, 128, {})


def _records() -> list:
    ev = EvalFile(suite="lm-eval", spec=SPEC, spec_id=SPEC.id, run_id="r", checkpoint="c.pt",
                  checkpoint_step=6, arm="free", z_mode="prior-k", k=4, seed=0, limit=20,
                  tasks={"gsm8k": {"primary": "exact_match", "metrics": {
                      "exact_match": {"value": 0.5, "n": 20}}, "items": []}},
                  extra={"protocol": {"generate_until": "prior"}, "fewshot_override": None})
    lik = LikelihoodFile(spec=LikelihoodFile.spec_of([8, 1], 4, 1), spec_id="x", arm="free",
                         run_id="r", checkpoint_step=3, n_tokens=10, n_bytes=30,
                         extra={"iwae": {"1": {"bpb": 1.0}}, "exact": False})
    run = RunRecord(run_id="r", arm="baseline", model={"latent_bits": 0},
                    train={"compute_match": "flops", "match_latent_bits": 16},
                    extra={"logging": {"log_every": 1}})
    cells = (ManifestCell(cell="baseline_flops-H16-s0", arm="baseline_flops", kappa_bits=None,
                          latent_bits=0, seed=0, run_id="a", match_latent_bits=16,
                          state="done", eval={"state": "done"}, run_dir="/x",
                          points={4: PointState(state="done")}, extra={"newer_key": 1}),
             ManifestCell(cell="free-k1-H16-s0", arm="free", kappa_bits=1.0, latent_bits=16,
                          seed=0, run_id="b"))
    man = Manifest(name="m", cells=cells, grid={"latent_bits": [16]},
                   eval_spec=EvalSpec.union({"lm-eval": SPEC, "evalplus": EP}),
                   eval_spec_id="u", eval_specs={"lm-eval": SPEC, "evalplus": EP},
                   created="now", extra={"newer_key": {"a": 1}})
    line = MetricsLine(kind="val", step=5, tokens=10.0, flops=1e6, values={"val_ce": 3.0})
    return [SPEC, ev, lik, run, *cells, man, line]


@pytest.mark.parametrize("rec", _records(), ids=lambda r: type(r).__name__)
def test_round_trip(rec):
    d = rec.to_json()
    json.dumps(d)  # JSON-able as is
    assert type(rec).from_json(json.loads(json.dumps(d))) == rec


@pytest.mark.parametrize("cls,kind", [(EvalFile, "eval"), (LikelihoodFile, "likelihood"),
                                      (RunRecord, "run"), (Manifest, "manifest"),
                                      (MetricsLine, "metrics")])
def test_a_future_schema_is_one_clear_error(cls, kind):
    stem = SCHEMAS[kind].rsplit("-v", 1)[0]
    d = {"schema": f"{stem}-v99", "kind": "train", "step": 1}
    with pytest.raises(RecordError, match=r"newer than this code reads") as e:
        cls.from_json(d)
    assert "\n" not in str(e.value) and f"{stem}-v99" in str(e.value)
    with pytest.raises(RecordError, match="not a"):
        cls.from_json({**d, "schema": "something-else"})
    with pytest.raises(RecordError, match="not a JSON object"):
        cls.from_json([1, 2])


def test_spec_ids_and_names_are_the_suites_before_records():
    want = {"suite": "lm-eval", "tasks": ["arc_easy", "gsm8k"], "limit": 20, "z_mode": "prior-k",
            "k": 4, "fewshot": None, "gen_tokens": 128,
            "data_checksums": {"gsm8k/test.jsonl": "c" * 64}}
    assert SPEC.to_json() == want and SPEC.id == _sid(want)
    assert SPEC.file_name(6) == f"lm-eval.prior-k4.limit20.{_sid(want)}.step6.json"
    assert SPEC.file_name(None).endswith(".stepNA.json")
    post = EvalSpec.from_args("lm-eval", ["arc_easy"], None, "posterior", 9, 3, 128, {})
    # k is 1 unless prior-k; a log-likelihood-only suite has no generation length
    assert post.k == 1 and post.gen_tokens is None
    assert post.file_name(2) == f"lm-eval.posterior.fewshot3.{post.id}.step2.json"
    assert EP.gen_tokens == 128
    assert SPEC.cache_key("a" * 64, 3, 128) == f"{'a' * 16}-prior-k-k4-s3-g128"
    with pytest.raises(ValueError, match="z='bogus'"):
        EvalSpec.from_args("lm-eval", ["gsm8k"], None, "bogus", 1, None, 1, {})
    assert effective_k("prior", 7) == 1 and effective_k("prior-k", 7) == 7


def test_the_union_spec_is_the_manifests_before_records():
    u = EvalSpec.union({"lm-eval": SPEC, "evalplus": EP}).to_json()
    assert u["suite"] == "lm-eval+evalplus"
    assert u["tasks"] == ["arc_easy", "gsm8k", "humaneval_plus"]
    assert u["suites"] == {"lm-eval": SPEC.to_json(), "evalplus": EP.to_json()}
    assert list(u)[:8] == ["suite", "tasks", "limit", "z_mode", "k", "fewshot", "gen_tokens",
                           "data_checksums"]


def test_request_builds_every_suites_spec_once():
    r = EvalRequest(tasks=("gsm8k", "humaneval_plus", "gsm8k"), limit=20, z_mode="prior-k",
                    k=4)
    assert r.tasks == ("gsm8k", "humaneval_plus")
    specs = r.specs(128, {"lm-eval": {"gsm8k/test.jsonl": "c" * 64}})
    assert list(specs) == ["lm-eval", "evalplus"]
    assert specs["lm-eval"] == EvalSpec.from_args("lm-eval", ["gsm8k"], 20, "prior-k", 4, None,
                                                  128, {"gsm8k/test.jsonl": "c" * 64})
    assert EvalRequest(tasks=("gsm8k",), z_mode="prior", k=5).k == 1
    with pytest.raises(ValueError, match="allowed"):
        EvalRequest(tasks=("gsm8k",), z_mode="Prior")


def test_an_eval_file_without_its_spec_is_refused():
    with pytest.raises(RecordError, match="no eval spec"):
        EvalFile.from_json({"suite": "lm-eval", "tasks": {}}, "lm-eval.json")


def test_a_controls_matched_h_is_explicit_in_its_cell_and_its_run_record():
    assert RunRecord.from_json({"run_id": "a", "arm": "baseline", "train": {
        "compute_match": "flops", "match_latent_bits": 8}}).match_latent_bits == 8
    assert RunRecord.from_json({"run_id": "a", "arm": "baseline", "train": {
        "compute_match": None, "match_latent_bits": 8}}).match_latent_bits is None
    new = ManifestCell.from_json({"cell": "x", "arm": "baseline_flops", "latent_bits": 0,
                                  "match_latent_bits": 16})
    assert (new.latent_bits, new.match_latent_bits) == (0, 16)


def test_metrics_line_keeps_its_order_and_rejects_an_unknown_kind():
    d = {"kind": "train", "step": 1, "tokens": 2, "flops": 3, "ce": 4.0, "kl_nats": 0.0}
    assert json.dumps(MetricsLine.from_json(d).to_json()) == json.dumps(d)
    with pytest.raises(RecordError, match="kind 'bogus'"):
        MetricsLine.from_json({"kind": "bogus", "step": 1})


def test_the_launchers_manifest_names_each_h_once_and_the_analysis_reads_it(tmp_path):
    """The built manifest writes a FLOPs control's own H (0) as latent_bits and the H it matches as
    match_latent_bits; the frame pairs it with that H (match_h) from the manifest alone."""
    import yaml

    from analysis.frame import load_sweep
    from sweeps import manifest as M
    from sweeps import plan as L
    from sweeps.grid import SweepSpec, expand

    spec = SweepSpec.from_text(kappa="1", h="4 8", seeds="0",
                               controls="flops plus1 plus1_flops", tokens="1k")
    cells = []
    for c in expand(spec):
        rid = c.name.replace(".", "_")
        rd = tmp_path / "runs" / rid
        rd.mkdir(parents=True)
        cells.append(L.PlannedCell(cell=c, config={}, run_id=rid, run_dir=rd, tokens=1.0,
                                   flops=1.0, flops_per_token=1.0))
        cfg = {"run_id": rid, "arm": "free" if c.arm == "free" else "baseline",
               "model": {"latent_bits": c.latent_bits if c.arm == "free" else 0},
               "train": {"compute_match": None}}  # no match_latent_bits to fall back on
        (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    p = L.Plan(name="m", spec=spec, folder=tmp_path / "sweeps" / "m", results=tmp_path,
               cells=cells)
    m = M.build(p, "local", None).to_json()
    got = {c["cell"]: (c["arm"], c["latent_bits"], c["match_latent_bits"]) for c in m["cells"]}
    want = {c.name: (c.arm, c.latent_bits if c.arm == "free" else 0,
                     c.latent_bits if c.arm in ("baseline_flops", "baseline_plus1_flops")
                     else None) for c in expand(spec)}
    assert got == want
    assert {v[2] for v in got.values()} == {None, 4, 8}
    p.folder.mkdir(parents=True)
    (p.folder / "manifest.json").write_text(json.dumps(m))
    cells = load_sweep("m", tmp_path).cells.set_index("cell")
    for name, (_arm, lb, match) in want.items():
        assert cells.loc[name, "latent_bits"] == lb
        mh = cells.loc[name, "match_h"]
        assert (mh != mh) if match is None else mh == match
