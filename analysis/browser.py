"""Open a report in headless Chromium (Debian's `chromium` package) and check it renders.

The report carries a small script that, on `load`, marks broken images and missing sections on
<body> (data-check="ok" | "fail"). This module runs `chromium --dump-dom` to read those marks and
`--screenshot` to keep a picture of the page as an artifact. Network is disabled in the browser
profile flags; the report needs none.

    python -m analysis.browser results/sweeps/<name>/report.html --screenshot out.png
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

REQUIRED_SECTIONS = ["lead", "card", "summary", "signal-noise", "verdicts", "table-tokens",
                     "table-flops", "claims", "table3", "likelihood", "probe",
                     "eval-completeness", "figures", "synthetic", "appendix", "runs",
                     "provenance"]
"""Section ids every report has; the report's CHECK_JS and `check_report` look for each."""
MEASURED = ["lead", "card"]
"""Elements whose position on the page the check records (data-top-<id>: px from the top of
the page at the window's width), beside the page's height (data-page-height)."""

CHECK_JS = """
window.addEventListener('load', function () {
  var required = %s, measured = %s;
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; });
  broken.forEach(function (i) { i.setAttribute('data-broken', '1'); });
  var missing = required.filter(function (id) { return !document.getElementById(id); });
  document.body.setAttribute('data-images', imgs.length);
  document.body.setAttribute('data-broken-images', broken.length);
  document.body.setAttribute('data-missing-sections', missing.join(','));
  document.body.setAttribute('data-page-height', document.documentElement.scrollHeight);
  measured.forEach(function (id) {
    var e = document.getElementById(id);
    if (e) {
      var top = Math.round(e.getBoundingClientRect().top + window.scrollY);
      document.body.setAttribute('data-top-' + id, top);
    }
  });
  document.body.setAttribute('data-check', broken.length || missing.length ? 'fail' : 'ok');
});
"""
"""The script the report embeds (formatted with REQUIRED_SECTIONS and MEASURED as JSON lists):
on `load` it marks <body> with what `check_report` reads: broken images, missing sections, the
page height and the top of each MEASURED element, in CSS px at the window's width."""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]


def find_chromium() -> str | None:
    """$CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    names = ("chromium", "chromium-browser", "google-chrome")
    return os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, names)), None)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def check_report(html_path: str | os.PathLike, screenshot: str | os.PathLike | None = None,
                 width: int = 1400, height: int = 1000, timeout: float = 90) -> dict:
    """Render the report at `width` px; return {"ok", "images", "broken_images",
    "missing_sections", "page_height", "top" ({id: px} of MEASURED), "screenshot" (the first
    `height` px: what a reader sees without scrolling)}. Raises FileNotFoundError when no
    Chromium is installed."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install -y chromium)")
    url = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="ftbench-chromium-") as prof:
        base = [exe, *FLAGS, f"--user-data-dir={prof}", f"--window-size={width},{height}"]
        dom = _run([*base, "--virtual-time-budget=10000", "--dump-dom", url], timeout)
        shot = None
        if screenshot is not None:
            shot = Path(screenshot).resolve()
            shot.parent.mkdir(parents=True, exist_ok=True)
            _run([*base, "--virtual-time-budget=5000", f"--screenshot={shot}", url], timeout)
    m = re.search(r"<body([^>]*)>", dom.stdout)
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', m.group(1))) if m else {}
    ids = set(re.findall(r'\sid="([^"]+)"', dom.stdout))
    missing = [s for s in REQUIRED_SECTIONS if s not in ids]
    res = {"ok": attrs.get("data-check") == "ok" and not missing,
           "check": attrs.get("data-check"), "images": int(attrs.get("data-images", 0) or 0),
           "broken_images": int(attrs.get("data-broken-images", -1) or 0),
           "missing_sections": missing or [s for s in attrs.get("data-missing-sections",
                                                                  "").split(",") if s],
           "screenshot": str(shot) if shot and shot.is_file() else None,
           "dom_chars": len(dom.stdout),
           "page_height": int(attrs.get("data-page-height", -1) or -1),
           "top": {k.removeprefix("data-top-"): int(v) for k, v in attrs.items()
                   if k.startswith("data-top-")}}
    if not m:
        res["stderr"] = dom.stderr[-2000:]
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html")
    ap.add_argument("--screenshot", default=os.environ.get("FTBENCH_SCREENSHOT"))
    a = ap.parse_args(argv)
    res = check_report(a.html, a.screenshot)
    print(res)
    raise SystemExit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
