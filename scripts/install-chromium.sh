#!/usr/bin/env bash
# Provision headless Chromium for the HTML report test (tests/test_html_report.py).
# Idempotent: does nothing when /usr/bin/chromium exists. Runs apt-get update only when
# the package index does not know chromium yet, so a warm machine stays offline.
set -euo pipefail

if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no apt-get; install chromium by hand (the HTML test is skipped without it)" >&2
  exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-chromium: not root and no sudo; the HTML screenshot test will be skipped" >&2
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show chromium >/dev/null 2>&1; then
  $SUDO apt-get update -q
fi
$SUDO apt-get install -y -q --no-install-recommends chromium
