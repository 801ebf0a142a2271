"""``gpuledger simulate | replay | demo | schema``: thin shells over the library."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from events.ledgertime import format_duration
from events.model import PolicyConfigured
from replay.config import (
    ClusterFile,
    ConfigError,
    PolicyFile,
    QueuesFile,
    WorkloadFile,
    json_schema,
    kinds,
    load,
    policy_event,
    queue_events,
)
from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
    refuse_kafka_url,
)
from scheduler.core.policy import POLICIES


def register(sub: Any) -> None:
    """Add this package's sub-commands to the ``gpuledger`` parser."""
    p = sub.add_parser("simulate", help="simulate a workload on a cluster, writing a ledger")
    p.add_argument("--cluster", required=True, help="cluster.yaml")
    p.add_argument("--queues", required=True, help="queues.yaml")
    p.add_argument("--workload", required=True, help="workload.yaml")
    p.add_argument("--policy", default="gpuledger", choices=POLICIES, help="default: gpuledger")
    p.add_argument("--policy-file", help="policy.yaml: the policy's knobs (docs/formats.md)")
    p.add_argument("--ledger", required=True, help="directory for the new ledger")
    p.add_argument("--seed", type=int, help="override the workload's seed")
    p.add_argument("--db", help="also project the ledger into this DuckDB file and report")
    p.add_argument("--force", action="store_true", help="replace an existing ledger directory")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out an input the scheduler refuses, with a warning and a count, "
        "instead of stopping",
    )
    p.add_argument(
        "--no-fairness", action="store_true", help="skip the fair-share convergence table"
    )
    p.set_defaults(func=_simulate)

    p = sub.add_parser(
        "replay",
        help="re-run a ledger: verify its decisions, or what-if under another policy",
    )
    p.add_argument(
        "--ledger", required=True, help="ledger directory, JSON Lines export or kafka://…"
    )
    p.add_argument("--verify", action="store_true", help="check every decision is reproduced")
    p.add_argument(
        "--from",
        dest="start",
        default="0",
        help="an offset (1200), a time (90m, 6h, 2d; from the first record on a live ledger) "
        "or, on a live ledger, an ISO-8601 time (2026-12-03T06:00:00Z)",
    )
    p.add_argument("--until", dest="end", help="an offset or a time; stop before it")
    p.add_argument("--policy", help="what-if: policy.yaml with other knobs")
    p.add_argument("--policy-name", choices=POLICIES, help="what-if: another policy")
    p.add_argument("--queues", help="what-if: queues.yaml replacing the queue configuration")
    p.add_argument("--out", help="what-if: directory for the new ledger and the report")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="what-if: leave out a recorded input the new configuration refuses (a job "
        "whose queue is gone), with a warning and a count, instead of stopping",
    )
    add_damage_options(p)
    p.set_defaults(func=_replay)

    p = sub.add_parser("state", help="the cluster as it was at a moment of a ledger")
    p.add_argument(
        "--ledger", required=True, help="ledger directory, JSON Lines export or kafka://…"
    )
    p.add_argument(
        "--at",
        required=True,
        help="an offset (1200), a time (90m, 6h, 2d; from the first record on a live ledger) "
        "or, on a live ledger, an ISO-8601 time (2026-12-03T06:00:00Z)",
    )
    add_damage_options(p)
    p.set_defaults(func=_state)

    p = sub.add_parser("demo", help="the built-in mixed workload under gpuledger and fifo")
    p.add_argument("--out", default="out/demo", help="where ledgers and DuckDB files go")
    p.set_defaults(func=_demo)

    p = sub.add_parser("compare", help="one workload under several policies, side by side")
    p.add_argument("--cluster", required=True, help="cluster.yaml")
    p.add_argument("--queues", required=True, help="queues.yaml")
    p.add_argument("--workload", required=True, help="workload.yaml")
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated (default: {','.join(POLICIES)})",
    )
    p.add_argument("--policy-file", help="policy.yaml knobs for the gang policy")
    p.add_argument("--out", default="out/compare", help="ledgers, compare.json, compare.html")
    p.add_argument("--workers", type=int, default=2, help="parallel simulations (default 2)")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out an input the scheduler refuses, with a warning and a count, "
        "instead of stopping",
    )
    p.set_defaults(func=_compare)

    p = sub.add_parser("example", help="a scenario from the seed article: fifo vs gpuledger")
    p.add_argument("name", nargs="?", help="which example (omit to list them)")
    p.add_argument("--out", default="out/examples", help="where ledgers and reports go")
    p.set_defaults(func=_example)

    p = sub.add_parser("schema", help="print the JSON Schema of a YAML input format")
    p.add_argument("kind", choices=sorted(kinds()), help="which file format")
    p.set_defaults(func=_schema)


