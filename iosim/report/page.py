"""The one-file HTML report: every scenario's text, claims, tables and figures on one page, with plotly's
JavaScript embedded once in the head (no CDN), so the file opens offline."""

from __future__ import annotations

import datetime as _dt
import html
import re

from plotly.offline import get_plotlyjs

from .._version import __version__
from ..scenario import ScenarioRun
from .cpu import SECTION_ID, TITLE, CpuMeasurement, cpu_section
from .figures import PLOTLY_CONFIG, make_figures
from .fp8 import SECTION_ID as FP8_ID
from .fp8 import TITLE as FP8_TITLE
from .fp8 import fp8_section
from .serving import SECTION_ID as SERVING_ID
from .serving import TITLE as SERVING_TITLE
from .serving import serving_section
from .speedups import SECTION_ID as SPEEDUP_ID
from .speedups import TITLE as SPEEDUP_TITLE
from .speedups import GpuSpeedups, builtin_report, load_speedups, speedup_section
from .tables import make_tables
from .training import SECTION_ID as TRAINING_ID
from .training import TITLE as TRAINING_TITLE
from .training import training_section


def _md(text: str) -> str:
    """A small, safe subset of Markdown for scenario descriptions: paragraphs, '- ' lists, `code`, **bold**,
    *italic*, [links](url). Everything is HTML-escaped first."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [ln.rstrip() for ln in block.splitlines()]
        if lines and all(ln.lstrip().startswith("- ") for ln in lines if ln.strip()):
            items = "".join(f"<li>{_inline(ln.lstrip()[2:])}</li>" for ln in lines if ln.strip())
            out.append(f"<ul>{items}</ul>")
        elif lines:
            out.append(f"<p>{_inline(' '.join(ln.strip() for ln in lines))}</p>")
    return "\n".join(out)


def _inline(s: str) -> str:
    s = html.escape(s, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"(?<![*\w])\*([^*\s][^*]*)\*(?!\w)", r"<em>\1</em>", s)
    s = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r'<a href="\2">\1</a>', s)
    return s


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:24px 32px 64px;background:#fff}
h1{font-size:1.8em;margin-bottom:.2em} h2{margin-top:2.2em;border-bottom:2px solid #eee;padding-bottom:.2em}
h3{margin-top:1.4em;font-size:1.1em}
.meta{color:#666;font-size:.9em} code{background:#f2f2f2;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.86em} th,td{border:1px solid #ddd;padding:4px 8px}
th{background:#f5f5f5;text-align:left} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{background:#fbfbf3} .ok{color:#1a7f37;font-weight:600} .bad{color:#c62828;font-weight:600}
.warn{color:#b26a00} .src{color:#555;font-size:.92em;max-width:380px}
figure{margin:1em 0 2em} figcaption{color:#555;font-size:.9em;margin-top:.3em}
nav ol{columns:2;column-gap:3em;font-size:.95em} nav li{break-inside:avoid;margin-bottom:.2em}
.note{background:#fff8e1;border-left:4px solid #f0c36d;padding:6px 12px}
.wide{overflow-x:auto;max-width:100%} p,li,figcaption{overflow-wrap:anywhere}
@media (max-width:900px){main{padding:16px 12px 48px} nav ol{columns:1}}
"""


