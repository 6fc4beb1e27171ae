#!/usr/bin/env bash
# Docs build (warnings are errors) and the browser test of the HTML report.
# Called from .ci/run (CI=true, 2 cores, no GPU). Installs only what is missing:
#   - Debian's chromium, when /usr/bin/chromium is absent (needs root or sudo);
#   - mkdocs-material into the active Python environment.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  echo "== installing chromium (Debian package)"
  SUDO=""
  if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

if ! python3 -c "import material" 2>/dev/null; then
  echo "== installing mkdocs-material"
  python3 -m pip install -q "mkdocs-material>=9.5"
fi

export NO_MKDOCS_2_WARNING=1  # the Material end-of-life banner is not a build warning; keep the log short
echo "== mkdocs build --strict"
python3 -m mkdocs build --strict --site-dir "${IOSIM_SITE_DIR:-/tmp/iosim-site}"

echo "== pytest -m browser"
# the screenshots are copied here (pytest's own tmp dirs are rotated away after three runs)
export IOSIM_SCREENSHOT_DIR="${IOSIM_SCREENSHOT_DIR:-/tmp/iosim-screenshots}"
python3 -m pytest -m browser tests/test_report_browser.py -q -rs -s
