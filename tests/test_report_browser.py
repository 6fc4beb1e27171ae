"""The HTML report in a real browser: headless Chromium opens it offline, no JavaScript error is raised, every
figure is drawn (a plotly div with its SVG), and at 1280 and 800 px wide no text of a figure overlaps another
and the page does not scroll sideways. Screenshots are kept under pytest's tmp dir.

Needs Debian's ``chromium`` (/usr/bin/chromium); skipped, with the reason, where it is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from iosim.cli import main

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]

SMALL = """\
schema_version: 1
name: browser-check
title: "Browser check: every kind of figure"
description: "A small scenario that draws one figure of each kind the simulator feeds."
profiles: [a100-sxm4-80gb, h100-sxm5-80gb]
schedules: [naive, flash1, flash2]
problems:
  - {seq_len: {start: 256, stop: 4096, factor: 4}, heads: 4, head_dim: 64, causal: [false, true]}
tables:
  - {kind: summary, where: {seq_len: 256}}
figures:
  - {kind: traffic_vs_n, where: {profile: h100-sxm5-80gb, causal: false}, compulsory: true}
  - {kind: time_vs_n, where: {causal: false}}
  - {kind: roofline, where: {causal: false}}
  - {kind: by_tensor, where: {seq_len: 256, causal: false, profile: h100-sxm5-80gb}}
  - {kind: bars, x: causal, where: {seq_len: 4096, profile: h100-sxm5-80gb}}
  - {kind: footprint}
