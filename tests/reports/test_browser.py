"""The report in a real headless Chromium, offline: no console errors, every plot rendered, a screenshot; the
verdict on the first screen and no empty section."""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1400,4000", "--virtual-time-budget=5000"]
EXPECTED_PLOTS = 13  # with the teaching question's model figure and the strategy map


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                   "(apt-get install -y chromium; .ci/run installs it)")
def test_report_renders_in_headless_chromium(built_report, evil_sweep, tmp_path):
    screenshot = built_report.parent / "report.png"
    done = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           f"--screenshot={screenshot}", "--dump-dom", built_report.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, "console messages:\n" + "\n".join(console)

    dom = done.stdout
    plots = re.split(r'<div id="[^"]*" class="plotly-graph-div', dom)[1:]
    assert len(plots) == EXPECTED_PLOTS
    blank = [i for i, plot in enumerate(plots) if 'class="main-svg"' not in plot.split("plotly-graph-div")[0]]
    assert not blank, f"plots {blank} did not render (no svg.main-svg)"
    # The sweep's name is text on the page, not a script.
    assert evil_sweep.replace("<", "&lt;").replace(">", "&gt;") in dom

    assert screenshot.exists() and screenshot.stat().st_size > 50_000
    shutil.copy(screenshot, tmp_path / "report.png")  # kept with the test's own files


# Measures the laid-out page in the browser and writes what it found into the DOM, which --dump-dom returns.
MEASURE = """<script>window.addEventListener("load", function () {
  var answer = document.querySelector(".answer"), out = document.createElement("pre");
  var empty = Array.prototype.filter.call(document.querySelectorAll("section"), function (s) {
    return s.innerText.replace(s.querySelector("h2").innerText, "").trim() === "";
  }).map(function (s) { return s.id; });
  out.id = "measured";
  out.textContent = JSON.stringify({answer_bottom: answer.getBoundingClientRect().bottom + window.scrollY,
                                    answer: answer.innerText, empty: empty});
  document.body.appendChild(out);
});</script>"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                   "(apt-get install -y chromium; .ci/run installs it)")
def test_the_first_screen_states_the_verdict_and_no_section_is_empty(built_report, tmp_path):
    """In a 1400 x 900 window the verdict with its uncertainty is on the first screen; no heading stands alone."""
    measured_page = tmp_path / "measured.html"
    measured_page.write_text(built_report.read_text().replace("</body>", MEASURE + "</body>"))
    flags = [f for f in FLAGS if not f.startswith("--window-size")] + ["--window-size=1400,900"]
    done = subprocess.run([str(CHROMIUM), *flags, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           measured_page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(html.unescape(re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S).group(1)))
    assert found["answer_bottom"] <= 900, found
    assert "tie, not distinguishable" in found["answer"] and "(one run)" in found["answer"]
    assert found["empty"] == []
