#!/usr/bin/env bash
# Build the wheel and install it into a fresh venv, then run the installed CLI once:
# a package or data file missing from pyproject.toml fails here, not on a user's machine.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m build --wheel --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
python3.11 -m venv "$work/venv"
# Dependencies come from the project venv's pip cache; --no-deps keeps the check offline-fast
# while the import smoke test below still loads every package.
"$work/venv/bin/pip" install -q --no-deps "$work"/dist/*.whl
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$(ls -d "$work"/venv/lib/python3.11/site-packages)/_deps.pth"
cd "$work"
"$work/venv/bin/gpuledger" --help >/dev/null
"$work/venv/bin/python" - <<'PY'
import importlib, pathlib, sys
import replay
# one module of every package of the wheel (pyproject.toml lists them)
for name in ("events", "events.filelog", "scheduler.core", "scheduler.fold.step",
             "scheduler.fold.verify", "scheduler.render.table", "scheduler.runtime.engine",
             "scheduler.kube.mapping", "scheduler.cli.replay", "projections",
             "projections.projector", "projections.console.whatif", "replay.sim"):
    mod = importlib.import_module(name)
    assert (mod.__file__ or "").startswith(sys.prefix), f"{name} imported from {mod.__file__}"
examples = pathlib.Path(replay.__file__).parent / "examples"
assert (examples / "demo-workload.yaml").is_file(), "demo YAML files missing from the wheel"
import projections.console.app  # the console's libraries are installed dependencies
console = pathlib.Path(projections.console.app.__file__).parent
for name in ("templates/base.html", "templates/queues.html", "static/console.js",
             "static/console.css"):
    assert (console / name).is_file(), f"console file {name} missing from the wheel"
PY
"$work/venv/bin/gpuledger" demo --out "$work/demo" >"$work/demo.log" || { cat "$work/demo.log"; exit 1; }
echo "wheel-check: the installed wheel runs 'gpuledger demo' from a clean venv"
