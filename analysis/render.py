"""The one way the suite writes Markdown and HTML: a DataFrame of cell texts becomes a table
(`md`, `html`), and a doc's GENERATED blocks are re-rendered from their tables (`blocks`,
`write_doc`). Every report, doc and harness renders through here; a missing number is a dash,
never 0.
"""

from __future__ import annotations

import base64
import functools
import html as _html
import io
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from common.errors import UsageError
from common.io import atomic_write_text

DASH = "–"
END = "<!-- END GENERATED -->"


def num(x: Any) -> float:
    """A number from a file or a frame: None, text and NaN are NaN (missing), never 0."""
    try:
        return float(x) if not isinstance(x, bool) else math.nan
    except (TypeError, ValueError):
        return math.nan


def fmt(x: Any, spec: str = ".3f", none: str = DASH) -> str:
    """`x` formatted by `spec` ('+.4f', '.3g', ...), `none` when it is missing."""
    v = num(x)
    return none if not math.isfinite(v) else format(v, spec)


def ci(m: Any, lo: Any, hi: Any, spec: str = ".3f", none: str = DASH, lone: str = "") -> str:
    """'m [lo, hi]'; 'm' + `lone` when the interval is missing (e.g. ' (no interval)')."""
    s = fmt(m, spec, none)
    if s == none:
        return s
    if not (math.isfinite(num(lo)) and math.isfinite(num(hi))):
        return s + lone
    return f"{s} [{fmt(lo, spec)}, {fmt(hi, spec)}]"


def md(df: pd.DataFrame) -> str:
    """A DataFrame of cell texts as a GitHub Markdown table, cells as given (unpadded, so a
    changed number is a one-line diff); '|' inside a cell is escaped."""
    cell = (lambda v: str(v).replace("|", "\\|"))
    rows = ["| " + " | ".join(map(cell, df.columns)) + " |", "|" + "---|" * df.shape[1]]
    rows += ["| " + " | ".join(map(cell, r)) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def esc(x: object) -> str:
    return _html.escape("" if x is None else str(x))


def cell_html(x: object, spec: str = ".3g") -> str:
    """One HTML cell: missing is a grey dash, a float formatted by `spec`, text escaped."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return '<span class="missing">—</span>'
    return format(x, spec) if isinstance(x, float) else esc(x)


def html(df: pd.DataFrame | None, raw: tuple[str, ...] = ()) -> str:
    """A DataFrame as an HTML table (pandas' to_html); columns in `raw` hold HTML already."""
    if df is None or df.empty:
        return '<p class="missing">no rows</p>'
    shown = df.apply(lambda c: c if c.name in raw else c.map(cell_html))
    return ('<div class="wide">' + shown.to_html(index=False, escape=False, border=0,
                                                 justify="left") + "</div>")


def png(fig: Any, dpi: int = 100) -> bytes | None:
    """A matplotlib figure as PNG bytes (tight box), the figure closed; None for no figure."""
    import matplotlib.pyplot as plt

    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def img(png: bytes | None, alt: str, missing: str) -> str:
    """An embedded PNG, or the sentence that says why there is none."""
    if not png:
        return f'<p class="missing">{esc(alt)}: {esc(missing)}</p>'
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


@functools.cache
def _env() -> jinja2.Environment:
    """One environment for every template (it caches their parse). No autoescape: HTML values
    escape through the `esc` filter (html.escape, `&#x27;`), where markupsafe would write other
    bytes (`&#39;`)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update(esc=esc, table=html, img=img)
    return env


def template(name: str) -> jinja2.Template:
    """analysis/templates/<name>: the prose of a doc, its values computed by the caller; a name
    the caller did not pass raises (StrictUndefined), never renders empty."""
    return _env().get_template(name)


def blocks(text: str, begin: str, body: Callable[[str], str]) -> tuple[str, list[str]]:
    """`text` with every block `<begin><src> -->...<!-- END GENERATED -->` re-rendered as
    body(src) (the text between '-->' and the end marker); returns (text, sources).
    UsageError for a block that is never closed."""
    out, srcs, pos = [], [], 0
    while (b := text.find(begin, pos)) >= 0:
        head = text.find("-->", b + len(begin))
        e = text.find(END, head)
        if head < 0 or e < 0:
            raise UsageError(f"a generated block opened at offset {b} is never closed by {END}")
        src = text[b + len(begin):head].strip().strip("`").strip()
        srcs.append(src)
        out.append(text[pos:head + 3] + body(src))
        pos = e
    return "".join(out) + text[pos:], srcs


def write_doc(path: Path, new: str, check: bool, how: str) -> int:
    """Write a regenerated doc (only when it changed); with `check`, write nothing and return
    1 when it is out of date (`how`: the command that regenerates it)."""
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    if check:
        if new != old:
            print(f"{path}: out of date; run {how}", file=sys.stderr)
            return 1
        print(f"{path}: up to date")
        return 0
    if new != old:
        atomic_write_text(path, new)
    print(f"{path}: written")
    return 0
