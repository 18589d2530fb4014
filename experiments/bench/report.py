"""The bench's verdicts (targets) and its Markdown (docs/BENCH.md for the full size)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    sec = res["sections"]
    t: list[dict[str, Any]] = []

    def add(name: str, goal: str, value: float | None, met: bool | None) -> None:
        t.append({"target": name, "goal": goal, "measured": value, "met": met})

    tr = sec.get("train", {}).get("baseline_vs_hf")
    if tr:
        v = tr["speedup_ours_over_hf"]["median"]
        add("baseline training throughput vs HF", ">= 1.2x", v, v >= 1.2)
    ov = sec.get("free", {}).get("overhead", {})
    if ov.get("bits"):
        h = min(ov["bits"].values(), key=lambda r: r["H"])
        v = h["step_ratio"]["median"] - 1.0
        goal = ov["paper_overhead"] + 0.02
        add(f"FT/baseline step-time overhead at H={h['H']}",
            f"<= 1/L + 2% = {goal:.3f}", v, v <= goal)
    mp = sec.get("mapper", {}).get("rows")
    if mp:
        r = max(mp, key=lambda r: (r["H"], r["tokens"]))
        add(f"mapper peak memory ours/dense at H={r['H']}, {r['tokens']} tokens", "<= 0.1",
            r["memory_ratio"], r["memory_ratio"] <= 0.1)
    gen = sec.get("generate", {})
    if "kv_speedup_over_recompute" in gen:
        v = gen["kv_speedup_over_recompute"]["median"]
        add(f"KV cache vs recompute at {gen['new_tokens']} new tokens", ">= 5x", v, v >= 5)
    gb = sec.get("generate_batch", {})
    if "speedup_ours_over_hf" in gb:
        v = gb["speedup_ours_over_hf"]["median"]
        add(f"batched generation ours vs HF generate at batch {gb['batch']}", ">= 1.5x", v,
            v >= 1.5)
    mmlu = sec.get("eval", {}).get("tasks", {}).get("mmlu_5shot", {})
    v = mmlu["speedup_ours_over_hf"]["median"] if "speedup_ours_over_hf" in mmlu else None
    add("5-shot MMLU-like MC eval ours vs lm-eval hf", ">= 2x", v, None if v is None else v >= 2)
    return t


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                             trim_blocks=True, lstrip_blocks=True, autoescape=False,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(
        med=lambda d: f"{d['median']:.3f} [{d['min']:.3f}, {d['max']:.3f}]",
        x=lambda d: f"{d['median']:.2f}x [{d['min']:.2f}, {d['max']:.2f}]",
        mb=lambda b: f"{b / 2**20:.1f}",
        load=lambda la: "n/a" if not la else "/".join(f"{x:.1f}" for x in la))
    return env.get_template("bench.md.j2")


def render_markdown(res: dict[str, Any]) -> str:
    """The run's Markdown (bench.md.j2), one blank line between blocks."""
    return _template().render(res=res).rstrip("\n") + "\n"