def _load_inputs(
    cluster: str, queues: str, workload: str
) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    from replay.sim import check_inputs  # noqa: PLC0415  # heavy imports only when used

    try:
        inputs = (
            load(cluster, ClusterFile),
            load(queues, QueuesFile),
            load(workload, WorkloadFile),
        )
        # Before any ledger directory is made: a job the run would refuse is an error in
        # the files, not a job silently left out of the run.
        check_inputs(inputs[1], inputs[2])
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    return inputs


def _fresh_dir(path: Path, force: bool, *, create: bool = True) -> None:
    """Make way for a command's output at ``path``: refuse a non-empty directory, or remove
    it with ``force``; then create it (unless ``create``: a new ledger is created whole by
    ``events.filelog.new_ledger``)."""
    if path.exists() and any(path.iterdir()):
        if not force:
            raise CliError(f"{path} exists and is not empty (use --force to replace it)")
        shutil.rmtree(path)
    if create:
        path.mkdir(parents=True, exist_ok=True)


def _refusals(refused: list[Any], files: dict[str, str]) -> None:
    """Under ``--skip-invalid``: each refused input as a warning naming its file, then a
    count; a run never leaves an input out in silence."""
    for refusal in refused:
        where = files.get(refusal.kind, files.get("event", "input"))
        sys.stderr.write(f"gpuledger: warning: {where}: {refusal} (skipped: --skip-invalid)\n")
    if refused:
        print(f"refused inputs: {len(refused)} (left out of the run by --skip-invalid)")


def _refused_error(exc: ConfigError, files: dict[str, str]) -> CliError:
    """A ``ConfigError`` as a CLI error; an input the scheduler refused names its file and
    says how to go on without it."""
    from replay.sim import InputRefusedError  # noqa: PLC0415

    if isinstance(exc, InputRefusedError):
        where = files.get(exc.kind, files.get("event", "input"))
        return CliError(f"{where}: {exc} (--skip-invalid leaves it out and goes on)")
    return CliError(str(exc))