"""

# Injected before anything else runs: collect uncaught errors, rejected promises and console.error calls.
CATCH = """<script>window.__iosimErrors=[];
window.addEventListener('error',function(e){window.__iosimErrors.push('error: '+e.message)});
window.addEventListener('unhandledrejection',function(e){window.__iosimErrors.push('rejection: '+e.reason)});
(function(){var ce=console.error;console.error=function(){window.__iosimErrors.push('console.error: '+
Array.prototype.join.call(arguments,' '));ce.apply(console,arguments)}})();</script>"""

# Injected at the end: once loaded, count the figures and the drawn ones, find texts of one figure that overlap
# (titles, axis titles, tick labels, legend entries, annotations; tick labels of one axis among themselves are
# plotly's own layout, rotated where crowded, and not compared), measure the page's width against the window's,
# and write the result into the DOM.
CHECK = """<script>window.addEventListener('load',function(){setTimeout(function(){
var divs=document.querySelectorAll('.plotly-graph-div');var drawn=0;var overlaps=[];
divs.forEach(function(d){if(d.classList.contains('js-plotly-plot')&&d.querySelector('.main-svg')&&
d.querySelectorAll('.main-svg .trace, .main-svg .bars, .main-svg .scatterlayer path').length>0)drawn++;
var texts=[];d.querySelectorAll('.main-svg text').forEach(function(t){var s=t.textContent.trim();if(!s)return;
var st=getComputedStyle(t);if(st.display==='none'||st.visibility==='hidden'||st.opacity==='0')return;
var r=t.getBoundingClientRect();if(r.width<1||r.height<1)return;
var tick=t.closest('.xtick, .ytick');var group=tick?(tick.getAttribute('class')+'@'+
(tick.closest('.subplot')||d).getAttribute('class')+'@'+(tick.parentNode.getAttribute('class')||'')):null;
texts.push({s:s,r:r,g:group});});
for(var i=0;i<texts.length;i++)for(var j=i+1;j<texts.length;j++){var a=texts[i],b=texts[j];
if(a.g&&a.g===b.g)continue;var w=Math.min(a.r.right,b.r.right)-Math.max(a.r.left,b.r.left);
var h=Math.min(a.r.bottom,b.r.bottom)-Math.max(a.r.top,b.r.top);
if(w>1&&h>1)overlaps.push(d.id+': '+JSON.stringify(a.s)+' / '+JSON.stringify(b.s));}});
var pre=document.createElement('pre');pre.id='iosim-check';
pre.textContent=JSON.stringify({figures:divs.length,drawn:drawn,plotly:typeof Plotly,errors:window.__iosimErrors,
overlaps:overlaps,page_width:document.documentElement.scrollWidth,window_width:window.innerWidth});
document.body.appendChild(pre);},1000);});</script>"""

def _report(tmp_path: Path, scenarios: list[str]) -> Path:
    out = tmp_path / "report.html"
    try:
        main(["report", *scenarios, "-o", str(out), "-q"])
    except SystemExit as exc:
        assert exc.code == 0
    return out


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180)


def _check(tmp_path: Path, report: Path, width: int = 1280) -> dict:
    page = report.read_text(encoding="utf-8")
    assert '<script src="http' not in page  # nothing fetched: plotly is embedded
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("<head>", "<head>" + CATCH, 1).replace("</body>", CHECK + "</body>", 1),
                     encoding="utf-8")
    proc = _chromium(tmp_path, "--virtual-time-budget=20000", f"--window-size={width},1000", "--dump-dom",
                     probe.as_uri())
    m = re.search(r'<pre id="iosim-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the check did not run; chromium said: {proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


def _screenshot(tmp_path: Path, report: Path, name: str, width: int = 1280) -> Path:
    shot = tmp_path / name
    _chromium(tmp_path, "--virtual-time-budget=20000", f"--window-size={width},3200", f"--screenshot={shot}",
              report.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000, "chromium wrote no screenshot"
    print(f"\nscreenshot: {shot}")
    keep = os.environ.get("IOSIM_SCREENSHOT_DIR")  # pytest keeps only its last 3 tmp dirs; CI can keep a copy
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        print(f"screenshot kept: {shutil.copy(shot, Path(keep) / name)}")
    return shot


def _assert_reads_well(result: dict, width: int) -> None:
    """No text of a figure on another, and nothing wider than the window."""
    assert result["overlaps"] == [], f"at {width} px, overlapping text: {result['overlaps'][:10]}"
    assert result["page_width"] <= result["window_width"], f"at {width} px the page scrolls sideways"


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("width", [1280, 800])
def test_small_report_renders_every_figure_without_javascript_errors(tmp_path, width):
    scn = tmp_path / "browser-check.yaml"
    scn.write_text(SMALL)
    report = _report(tmp_path, [str(scn)])
    result = _check(tmp_path, report, width)
    assert result["plotly"] == "object"
    assert result["errors"] == []
    assert result["figures"] == 6
    assert result["drawn"] == result["figures"]
    _assert_reads_well(result, width)
    _screenshot(tmp_path, report, f"report-small-{width}.png", width)


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("default-report"), [])


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("width", [1280, 800])
def test_default_report_renders_every_figure_without_javascript_errors(tmp_path, default_report, width):
    n = default_report.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert n >= 5
    result = _check(tmp_path, default_report, width)
    assert result["errors"] == []
    assert result["figures"] == n
    assert result["drawn"] == n
    _assert_reads_well(result, width)
    _screenshot(tmp_path, default_report, f"report-default-{width}.png", width)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("width", [1280, 800])
def test_speedup_section_with_a_measured_run_reads_well(tmp_path, width):
    """Every trace of the section (three kernels measured, two predicted, three claims, two panels), which the
    committed records may not have yet: from the records of tests/test_report_speedups.py."""
    from test_report_speedups import BENCH_HEAD, NEW, TIME_HEAD, _bench_rows, _time_rows

    from iosim.report import load_gpu, render_report

    (tmp_path / "h100-sxm5-80gb.csv").write_text(BENCH_HEAD + _bench_rows("a670eb3", "2026-11-24", NEW))
    (tmp_path / "h100-time.csv").write_text(TIME_HEAD + _time_rows())
    gpu = load_gpu("H100", "h100", "h100-sxm5-80gb", tmp_path, tmp_path)
    report = tmp_path / "speedups.html"
    report.write_text(render_report([], speedups=[gpu]), encoding="utf-8")
    result = _check(tmp_path, report, width)
    assert result["errors"] == [] and result["figures"] == result["drawn"] == 1
    _assert_reads_well(result, width)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("width", [1280, 800])
def test_fp8_section_with_a_measured_run_reads_well(tmp_path, monkeypatch, width):
    """The FP8 figure (four backends, two masks, two head-dim panels), which the committed records do not have yet:
    from the record of tests/test_report_fp8.py."""
    from test_report_fp8 import BENCH_HEAD, NEW_FP8, PROFILE, _bf16_rows, _fp8_rows

    from iosim.report import fp8, render_report

    (tmp_path / f"{PROFILE}.csv").write_text(BENCH_HEAD + _bf16_rows("b0", "2026-12-01", {"iosim-flash3": 0.2,
                                                                                         "sdpa-cudnn": 0.25})
                                             + _fp8_rows("f1", "2026-12-02", NEW_FP8))
    monkeypatch.setattr(fp8, "benchmarks_dir", lambda: tmp_path)
    section, n_fig = fp8.fp8_section()
    report = tmp_path / "fp8.html"
    report.write_text(render_report([]).replace("</main>", section + "</main>", 1), encoding="utf-8")
    result = _check(tmp_path, report, width)
    assert n_fig == 1 and result["errors"] == [] and result["figures"] == result["drawn"] == 1
    _assert_reads_well(result, width)
