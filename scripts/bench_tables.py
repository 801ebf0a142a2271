"""Write the benchmark tables of docs/operations.md from the benchmarks' own JSON.

    python scripts/bench_tables.py [--check]

Each table sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in
docs/operations.md and is rendered from ``docs/bench/NAME.json``, which ``make bench``
copies there from the run it just made (``bench.core``'s ``--json``). The commit, machine,
date and load the JSON records are printed under the table, so the doc's figures are
always those of a named measurement and none is typed by hand. ``--check`` exits 1 when
the doc differs from what the JSON renders (``tests/test_bench_tables.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages first

from bench.forecast import TARGETS, meets_target, relative_error  # noqa: E402

DOC = ROOT / "docs" / "operations.md"
DATA = ROOT / "docs" / "bench"


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit in ("x",):
        return f"{value:.1f} ×"
    if unit == "placements/s":
        return f"{value:,.0f}/s"
    if unit == "ms" and value >= 1000:
        return f"{value / 1000:,.2f} s"
    decimals = 1 if value < 100 else 0
    return f"{value:,.{decimals}f} {unit}"


def _core(p: dict[str, Any]) -> str:
    """How the run ran the policy core (``bench.measure.provenance``); "" for runs
    measured before it was recorded."""
    return {"native": "compiled core", "pure": "core as Python"}.get(p.get("core", ""), "")


def core_table(data: dict[str, Any]) -> str:
    """``bench.core``'s figures as a Markdown table, then where they were measured."""
    lines = ["| figure | gpuledger | fifo | target | meets |", "|---|---|---|---|---|"]
    for row in data["figures"]:
        unit = row["unit"]
        bound = ">=" if unit == "placements/s" else "<="
        target = f"{bound} {_value(row['target'], unit)}"
        meets = "yes" if row["meets"] else "**no**"
        lines.append(
            f"| {row['figure']} | {_value(row['gpuledger'], unit)} | "
            f"{_value(row['fifo'], unit)} | {target} | {meets} |"
        )
    p = data.get("provenance") or {}
    core = _core(p)
    lines += [
        "",
        f"Measured by `python -m bench.core` on commit `{p.get('commit', '?')}`, "
        f"{p.get('date', '?')}, on {p.get('machine', '?')} (Python {p.get('python', '?')}"
        f"{', ' + core if core else ''}, load average {p.get('load', '?')} at the end).",
    ]
    return "\n".join(lines)


def _ordinal(n: int) -> str:
    """The English suffix of ``n`` as an ordinal: 2nd, 3rd, 10th, 11th, 21st."""
    if n % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def forecast_table(data: dict[str, Any]) -> str:
    """``bench.forecast``'s accuracy per run, estimates and arrivals, then its cost."""
    lines = [
        "| run | estimates | arrivals | forecasts | waited ≥ 10 min | rightly beyond horizon | "
        "median abs. error | median relative error (95 % interval; target) | within ±25 % | "
        "bias | start in range |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, kinds in data.items():
        if run in ("cost", "provenance", "sampling") or not isinstance(kinds, dict):
            continue
        for kind, f in kinds.items():
            if not isinstance(f, dict):
                continue
            estimates, arrivals = kind.split(" / ")
            meets = meets_target(estimates, f)
            relative = relative_error(f)
            if meets is None:
                relative += " (diagnostic)"
            else:
                verdict = "yes" if meets else "**no**"
                relative += f" (≤ {100 * TARGETS[estimates]:.0f} %: {verdict})"
            lines.append(
                f"| {run} | {estimates} | {arrivals} | {f['forecasts']} | {f['waited_10min']} | "
                f"{f.get('beyond_horizon', '-')} | "
                f"{f['median_abs_error_min']:,.1f} min | {relative} | "
                f"{100 * f['within_25pct']:.0f} % | "
                f"{f['bias_min']:+,.1f} min | {100 * f['range_holds']:.0f} % |"
            )
    notes = []
    sampling = data.get("sampling")
    if sampling:
        thinned = (
            f", thinned evenly to at most {sampling['limit']} per run" if sampling["limit"] else ""
        )
        every = sampling["every"]
        nth = "" if every == 1 else f"{every}{_ordinal(every)} "
        notes.append(f"The jobs forecast were every {nth}submission{thinned}.")
    if "samples" in data:
        notes.append(f"Each forecast with learned runtimes took {data['samples']} runs.")
    if notes:
        lines += ["", " ".join(notes)]
    cost = data.get("cost")
    if cost:
        lines += [
            "",
            f"Forecasting every pending job of `bench.core`'s cycle-1000 state "
            f"({cost['pending']:,} jobs, {cost['started_within_horizon']:,} placed within 7 days) "
            f"took {cost['seconds']:,.1f} s ({cost['cpu_seconds']:,.1f} CPU-s; target ≤ 10 s).",
        ]
    p = data.get("provenance") or {}
    core = _core(p)
    lines += [
        "",
        f"Measured by `python -m bench.forecast` on commit `{p.get('commit', '?')}`, "
        f"{p.get('date', '?')}, on {p.get('machine', '?')} "
        f"({core + ', ' if core else ''}load average {p.get('load', '?')} at the end).",
    ]
    return "\n".join(lines)


TABLES = {"core": core_table, "forecast": forecast_table}


def render(doc: str) -> str:
    """The doc with every bench table rendered from its JSON."""
    for name, table in TABLES.items():
        data = json.loads((DATA / f"{name}.json").read_text())
        pattern = re.compile(
            rf"(<!-- bench:{name} -->\n)(?:.*?\n)?(<!-- /bench:{name} -->)", flags=re.DOTALL
        )
        if not pattern.search(doc):
            raise SystemExit(f"{DOC}: no <!-- bench:{name} --> … <!-- /bench:{name} --> block")
        rendered = table(data)
        doc = pattern.sub(lambda m, text=rendered: m.group(1) + text + "\n" + m.group(2), doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is stale")
    args = parser.parse_args(argv)
    doc = DOC.read_text()
    fresh = render(doc)
    if args.check:
        if fresh != doc:
            sys.stderr.write(
                f"{DOC} differs from what docs/bench/*.json renders: "
                "run python scripts/bench_tables.py\n"
            )
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
