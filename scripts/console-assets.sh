#!/usr/bin/env bash
# Fetch the console's chart library (Chart.js, pinned below) from the npm registry with
# `npm pack` and copy its browser build into projections/console/static/vendor/, where
# the wheel's package-data picks it up. Nothing fetched is committed (vendor/ is ignored).
# The tarball is cached in ~/.cache/gpuledger/npm, so a warm machine stays offline.
# Without npm the console still works: its tables render and the plots are left out.
set -euo pipefail

CHARTJS_VERSION=4.6.1
here="$(cd "$(dirname "$0")/.." && pwd)"
vendor="$here/projections/console/static/vendor"
cache="${HOME}/.cache/gpuledger/npm"
target="$vendor/chart.umd.js"
stamp="$vendor/.chart.js-$CHARTJS_VERSION"

if [[ -f "$target" && -f "$stamp" ]]; then
  exit 0
fi
tarball="$cache/chart.js-$CHARTJS_VERSION.tgz"
if [[ ! -f "$tarball" ]]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "console-assets: no npm; the console's plots are left out (tables still render)" >&2
    exit 0
  fi
  mkdir -p "$cache"
  if ! (cd "$cache" && npm pack --silent "chart.js@$CHARTJS_VERSION" >/dev/null); then
    echo "console-assets: npm pack chart.js@$CHARTJS_VERSION failed; the plots are left out" >&2
    exit 0
  fi
fi
mkdir -p "$vendor"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tarball" -C "$tmp" package/dist/chart.umd.js package/LICENSE.md
{
  echo "/* Chart.js $CHARTJS_VERSION (MIT licence, https://www.chartjs.org), from the npm registry"
  echo "   by scripts/console-assets.sh; its licence follows the library. */"
  cat "$tmp/package/dist/chart.umd.js"
  echo
  echo "/*"
  cat "$tmp/package/LICENSE.md"
  echo "*/"
} >"$target"
touch "$stamp"
echo "console-assets: Chart.js $CHARTJS_VERSION -> $target"
