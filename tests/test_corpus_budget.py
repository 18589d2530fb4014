"""Issue 37, the corpus half: a mixture that reaches its budget or says it cannot, explicit
per-source passes, resumable hub streams, lazily opened shards, the stdlib corpus's known size,
and --verify from the manifest. Nothing here reaches the hub: every hf source is a fake stream
of local texts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from common.errors import UsageError
from experiments.corpus import budget as B
from experiments.corpus import shards as S
from experiments.corpus import sources as SRC
from experiments.corpus.build import SCAN_STATE, build
from experiments.corpus.config import DataConfig, HFSource


# ------------------------------------------------------------------ a fake hub source
class FakeStream:
    """A source's stream of {'__text': ...} records with datasets' state_dict protocol; it
    raises ConnectionError at record `fail_at` (once per stream object)."""

    def __init__(self, texts: list[str], fail_at: int | None = None) -> None:
        self.texts, self.pos, self.fail_at = texts, 0, fail_at

    def __iter__(self):
        while self.pos < len(self.texts):
            if self.fail_at is not None and self.pos == self.fail_at:
                raise ConnectionError("connection reset by peer")
            self.pos += 1
            yield {"__text": self.texts[self.pos - 1]}

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, st: dict) -> None:
        self.pos = self.loaded = st["pos"]


def _texts(tag: str, n: int, size: int) -> list[str]:
    return [f"{tag} document {i} " + "x" * (size - len(f"{tag} document {i} ")) for i in range(n)]


CORPUS = {"big": _texts("web", 400, 100), "small": _texts("math", 30, 100)}


def _opener(log: list, fail: dict | None = None):
    def open_source(s: HFSource) -> FakeStream:
        f = (fail or {}).pop(s.path, None)  # fail once, on the first stream opened
        log.append(s.path)
        return FakeStream(CORPUS[s.path], fail_at=f)
    return open_source


def _cfg(**kw) -> DataConfig:
    base = {"source": "hf", "hf_max_bytes": 20_000, "val_fraction": 0.1, "shard_bytes": 2_000,
            "hf_sources": [HFSource(path="big", weight=3.0),
                           HFSource(path="small", weight=1.0, passes=2)]}
    base.update(kw)
    return DataConfig(**base)


def test_the_mixture_takes_each_source_by_its_byte_share_and_repeats_only_as_allowed():
    mix = SRC.HFMixture(_cfg(), open_source=_opener([]))
    docs = list(mix)
    by = {"web": 0, "math": 0}
    for _, t in docs:
        by[t.split()[0]] += len(t)
    assert sum(by.values()) >= 20_000 and by["math"] / sum(by.values()) == pytest.approx(0.25,
                                                                                        abs=0.01)
    # 'small' (3,000 bytes) gives 5,000: a second pass, its keys those of the first
    math_keys = [k for k, t in docs if t.startswith("math")]
    assert len(math_keys) == 50 and len(set(math_keys)) == 30
    s = {m["path"]: m for m in mix.summary()}
    assert s["small"]["passes_completed"] == 1 and s["small"]["passes"] == pytest.approx(50 / 30)
    assert s["big"]["passes"] is None and s["big"]["passes_note"]


def test_a_source_that_runs_dry_stops_the_stream_naming_it():
    cfg = _cfg(hf_sources=[HFSource(path="big", weight=3.0), HFSource(path="small", weight=1.0)])
    with pytest.raises(UsageError, match=r"small ran out after 1 pass\(es\).*passes: 2"):
        list(SRC.HFMixture(cfg, open_source=_opener([])))
    # null byte cap: the first source to finish its passes ends the stream, no error
    docs = list(SRC.HFMixture(_cfg(hf_max_bytes=None), open_source=_opener([])))
    assert sum(t.startswith("math") for _, t in docs) == 60


def test_a_hub_stream_that_fails_midway_resumes_where_it_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(SRC, "open_hf_source", _opener([], {"big": 0}))
    with pytest.raises(UsageError):  # on the first record: nothing is left
        build(_cfg(), tmp_path / "bad", vocab_size=300, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "bad").exists()
    log: list = []
    monkeypatch.setattr(SRC, "open_hf_source", _opener(log, {"big": 100}))
    out = tmp_path / "resumed"
    with pytest.raises(UsageError, match="re-run the same command to continue"):
        build(_cfg(), out, vocab_size=300, cache_dir=tmp_path / "cache")
    state = json.loads((out / SCAN_STATE).read_text())
    kept = sorted(p.name for p in (out / "text").glob("part-*.jsonl"))
    assert kept and len(state["units"]) == len(kept)  # the streamed parts are kept
    pos = state["mixture"]["sources"][0]["stream"]["pos"]
    assert 0 < pos <= 100
    log.clear()
    opened: list[FakeStream] = []

    def spy(s: HFSource) -> FakeStream:
        st = FakeStream(CORPUS[s.path])
        opened.append(st)
        return st

    monkeypatch.setattr(SRC, "open_hf_source", spy)
    man = build(_cfg(), out, vocab_size=300, cache_dir=tmp_path / "cache")
    # the re-run did not stream again what was kept: 'big' started at the saved position
    assert next(st for st in opened if st.texts is CORPUS["big"]).loaded == pos
    assert not (out / "text").exists()  # the parts went once the build was complete
    # the same corpus as a build never interrupted
    monkeypatch.setattr(SRC, "open_hf_source", _opener([]))
    ref = build(_cfg(), tmp_path / "whole", vocab_size=300, cache_dir=tmp_path / "cache")
    assert man == ref
    for s in ref["shards"]:
        assert (out / s["file"]).read_bytes() == (tmp_path / "whole" / s["file"]).read_bytes()
    mix = {m["path"]: m for m in man["source"]["mixture"]}
    assert mix["small"]["passes_completed"] == 1 and mix["small"]["passes_allowed"] == 2


# ------------------------------------------------------------------ the budget, per source
def _recipe_mix(weights, passes=(1, 1, 1), cap=None) -> DataConfig:
    names = [("HuggingFaceFW/fineweb-edu", "default"), ("HuggingFaceTB/finemath",
                                                         "finemath-3plus"),
             ("bigcode/starcoderdata", None)]
    return DataConfig(source="hf", val_fraction=0.001, hf_max_bytes=cap,
                      hf_sources=[HFSource(path=p, name=n, weight=w, passes=k)
                                  for (p, n), w, k in zip(names, weights, passes, strict=True)])


def test_a_source_too_small_for_its_share_is_one_line_naming_it():
    # the 8B-1T mix before this issue: 25% of 1T is 7.4 passes over FineMath-3+'s 34B tokens
    chk = B.check_budget(_recipe_mix((0.58, 0.25, 0.17), (1, 8, 1)), 1e12)
    assert chk.refusal and "\n" not in chk.refusal
    assert "HuggingFaceTB/finemath (finemath-3plus) is too small" in chk.refusal
    assert "MAX_PASSES=4" in chk.refusal
    # within MAX_PASSES but over its cap: says what to set
    chk = B.check_budget(_recipe_mix((0.58, 0.25, 0.17)), 200e9)
    assert "passes=1; give it passes: 2" in chk.refusal
    # every source's passes are on a line of its own
    ok = B.check_budget(_recipe_mix((0.58, 0.25, 0.17), (1, 2, 1), cap=10**12), 200e9,
                        bytes_per_token=4.5)
    assert ok.refusal is None
    assert sum("passes (allowed" in line for line in ok.lines) == 3
    assert any("1.47 passes (allowed 2); repeats" in line for line in ok.lines)
    short = B.check_budget(_recipe_mix((0.58, 0.25, 0.17), (1, 2, 1), cap=10**11), 200e9,
                           bytes_per_token=4.5)
    assert "raise data.hf_max_bytes to" in short.refusal


def test_the_passes_are_the_known_sizes_over_the_shares():
    p = B.plan_sources(_recipe_mix((0.5, 0.25, 0.25)), 100e9)
    total = 100e9 / 0.999
    assert p[1].tokens == pytest.approx(0.25 * total)
    assert p[1].passes == pytest.approx(0.25 * total / 34e9)
    assert p[0].passes == pytest.approx(0.5 * total / 1.3e12)
    unknown = DataConfig(source="hf", hf_sources=[HFSource(path="some/thing")])
    assert B.plan_sources(unknown, 1e9)[0].passes is None
    assert "size unknown" in B.check_budget(unknown, 1e9).lines[1]


@pytest.mark.slow  # plans every recipe's grid; check_budget's fast tests are above
def test_the_recipes_budget_is_their_costliest_cell_and_they_reach_it():
    from sweeps import plan as sweep_plan
    from sweeps.recipe import load

    for name in ("cpu-mini", "paper-8B"):
        rec = load(name)
        cells = sweep_plan.plan(rec.sweep_spec()).cells
        assert rec.budget_tokens == max(c.tokens for c in cells)
        assert rec.budget_tokens > rec.steps * rec.tokens_per_step  # the flops control
    for name in ("paper-1.5B", "paper-8B", "paper-8B-1T"):
        rec = load(name)
        dc = rec.data_config()
        dc.hf_max_bytes = rec.hf_max_bytes
        for s, n in zip(dc.hf_sources, rec.source_passes, strict=True):
            s.passes = n
        chk = B.check_budget(dc, rec.budget_tokens, bytes_per_token=rec.corpus.bytes_per_token)
        assert chk.refusal is None, (name, chk.refusal)
        assert rec.corpus.val_fraction == 0.001
    assert load("paper-8B").source_passes == (1, 2, 1)
    assert load("paper-8B-1T").source_passes == (1, 4, 1)


# ------------------------------------------------------------------ the stdlib corpus's size
@pytest.mark.slow  # builds a small stdlib corpus (~10 s on a loaded machine)
def test_the_stdlib_token_bound_holds_and_refuses_too_many_passes(tmp_path):
    from experiments.corpus.sources import stdlib_docs

    dc = DataConfig(max_bytes=60_000)
    tokens, nbytes, how = B.token_bound(dc)
    docs = stdlib_docs(60_000)
    assert nbytes == sum(len(t.encode()) for _, t in docs) and tokens >= nbytes
    man = build(dc, tmp_path / "c", vocab_size=300, cache_dir=tmp_path / "cache")
    assert man["tokens"]["train"] <= tokens
    line, refusal = B.bound_refusal(dc, samples_asked=10, seq_len=64)
    assert refusal is None and line.startswith("epochs      at least")
    _, refusal = B.bound_refusal(dc, samples_asked=tokens, seq_len=64)
    assert refusal and "passes over the stdlib corpus" in refusal and "\n" not in refusal


# ------------------------------------------------------------------ lazily opened shards
def _fds_in(d: Path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(d))
        except OSError:
            pass
    return n


def _maps_in(d: Path) -> int:
    with open("/proc/self/maps") as f:
        return len({line.split()[-1] for line in f if str(d) in line})


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_rank_reading_1000_shards_keeps_at_most_the_bound_open(tmp_path):
    rng = np.random.default_rng(0)
    shards, arrays = [], []
    for i in range(1000):
        a = rng.integers(0, 2**16, size=int(rng.integers(0, 50)), dtype="<u2")  # empty too
        a.tofile(tmp_path / f"train-{i:05d}.bin")
        shards.append({"file": f"train-{i:05d}.bin", "tokens": len(a)})
        arrays.append(a)
    whole = np.concatenate(arrays)
    S.open_map.cache_clear()
    ts = S.TokenStream(tmp_path, shards, "<u2")
    assert _fds_in(tmp_path) == 0 and _maps_in(tmp_path) == 0  # nothing opened up front
    peak_fd = peak_map = 0
    for i in range(1000):
        a = int(rng.integers(0, len(whole) - 1))
        b = min(len(whole), a + int(rng.integers(1, 200)))
        got = ts[a:b]
        assert np.array_equal(got, whole[a:b])  # the values of one array, as before
        if i % 50 == 0:  # /proc is slow to list: a sample of the reads
            peak_fd = max(peak_fd, _fds_in(tmp_path))
            peak_map = max(peak_map, _maps_in(tmp_path))
    assert 0 < peak_fd <= S.MAX_OPEN_SHARDS and 0 < peak_map <= S.MAX_OPEN_SHARDS
    assert np.array_equal(np.asarray(ts), whole)
    assert np.array_equal(ts[len(whole) - 5:len(whole) + 3], whole[-5:])  # past the end
    assert _fds_in(tmp_path) <= S.MAX_OPEN_SHARDS
    S.open_map.cache_clear()
    assert _fds_in(tmp_path) == 0 and _maps_in(tmp_path) == 0
    short = next(s for s, a in zip(shards, arrays, strict=True) if len(a))["file"]
    (tmp_path / short).write_bytes((tmp_path / short).read_bytes()[:-2])  # shorter than said
    with pytest.raises(UsageError, match=short):
        S.TokenStream(tmp_path, shards, "<u2")


# ------------------------------------------------------------------ --verify
def test_verify_reads_what_it_needs_from_the_manifest(tmp_path, capsys):
    from experiments.corpus.__main__ import main

    out = tmp_path / "c"
    assert main(["--out", str(out), "--vocab-size", "300", "--workers", "1", "--quiet",
                 "max_bytes=100000"]) == 0
    capsys.readouterr()
    assert main(["--out", str(out), "--verify"]) == 0
    assert "verified against the manifest" in capsys.readouterr().out
    shard = next(out.glob("train-*.bin"))
    shard.write_bytes(b"\0\0" + shard.read_bytes()[2:])
    assert main(["--out", str(out), "--verify"]) == 2
    assert "differ from the manifest" in capsys.readouterr().err


def test_a_sources_passes_cap_and_other_new_data_keys_keep_the_corpus_and_the_run_id():
    """(The default config's run-id from before experiments/corpus: test_golden_plans.)"""
    from experiments.corpus.build import request_of
    from experiments.train.config import compose
    from experiments.train.plan import run_id

    def cfg(passes: int):
        return compose(["data=hf", f"data.hf_sources=[{{path:a,weight:1,passes:{passes}}},"
                        "{path:b,weight:1}]"])

    one, two = cfg(1), cfg(2)
    assert two.data.hf_sources[0].passes == 2
    assert run_id(one) == run_id(two)
    assert request_of(one.data, 300) == request_of(two.data, 300)
    base = compose(["model=1M"])
    assert run_id(base) == run_id(compose(["model=1M", "data.max_epochs=3",
                                           "data.shard_bytes=1000"]))
    assert run_id(compose(["model=1M", "data.corpus=/x"])) != run_id(base)


def test_make_paper_refuses_a_source_too_small_in_one_line_before_building(tmp_path, capsys):
    """The 8B-1T mix of before (25% math at 1T) through the paper's dry run and its real run:
    one line naming FineMath-3+, exit 2, nothing built."""
    from pipelines.paper import main
    from sweeps.recipe import RECIPES_DIR

    text = (RECIPES_DIR / "paper-8B-1T.yaml").read_text()
    text = text.replace("weight: 0.71", "weight: 0.58").replace("weight: 0.12", "weight: 0.25")
    rec = tmp_path / "old-1T.yaml"
    rec.write_text(text)
    for dry in (["--dry"], []):
        assert main(["--recipe", str(rec), *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert "HuggingFaceTB/finemath (finemath-3plus) is too small for its 25.0% share" in err
    from pipelines.paper import corpus_stage
    from sweeps.recipe import load

    assert not corpus_stage(load(str(rec)), [])["dir"].exists()  # nothing built


@pytest.mark.slow  # the real datasets streaming code on local json files (~10 s)
def test_a_real_datasets_stream_resumes_from_its_state(tmp_path, monkeypatch):
    """HFMixture over datasets' own json and parquet builders: a stream that raises midway is
    continued from datasets' state_dict, and the corpus equals the one built without a
    failure, whatever the worker count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(tmp_path / "a.jsonl", "w") as f:
        for t in _texts("web", 300, 100):
            f.write(json.dumps({"text": t}) + "\n")
    pq.write_table(pa.table({"text": _texts("math", 40, 100)}), tmp_path / "b.parquet")
    real = SRC.open_hf_source
    failed = []

    def flaky(s: HFSource):
        ds = real(s)
        if s.data_files[0].endswith("a.jsonl"):
            first = not failed  # only the first stream of 'a' fails; every one has this shape
            failed.append(1)

            def boom(ex, i, first=first):
                if first and i == 120:
                    raise ConnectionError("reset")
                return ex
            ds = ds.map(boom, with_indices=True)
        return ds

    cfg = _cfg(hf_sources=[HFSource(path="json", data_files=[str(tmp_path / "a.jsonl")],
                                    weight=3.0),
                           HFSource(path="parquet", data_files=[str(tmp_path / "b.parquet")],
                                    weight=1.0, passes=2)])
    monkeypatch.setattr(SRC, "open_hf_source", flaky)
    with pytest.raises(UsageError, match="continue"):
        build(cfg, tmp_path / "r", vocab_size=300, cache_dir=tmp_path / "cache")
    assert (tmp_path / "r" / SCAN_STATE).is_file()
    man = build(cfg, tmp_path / "r", vocab_size=300, cache_dir=tmp_path / "cache")
    ref = build(cfg, tmp_path / "w", vocab_size=300, workers=2, cache_dir=tmp_path / "cache")
    assert man == ref and any(t.startswith("math") for _, t in SRC.HFMixture(cfg))
    for s in ref["shards"]:
        assert (tmp_path / "r" / s["file"]).read_bytes() == (tmp_path / "w" / s["file"]
                                                             ).read_bytes()


def test_the_train_dry_run_shows_each_hf_sources_passes_and_refuses_one_too_small(tmp_path):
    from experiments.train.config import compose
    from experiments.train.plan import epochs_line, plan

    src = ("data.hf_sources=[{path:HuggingFaceFW/fineweb-edu,name:default,weight:0.5},"
           "{path:HuggingFaceTB/finemath,name:finemath-3plus,weight:0.5,passes:%s}]")
    ok = compose(["data=hf", src.replace("%s", "2"), "train.tokens=100B", "data.val_fraction=0.001",
                  f"paths.cache={tmp_path}"])
    text = epochs_line(ok, plan(ok, 1))
    assert "HuggingFaceTB/finemath (finemath-3plus): 50.0%" in text and "1.47 passes" in text
    bad = compose(["data=hf", src.replace("%s", "1"), "train.tokens=100B",
                   "data.val_fraction=0.001", f"paths.cache={tmp_path}"])
    with pytest.raises(UsageError, match="passes=1; give it passes: 2"):
        epochs_line(bad, plan(bad, 1))
