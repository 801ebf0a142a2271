#!/usr/bin/env bash
# `make demo` as a newcomer runs it: in a fresh clone of the committed tree, with a new
# virtualenv (packages from the pip cache). It must install the runtime dependencies only
# (no pytest, mypy, playwright, atheris, mutmut, ruff), print no packaging warning, and end
# with "Next:" commands that run as printed.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q . "$work/clone"
cd "$work/clone"
# Not as a sub-make of `make test`: its MAKEFLAGS and directory lines are not a newcomer's.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory demo PYTHON="${PYTHON:-python3.11}" \
  >"$work/demo.log" 2>&1 || { cat "$work/demo.log"; exit 1; }
if grep -nEi "would be ignored|SetuptoolsDeprecationWarning|is absent from the .packages." "$work/demo.log"; then
  echo "demo-check: make demo printed packaging warnings (above)" >&2; exit 1
fi
dev=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null \
  | grep -iE "^(pytest|mypy|playwright|atheris|mutmut|ruff|hypothesis|import-linter|py-spy)==" || true)
if [[ -n "$dev" ]]; then
  echo "demo-check: make demo installed development tools:" >&2; echo "$dev" >&2; exit 1
fi
next=$(sed -n '/^Next:/,$p' "$work/demo.log" | tail -n +2 | grep '^  ' | grep -v " serve " | sed 's/^ *//')
[[ -n "$next" ]] || { echo "demo-check: no Next: commands" >&2; cat "$work/demo.log"; exit 1; }
while IFS= read -r command; do
  bash -c "$command" >"$work/next.log" 2>&1 || { echo "demo-check: '$command' failed:" >&2; cat "$work/next.log" >&2; exit 1; }
done <<< "$next"
echo "demo-check: make demo from a fresh clone installs runtime deps only, prints no packaging warning, and its Next: commands run"
