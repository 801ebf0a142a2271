"""``gpuledger example``: a scenario from the seed article, fifo vs gpuledger
(``replay.examples``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.cli.common import load_inputs, run_compare
from scheduler.cli.errors import CliError, refuse_kafka_url

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger example`` to the ``gpuledger`` parser."""
    p = sub.add_parser("example", help="a scenario from the seed article: fifo vs gpuledger")
    p.add_argument("name", nargs="?", help="which example (omit to list them)")
    p.add_argument("--out", default="out/examples", help="where ledgers and reports go")
    p.set_defaults(func=_example)


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
    cluster, queues, workload = load_inputs(
        str(example.path("cluster")), str(example.path("queues")), str(example.path("workload"))
    )
    print(f"{example.name}: {example.story}\n")
    runs = run_compare(
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