def render_report(runs: list[ScenarioRun], title: str = "iosim report: attention I/O, simulated",
                   elapsed_s: float | None = None, cpu: CpuMeasurement | None = None,
                   speedups: list[GpuSpeedups] | None = None) -> str:
    """One self-contained HTML page: every scenario's text, claims, tables and figures; plotly's JavaScript
    is embedded once in the head (no CDN), so the file opens offline. The section "Measured speedups" follows the
    scenarios: from ``speedups``, or, where that is None and ``runs`` are the built-in scenarios, from the
    committed records ([]: no section), then the sections "Training: forward + backward", "Serving: decode,
    varlen, sliding windows" and "FP8 forward" from their committed records (built-in scenarios only). With ``cpu`` (measured now or a committed record), the section
    "Attention on a CPU" comes last."""
    sections = [_section(run) for run in runs]
    toc = "".join(f'<li><a href="#{r.scenario.name}">{html.escape(r.scenario.title)}</a></li>' for r in runs)
    if speedups is None and builtin_report(runs):
        speedups = load_speedups()
    if speedups:
        sections.append(speedup_section(speedups))
        toc += f'<li><a href="#{SPEEDUP_ID}">{SPEEDUP_TITLE}</a></li>'
    if builtin_report(runs):
        sections.append(training_section())
        toc += f'<li><a href="#{TRAINING_ID}">{TRAINING_TITLE}</a></li>'
        sections.append(serving_section())
        toc += f'<li><a href="#{SERVING_ID}">{SERVING_TITLE}</a></li>'
        sections.append(fp8_section())
        toc += f'<li><a href="#{FP8_ID}">{FP8_TITLE}</a></li>'
    if cpu is not None:
        sections.append(cpu_section(cpu))
        toc += f'<li><a href="#{SECTION_ID}">{TITLE}</a></li>'
    n_fig = sum(n for _, n in sections)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    took = f" in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><style>{CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body><main>
<h1>{html.escape(title)}</h1>
<p class=meta>iosim {__version__} · generated {stamp}{took} · {len(runs)} scenarios · {n_fig} figures ·
bytes in decimal units (1 MB = 10<sup>6</sup> B) unless marked MiB/GiB; hover over a number for the exact bytes.</p>
<p>Boundaries: <b>global</b> = every load and store the schedule issues (SM ↔ L2; the papers' "HBM accesses"),
<b>hbm</b> = what reaches DRAM (equal to global until the L2 model is applied), <b>sram</b> = bytes written into and
read out of on-chip memory. Counts are exact integers for the whole problem (all batches and heads).</p>
<nav><ol>{toc}</ol></nav>
{''.join(html_ for html_, _ in sections)}
</main></body></html>
"""


FOLD_ROWS = 12  # a table with more rows than this is folded behind its title (a click opens it)


def _table_html(t_title: str, caption: str | None, t_html: str) -> str:
    """One table in a box that scrolls sideways on its own; folded behind a summary when it is long."""
    rows = max(0, t_html.count("<tr") - 1)
    body = f"<div class=wide>{t_html}</div>" + (f"<p class=meta>{_inline(caption)}</p>" if caption else "")
    if rows > FOLD_ROWS:
        return f"<details><summary><b>{html.escape(t_title)}</b> ({rows} rows)</summary>{body}</details>"
    return f"<h3>{html.escape(t_title)}</h3>{body}"


def _section(run: ScenarioRun) -> tuple[str, int]:
    """One scenario's section and its number of figures: the text, then the figures, then the tables (long ones
    folded behind their title, so a section reads like a paper's: figure first, the data one click away)."""
    scn = run.scenario
    parts = [f'<section id="{scn.name}"><h2>{html.escape(scn.title)}</h2>', _md(scn.description)]
    profiles = ", ".join(p.get("display_name", n) for n, p in run.profiles.items())
    parts.append(f'<p class=meta>Scenario <code>{scn.name}</code> · {len(run.records)} simulated cases · '
                 f'profiles: {html.escape(profiles)} · schedules: {", ".join(scn.schedules)}</p>')
    n_fig = 0
    for fo in make_figures(run):
        if fo.fig is None:
            parts.append(f"<p class=note>{html.escape(fo.note)}</p>")
            continue
        div = fo.fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{fo.name}",
                             config=PLOTLY_CONFIG)
        cap = _inline(fo.spec.caption) + (f" {html.escape(fo.note)}" if fo.note else "")
        parts.append(f"<figure>{div}<figcaption>{cap}</figcaption></figure>")
        n_fig += 1
    parts += [_table_html(t_title, caption, t_html) for t_title, caption, t_html in make_tables(run)]
    parts.append("</section>")
    return "\n".join(parts), n_fig