class _Progress:
    """The simulation's progress line on stderr, redrawn in place; ``end`` finishes it (a
    newline), if one was drawn."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.drawn = False

    def __call__(self, now_ms: int, submitted: int, total: int) -> None:
        self.drawn = True
        print(
            f"\r  simulated {format_duration(now_ms / 1000):>8}  "
            f"jobs submitted {submitted:>7}/{total}"
            f"  ({format_duration(time.perf_counter() - self.start):>8})",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def end(self) -> None:
        if self.drawn:
            print(file=sys.stderr)
            self.drawn = False


def _simulate_into(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str | PolicyConfigured,
    ledger: Path,
    *,
    show_progress: bool = False,
    observe: Any = None,
    files: dict[str, str] | None = None,
    skip_invalid: bool = False,
) -> Any:
    """``replay.sim.simulate_into`` with a progress line on stderr; returns the SimResult.
    ``files``: the input file of each kind of input (``job``, ``queue``, ``node``), named
    in the error when the scheduler refuses one."""
    from replay.sim import simulate_into  # noqa: PLC0415  # heavy imports only when used

    progress = _Progress() if show_progress else None
    try:
        result = simulate_into(
            cluster,
            queues,
            workload,
            policy,
            ledger,
            progress=progress,
            observe=observe,
            skip_invalid=skip_invalid,
        )
    except ConfigError as exc:
        raise _refused_error(exc, files or {}) from exc
    finally:
        if progress is not None:
            progress.end()
    return result


def _simulate(args: argparse.Namespace) -> int:
    refuse_kafka_url(args.ledger, "--ledger", "simulate", "a directory for the new ledger")
    cluster, queues, workload = _load_inputs(args.cluster, args.queues, args.workload)
    if args.seed is not None:
        workload = msgspec.structs.replace(workload, seed=args.seed)
    try:
        knobs = load(args.policy_file, PolicyFile) if args.policy_file else PolicyFile()
        policy = policy_event(args.policy, knobs)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    ledger = Path(args.ledger)
    _fresh_dir(ledger, args.force, create=False)
    from replay.fairness import FairnessMonitor  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    monitor = None if args.no_fairness else FairnessMonitor()
    started = time.perf_counter()
    result = _simulate_into(
        cluster,
        queues,
        workload,
        policy,
        ledger,
        show_progress=True,
        observe=monitor.observe if monitor is not None else None,
        files={"job": args.workload, "queue": args.queues, "node": args.cluster},
        skip_invalid=args.skip_invalid,
    )
    elapsed = time.perf_counter() - started
    print(
        f"{result.policy}: {result.jobs} jobs, {result.cycles} cycles, {result.records} ledger "
        f"records, simulated {format_duration(result.end_ms / 1000)} in {format_duration(elapsed)}"
    )
    print("job outcomes: " + ", ".join(f"{k} {v}" for k, v in result.statuses.items()))
    print(result.gang_summary())
    _refusals(result.refused, {"job": args.workload, "queue": args.queues, "node": args.cluster})
    if monitor is not None and monitor.rows():
        print("\nfair share under contention (queue has work waiting that free GPUs cannot hold):")
        print(render_table(monitor.rows(), list(monitor.rows()[0])))
    print(f"ledger: {ledger}")
    if args.db:
        from events.sources import open_reader  # noqa: PLC0415
        from projections.projector import project  # noqa: PLC0415
        from projections.report import REPORT_COLUMNS, tenant_report  # noqa: PLC0415
        from scheduler.render.table import render_table  # noqa: PLC0415

        project(open_reader(ledger), args.db, rebuild=True)
        rows = tenant_report(args.db)
        print(render_table(rows, REPORT_COLUMNS))
    return 0


def parse_bound(text: str, origin_ms: int = 0, wall: bool = False) -> tuple[str, int]:
    """``1200`` is an offset; ``90m``, ``6h``, ``3600s``, ``2d`` are ledger times after
    ``origin_ms``; on a wall-clock ledger (``wall``) an ISO-8601 time such as
    ``2026-12-03T06:00:00Z`` is one too (``events.ledgertime.parse_at``)."""
    from events.ledgertime import parse_at  # noqa: PLC0415

    text = text.strip()
    if text.isdigit():
        return ("offset", int(text))
    try:
        return ("time", parse_at(text, wall, origin_ms))
    except ValueError:
        iso = " or an ISO-8601 time such as 2026-12-03T06:00:00Z" if wall else ""
        raise CliError(
            f"{text!r}: expected an offset (1200), a time such as 90m, 6h, 2d{iso}"
        ) from None


def _clock(reader: Any) -> tuple[int, bool]:
    """Where relative times count from, and whether the ledger runs on wall time: a live
    ledger's ``6h`` is six hours after its first record, a simulated one's after 0."""
    from events.ledgertime import clock_of  # noqa: PLC0415

    with ledger_errors():
        return clock_of(reader)


def _offset_of(reader: Any, bound: tuple[str, int] | None, default: int | None) -> int | None:
    """The first offset at or after a bound (a time is looked up in the ledger)."""
    if bound is None:
        return default
    from events.ledgertime import offset_at  # noqa: PLC0415

    kind, value = bound
    return value if kind == "offset" else offset_at(reader, value)


def _time_of(reader: Any, bound: tuple[str, int] | None) -> int | None:
    """The ledger time of a bound (an offset is looked up in the ledger)."""
    if bound is None:
        return None
    kind, value = bound
    if kind == "time":
        return value
    for _, env in reader.read(value, value + 1):
        return int(env.at)
    return None


def _replay(args: argparse.Namespace) -> int:
    if args.policy or args.policy_name or args.queues or args.out:
        return _whatif(args)
    from scheduler.fold.verify import run  # noqa: PLC0415

    torn = check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    started = time.perf_counter()
    with ledger_errors():
        clock = _clock(reader)
        start = _offset_of(reader, parse_bound(args.start, *clock), 0) or 0
        end = _offset_of(reader, parse_bound(args.end, *clock) if args.end else None, None)
        result = run(reader, start=start, end=end)
    elapsed = time.perf_counter() - started
    rate = result.records / elapsed if elapsed > 0 else 0.0
    print(
        f"replayed {result.records} records ({result.inputs} inputs, {result.decisions} "
        f"decisions in {result.cycles} cycles) in {format_duration(elapsed)}, {rate:,.0f} records/s"
    )
    if result.skipped:
        print(
            f"skipped {len(result.skipped)} records of unknown types, first at offset "
            f"{result.skipped[0]}"
        )
    if result.revision_note:
        print(result.revision_note)
    if not args.verify:
        return 0
    if result.records == 0:
        print("verify: NOTHING TO VERIFY — the ledger holds no records")
        return 1
    if result.mismatch is None:
        scope = f" from offset {start}" if start else ""
        if torn is not None and end is None:
            scope += " up to its torn tail (--accept-torn-tail)"
        print(f"verify: 0 mismatches{scope} — every decision reproduced byte for byte")
        return 0
    m = result.mismatch
    where = f"offset {m.offset}" if m.offset >= 0 else "the end of the ledger"
    print(f"verify: MISMATCH at {where}")
    print(m.diff())
    return 1


def _whatif(args: argparse.Namespace) -> int:
    from replay.whatif import report_of, what_if, whatif_table  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    if not args.out:
        raise CliError("a what-if needs --out DIR for its ledger and report")
    refuse_kafka_url(args.out, "--out", "replay", "a directory for the what-if's ledger and report")
    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    clock = _clock(reader)
    start_ms = _time_of(reader, parse_bound(args.start, *clock)) if args.start != "0" else None
    end_ms = _time_of(reader, parse_bound(args.end, *clock)) if args.end else None
    try:
        knobs = load(args.policy, PolicyFile) if args.policy else None
        queues = queue_events(load(args.queues, QueuesFile)) if args.queues else None
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    out = Path(args.out)
    _fresh_dir(out, force=False)
    files = {"event": f"ledger {args.ledger}", "job": f"ledger {args.ledger}"}
    if args.queues:
        files["queue"] = args.queues
    try:
        result = what_if(
            reader,
            out / "ledger",
            start_ms=start_ms,
            end_ms=end_ms,
            knobs=knobs,
            policy_name=args.policy_name,
            queues=queues,
            skip_invalid=args.skip_invalid,
        )
    except ConfigError as exc:
        raise _refused_error(exc, files) from exc
    history, fates = result.history, result.fates
    report = report_of(result, args.queues or None)
    changes = report["changes"]
    assert isinstance(changes, list)
    print(
        f"what-if over {len(history.jobs)} jobs ({', '.join(changes) or 'same policy'}); "
        f"world timing: bind {history.bind_ms} ms, startup {history.startup_ms} ms"
        + (f"; {history.unfinished} jobs had not ended" if history.unfinished else "")
    )
    table = whatif_table(result.rows)
    print(table)
    _refusals(result.refused, files)
    if fates:
        print("\njobs whose fate changed most:")
        print(render_table(fates, list(fates[0])))
    (out / "whatif.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "whatif.txt").write_text(table + "\n")
    print(f"\nnew ledger: {out / 'ledger'}; report: {out / 'whatif.json'}")
    return 0


def _state(args: argparse.Namespace) -> int:
    from scheduler.fold.state_at import state_at  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    clock = _clock(reader)
    bound = parse_bound(args.at, *clock)
    _refuse_past_the_end(reader, args.at, bound, clock[1])
    snapshot = state_at(reader, bound)
    if clock[1]:
        from events.ledgertime import format_at  # noqa: PLC0415

        print(f"{format_at(snapshot.state.now, wall=True)}")
    print(snapshot.headline)
    print(f"ended: {snapshot.ended}")
    for title, rows in (
        ("queues", snapshot.queues),
        ("running", snapshot.running),
        ("pending", snapshot.pending),
    ):
        print(f"\n{title}:")
        print(render_table(rows, list(rows[0])) if rows else "  (none)")
    return 0


def _refuse_past_the_end(reader: Any, text: str, bound: tuple[str, int], wall: bool) -> None:
    """A moment after the ledger's last record (or an offset past its end) is an error
    naming where the ledger ends, not the end's state passed off as that moment's."""
    from events.ledgertime import format_at  # noqa: PLC0415

    kind, value = bound
    with ledger_errors():
        end = reader.end_offset()
        last = None
        for _, env in reader.read(max(0, end - 1), end):
            last = int(env.at)
    if last is None:
        if end == 0:
            raise CliError(f"--at {text}: the ledger holds no records")
        return  # a Kafka topic's last offset may be a transaction marker: nothing to compare
    if (kind == "offset" and value > end) or (kind == "time" and value > last):
        raise CliError(
            f"--at {text}: past the ledger's end (its last record, offset {end - 1}, is at "
            f"{format_at(last, wall)}); give a moment or offset up to then"
        )


def _demo(args: argparse.Namespace) -> int:
    from events.sources import open_reader  # noqa: PLC0415
    from projections.projector import project  # noqa: PLC0415
    from projections.report import compare_reports  # noqa: PLC0415

    refuse_kafka_url(args.out, "--out", "demo", "a directory for the ledgers and databases")
    from replay.examples import EXAMPLES  # noqa: PLC0415

    demo = EXAMPLES["demo"]
    cluster, queues, workload = _load_inputs(
        str(demo.path("cluster")), str(demo.path("queues")), str(demo.path("workload"))
    )
    out = Path(args.out)
    gpus = sum(g.count * g.gpus for g in cluster.nodes)
    print(
        f"gpuledger demo: {gpus} GPUs on {sum(g.count for g in cluster.nodes)} nodes, queues "
        + ", ".join(
            f"{q.name} {q.deserved_percent:g}%" if q.deserved_percent is not None else q.name
            for q in queues.queues
        )
        + f"; a {workload.horizon_s / 3600:g} h mixed workload (seed {workload.seed})"
    )
    dbs: dict[str, str] = {}
    for policy in ("gpuledger", "fifo"):
        ledger = out / policy / "ledger"
        db = out / policy / "history.duckdb"
        _fresh_dir(out / policy, force=True)
        started = time.perf_counter()
        result = _simulate_into(cluster, queues, workload, policy, ledger)
        project(open_reader(ledger), str(db), rebuild=True)
        print(
            f"  {policy:<9} {result.jobs} jobs, {result.records} ledger records, "
            f"simulated {format_duration(result.end_ms / 1000)} in "
            f"{format_duration(time.perf_counter() - started)}"
            f" -> {ledger}"
        )
        dbs[policy] = str(db)
    print()
    print(compare_reports(dbs))
    print()
    print("Next:")
    exe = _runnable_name()
    print(f"  {exe} replay --ledger {out / 'gpuledger' / 'ledger'} --verify")
    print(f"  {exe} report --db {dbs['gpuledger']}")
    query = "SELECT * FROM tenant_percentiles"
    print(f'  {exe} sql --db {dbs["gpuledger"]} "{query}"')
    print(f"  {exe} serve --ledger {out / 'gpuledger' / 'ledger'}   # the live web console")
    return 0


def _runnable_name() -> str:
    """How to type this command so that it runs from here: ``gpuledger`` when that is the
    one on PATH, else the path it was started by (``.venv/bin/gpuledger`` after
    ``make demo``, whose virtualenv is not activated)."""
    started = Path(sys.argv[0])
    on_path = shutil.which("gpuledger")
    if started.name != "gpuledger" or (
        on_path is not None and Path(on_path).resolve() == started.resolve()
    ):
        return "gpuledger"
    try:
        return str(started.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(started.resolve())


def _run_compare(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policies: list[str],
    out: Path,
    knobs: PolicyFile | None,
    workers: int,
    title: str,
    files: dict[str, str] | None = None,
    skip_invalid: bool = False,
) -> list[Any]:
    from replay.compare import compare, table, write  # noqa: PLC0415

    for policy in policies:
        if policy not in POLICIES:
            raise CliError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        _fresh_dir(out / policy, force=True)
    try:
        runs = compare(
            cluster,
            queues,
            workload,
            policies,
            out,
            knobs=knobs,
            workers=workers,
            skip_invalid=skip_invalid,
        )
    except ConfigError as exc:
        raise _refused_error(exc, files or {}) from exc
    print(table(runs))
    refused = {str(r): r for run in runs for r in run.refused}  # once, whichever policy
    _refusals(list(refused.values()), files or {})
    json_path, html_path = write(runs, out, title)
    print(f"\nwrote {json_path} and {html_path}")
    return runs


def _compare(args: argparse.Namespace) -> int:
    refuse_kafka_url(args.out, "--out", "compare", "a directory for the ledgers and reports")
    cluster, queues, workload = _load_inputs(args.cluster, args.queues, args.workload)
    try:
        knobs = load(args.policy_file, PolicyFile) if args.policy_file else None
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    title = f"gpuledger compare: {Path(args.workload).name} on {Path(args.cluster).name}"
    _run_compare(
        cluster,
        queues,
        workload,
        policies,
        Path(args.out),
        knobs,
        args.workers,
        title,
        files={"job": args.workload, "queue": args.queues, "node": args.cluster},
        skip_invalid=args.skip_invalid,
    )
    return 0


def _example(args: argparse.Namespace) -> int:
    from replay.examples import EXAMPLES  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    if not args.name:
        for example in EXAMPLES.values():
            print(f"{example.name:<10} {example.story}")
        return 0
    if args.name not in EXAMPLES:
        raise CliError(f"no example {args.name!r}; choose from {', '.join(EXAMPLES)}")
    refuse_kafka_url(args.out, "--out", "example", "a directory for the ledgers and reports")
    example = EXAMPLES[args.name]
    cluster, queues, workload = _load_inputs(
        str(example.path("cluster")), str(example.path("queues")), str(example.path("workload"))
    )
    print(f"{example.name}: {example.story}\n")
    runs = _run_compare(
        cluster,
        queues,
        workload,
        ["fifo", "gpuledger"],
        Path(args.out) / example.name,
        None,
        2,
        f"gpuledger example: {example.story}",
    )
    if example.watch:
        rows = []
        for job in example.watch:
            for run in runs:
                fate = run.jobs.get(job, {})
                rows.append(
                    {
                        "job": job,
                        "policy": run.policy,
                        "time_to_ready_s": fate.get("ttr_s"),
                        "completion_s": fate.get("done_s"),
                        "preemptions": fate.get("preemptions"),
                        "idle_gpu_h": fate.get("idle_gpu_h"),
                        "note": fate.get("unschedulable")
                        or ("" if fate.get("ttr_s") is not None else "still pending at the end"),
                    }
                )
        print("\nthe job to watch:")
        print(render_table(rows, list(rows[0])))
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(kinds()[args.kind]), indent=2))
    return 0
