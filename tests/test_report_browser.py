"""The HTML report in a real browser: headless Chromium opens it offline, no JavaScript error is raised, and
every figure is drawn (a plotly div with its SVG). A screenshot is kept under pytest's tmp dir.

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

# Injected at the end: once loaded, count the figures and the drawn ones, and write the result into the DOM.
CHECK = """<script>window.addEventListener('load',function(){setTimeout(function(){
var divs=document.querySelectorAll('.plotly-graph-div');var drawn=0;
divs.forEach(function(d){if(d.classList.contains('js-plotly-plot')&&d.querySelector('.main-svg')&&
d.querySelectorAll('.main-svg .trace, .main-svg .bars, .main-svg .scatterlayer path').length>0)drawn++;});
var pre=document.createElement('pre');pre.id='iosim-check';
pre.textContent=JSON.stringify({figures:divs.length,drawn:drawn,plotly:typeof Plotly,errors:window.__iosimErrors});
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


def _check(tmp_path: Path, report: Path) -> dict:
    page = report.read_text(encoding="utf-8")
    assert '<script src="http' not in page  # nothing fetched: plotly is embedded
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("<head>", "<head>" + CATCH, 1).replace("</body>", CHECK + "</body>", 1),
                     encoding="utf-8")
    proc = _chromium(tmp_path, "--virtual-time-budget=20000", "--window-size=1280,1000", "--dump-dom",
                     probe.as_uri())
    m = re.search(r'<pre id="iosim-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the check did not run; chromium said: {proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


def _screenshot(tmp_path: Path, report: Path, name: str) -> Path:
    shot = tmp_path / name
    _chromium(tmp_path, "--virtual-time-budget=20000", "--window-size=1280,3200", f"--screenshot={shot}",
              report.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000, "chromium wrote no screenshot"
    print(f"\nscreenshot: {shot}")
    keep = os.environ.get("IOSIM_SCREENSHOT_DIR")  # pytest keeps only its last 3 tmp dirs; CI can keep a copy
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        print(f"screenshot kept: {shutil.copy(shot, Path(keep) / name)}")
    return shot


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_small_report_renders_every_figure_without_javascript_errors(tmp_path):
    scn = tmp_path / "browser-check.yaml"
    scn.write_text(SMALL)
    report = _report(tmp_path, [str(scn)])
    result = _check(tmp_path, report)
    assert result["plotly"] == "object"
    assert result["errors"] == []
    assert result["figures"] == 6
    assert result["drawn"] == result["figures"]
    _screenshot(tmp_path, report, "report-small.png")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_default_report_renders_every_figure_without_javascript_errors(tmp_path):
    report = _report(tmp_path, [])
    n = report.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert n >= 5
    result = _check(tmp_path, report)
    assert result["errors"] == []
    assert result["figures"] == n
    assert result["drawn"] == n
    _screenshot(tmp_path, report, "report-default.png")
