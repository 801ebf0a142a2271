"""The console's forecasts: ``gpuledger forecast`` for its pages and API.

Each forecast folds the ledger up to the moment (``replay.forecast.moment_of``) and runs the
policy forward (``replay.forecast.SAMPLES`` times where runtimes are learned), so its cost
grows with the ledger and the backlog. The console keeps
the last few results by moment, and at the ledger's end recomputes at most once every
``every_s`` seconds however fast records arrive: between two, the pages show the last one
with the offset it was made at. A forecast is a read-side computation: nothing it does
reaches the ledger or the projection.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from events.sources import open_reader
from replay.config import ConfigError
from replay.forecast import Moment, forecast, job_from_yaml, moment_of, sooner, submit

__all__ = ["Forecasts"]


class Forecasts:
    """Forecasts of the ledger at ``source``, cached by moment."""

    def __init__(self, source: str, *, keep: int = 8, every_s: float = 30.0) -> None:
        """``every_s``: the least wall time between two forecasts at the ledger's end."""
        self.source = source
        self.keep = keep
        self.every_s = every_s
        self._results: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._latest: tuple[float, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def _moment(self, bound: tuple[str, int] | None, end_offset: int) -> Moment:
        reader = open_reader(self.source)
        try:
            if bound is None:
                return moment_of(reader.read(0, end_offset))
            kind, value = bound
            if kind == "offset":
                return moment_of(reader.read(0, min(value, end_offset)))
            return moment_of(reader.read(0, end_offset), value)
        finally:
            reader.close()

    def at(self, bound: tuple[str, int] | None, end_offset: int) -> dict[str, Any]:
        """``{"at_ms", "through_offset", "jobs": [row…], "by_job": {job: row}}`` at
        ``bound`` (an offset or a time, as ``?at=``), or at the ledger's end (the records
        before ``end_offset``, the projection's)."""
        with self._lock:  # one forecast at a time: each is a whole forward run
            if bound is None and self._latest is not None:
                made, result = self._latest
                if time.monotonic() - made < self.every_s:
                    return result
            # A moment in time takes in records appended later with an earlier stamp (a
            # ledger that has not reached it yet): its key holds the end offset too.
            key: tuple[Any, ...]
            if bound is None:
                key = ("end", end_offset)
            elif bound[0] == "offset":
                key = ("offset", min(bound[1], end_offset))
            else:
                key = ("time", bound[1], end_offset)
            found = self._results.get(key)
            if found is None:
                moment = self._moment(bound, end_offset)
                now = moment.fold.state.now
                rows = [f.row(now) for f in forecast(moment)]
                found = {
                    "at_ms": now,
                    "through_offset": moment.last_offset,
                    "jobs": rows,
                    "by_job": {row["job"]: row for row in rows},
                }
                self._results[key] = found
                while len(self._results) > self.keep:
                    self._results.popitem(last=False)
            if bound is None:
                self._latest = (time.monotonic(), found)
            return found

    def new_job(self, text: str, end_offset: int) -> dict[str, Any]:
        """The forecast of a job pasted as workload YAML (one job), submitted at the
        ledger's end: its row and what would make it start sooner, or ``error``."""
        try:
            job = job_from_yaml(text, "the pasted job")
        except ConfigError as exc:
            return {"error": str(exc)}
        moment = self._moment(None, end_offset)
        submitted = submit(moment, job)
        if isinstance(submitted, str):
            return {"error": f"the scheduler would refuse it: {submitted}"}
        (f,) = forecast(submitted, jobs=[job.job])
        return {
            "at_ms": moment.fold.state.now,
            "job": f.row(moment.fold.state.now),
            "sooner": sooner(moment, job),
        }
