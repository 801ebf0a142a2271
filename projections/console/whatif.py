"""The console's What-if page: ``gpuledger replay --out`` in a worker process.

A run re-simulates the served ledger's outside facts under another queue configuration
(a queues.yaml pasted into the page) and/or another policy, exactly as
``gpuledger replay --ledger SRC --queues Q --policy-name P --out DIR`` does — it *is* that
command, in a subprocess, so a long replay never blocks the server and a crash in it
cannot take the server down. Each run writes only to a temporary directory of its own
(the new ledger, ``whatif.json``, ``whatif.txt``); the served ledger is only read. One run
at a time: the machine's cores belong to the follower and the readers first.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MAX_QUEUES_YAML", "WhatIfBusyError", "WhatIfRun", "WhatIfRuns"]

MAX_QUEUES_YAML = 1_000_000
"""Bytes of pasted queues.yaml accepted."""


class WhatIfBusyError(RuntimeError):
    """Another what-if is still running."""


@dataclass
class WhatIfRun:
    """One what-if: its inputs, its worker process and, when done, its report."""

    run_id: int
    policy_name: str
    queues_given: bool
    directory: Path
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    returncode: int | None = None
    output: str = ""
    error: str = ""

    def poll(self) -> None:
        if self.returncode is not None or self.proc.poll() is None:
            return
        self.returncode = self.proc.returncode
        self.finished = time.monotonic()
        self.output = (self.directory / "stdout.txt").read_text()
        self.error = (self.directory / "stderr.txt").read_text().strip()

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
        """Start ``gpuledger replay --out`` with the pasted queues and/or policy name."""
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
            command = [
                str(Path(sys.executable).parent / "gpuledger"),
                "replay",
                "--ledger",
                self.source,
                "--out",
                str(directory / "out"),
            ]
            if queues_yaml.strip():
                (directory / "queues.yaml").write_text(queues_yaml)
                command += ["--queues", str(directory / "queues.yaml")]
            if policy_name:
                command += ["--policy-name", policy_name]
            # Output to files, not pipes: nobody reads a pipe while the run goes on.
            with (
                open(directory / "stdout.txt", "wb") as out,
                open(directory / "stderr.txt", "wb") as err,
            ):
                proc = subprocess.Popen(command, stdout=out, stderr=err)  # noqa: S603  # our CLI
            run = WhatIfRun(run_id, policy_name, bool(queues_yaml.strip()), directory, proc)
            self.runs[run_id] = run
            return run

    def close(self) -> None:
        """Stop any run still going and remove every run's files."""
        for run in self.runs.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()
        shutil.rmtree(self._root, ignore_errors=True)
