"""``gpuledger submit``: jobs (``job_submitted`` events in YAML) to a domain's intake topic."""

from __future__ import annotations

import argparse
import sys

from scheduler.cli.common import add_kafka_arguments, settings_of
from scheduler.cli.errors import CliError, kafka_errors

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger submit`` to the ``gpuledger`` parser."""
    submit = sub.add_parser("submit", help="submit jobs (job_submitted events in YAML) to intake")
    add_kafka_arguments(submit)
    submit.add_argument("-f", "--file", required=True, help="job.yaml: one job or {jobs: [...]}")
    submit.set_defaults(func=kafka_errors(_submit))


def _submit(args: argparse.Namespace) -> int:
    from replay.config import ConfigError, parse_jobs  # noqa: PLC0415

    # intake loads the Kafka service's modules: imported when the command runs
    from scheduler.runtime.intake import send_events  # noqa: PLC0415

    try:
        with open(args.file, "rb") as f:
            jobs = parse_jobs(f.read(), args.file)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    offsets = send_events(settings_of(args), args.domain, jobs)
    for job, off in zip(jobs, offsets, strict=True):
        sys.stdout.write(f"submitted {job.job} to intake offset {off}\n")
    return 0
