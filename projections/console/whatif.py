"""The console's What-if page: ``replay.whatif.what_if`` in a worker process.

A run re-simulates the served ledger's outside facts under another queue configuration
(a queues.yaml pasted into the page) and/or another policy, as
``gpuledger replay --ledger SRC --queues Q --policy-name P --out DIR`` does: the same
library call and the same report (``replay.whatif.report_of``, ``whatif_table``). It runs
in a process of its own (``multiprocessing``, spawned: the server's threads are not
forked), so a long replay never holds the server's event loop or its GIL, and a crash in
it cannot take the server down. Each run writes only to a temporary directory of its own
(the new ledger, ``whatif.json``, ``whatif.txt``, and ``error.txt`` when it failed); the
served ledger is only read. One run at a time: the machine's cores belong to the follower
and the readers first.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from events.filelog import LedgerError
from events.sources import open_reader
from replay.config import ConfigError, QueuesFile, load, queue_events
from replay.whatif import report_of, what_if, whatif_table

__all__ = ["MAX_QUEUES_YAML", "WhatIfBusyError", "WhatIfRun", "WhatIfRuns"]

MAX_QUEUES_YAML = 1_000_000
"""Bytes of pasted queues.yaml accepted."""

_SPAWN = multiprocessing.get_context("spawn")


class WhatIfBusyError(RuntimeError):
    """Another what-if is still running."""


@dataclass
class WhatIfRun:
    """One what-if: its inputs, its worker process and, when done, its report."""

    run_id: int
    policy_name: str
    queues_given: bool
    directory: Path
    proc: BaseProcess
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    returncode: int | None = None
    error: str = ""

    def poll(self) -> None:
        if self.returncode is not None or self.proc.exitcode is None:
            return
        self.returncode = self.proc.exitcode
        self.proc.close()
        self.finished = time.monotonic()
        failed = self.directory / "error.txt"
        if failed.exists():
            self.error = failed.read_text().strip()
        elif self.returncode != 0:
            self.error = f"the what-if's worker ended with exit code {self.returncode}"

    def view(self) -> dict[str, Any]:
        """Its state for the page and ``/api/whatif/ID``."""
        self.poll()
        state = (
            "running" if self.returncode is None else ("done" if self.returncode == 0 else "failed")
        )
        report: dict[str, Any] = {}
        if state == "done":
            report = json.loads((self.directory / "out" / "whatif.json").read_text())
        end = self.finished if self.finished is not None else time.monotonic()
        return {
            "id": self.run_id,
            "state": state,
            "seconds": round(end - self.started, 1),
            "policy_name": self.policy_name,
            "queues_given": self.queues_given,
            "error": self.error.removeprefix("gpuledger: "),
            "table": (self.directory / "out" / "whatif.txt").read_text() if report else "",
            "report": report,
        }


class WhatIfRuns:
    """The what-if runs of one server over the ledger at ``source``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.runs: dict[int, WhatIfRun] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._root = Path(tempfile.mkdtemp(prefix="gpuledger-whatif-"))

    def start(self, *, queues_yaml: str = "", policy_name: str = "") -> WhatIfRun:
        """Start a what-if with the pasted queues and/or policy name, in a worker process."""
        if len(queues_yaml.encode()) > MAX_QUEUES_YAML:
            raise ValueError(f"queues.yaml: more than {MAX_QUEUES_YAML:,} bytes")
        if not queues_yaml.strip() and not policy_name:
            raise ValueError("give a queues.yaml, another policy, or both")
        with self._lock:
            for run in self.runs.values():
                run.poll()
                if run.returncode is None:
                    raise WhatIfBusyError(f"what-if {run.run_id} is still running")
            run_id = next(self._ids)
            directory = self._root / str(run_id)
            directory.mkdir()
            queues_path = None
            if queues_yaml.strip():
                queues_path = directory / "queues.yaml"
                queues_path.write_text(queues_yaml)
            proc = _SPAWN.Process(
                target=_work,
                args=(self.source, directory, queues_path, policy_name),
                name=f"gpuledger-whatif-{run_id}",
                daemon=True,
            )
            proc.start()
            run = WhatIfRun(run_id, policy_name, bool(queues_yaml.strip()), directory, proc)
            self.runs[run_id] = run
            return run

    def close(self) -> None:
        """Stop any run still going and remove every run's files."""
        for run in self.runs.values():
            if run.returncode is None and run.proc.exitcode is None:
                run.proc.kill()
                run.proc.join()
        shutil.rmtree(self._root, ignore_errors=True)


def _work(source: str, directory: Path, queues_path: Path | None, policy_name: str) -> None:
    """The worker: one what-if into ``directory/out``; a failure's message goes to
    ``directory/error.txt`` and the exit code is 1."""
    try:
        queues = queue_events(load(str(queues_path), QueuesFile)) if queues_path else None
        out = directory / "out"
        out.mkdir()
        result = what_if(
            open_reader(source), out / "ledger", policy_name=policy_name or None, queues=queues
        )
        report = report_of(result, str(queues_path) if queues_path else None)
        (out / "whatif.txt").write_text(whatif_table(result.rows) + "\n")
        (out / "whatif.json").write_text(json.dumps(report, indent=2) + "\n")
    except Exception as exc:  # the worker's boundary: any failure is the run's, shown on its page
        text = str(exc) if isinstance(exc, ConfigError | LedgerError | OSError) else repr(exc)
        (directory / "error.txt").write_text(text + "\n")
        sys.exit(1)
