"""Time travel: the cluster as it was at a moment, for the console's pages.

Queues, Jobs and Nodes show ``gpuledger state --at`` (``scheduler.fold.state_at.state_at``): the
ledger's records up to the moment are folded with the policy core's ``apply``, nothing
re-decided, so a page at a past moment shows exactly what ``state --at`` prints.

Tenants shows ``gpuledger report`` over the ledger truncated at the moment: the records
before that offset are projected by ``projections.projector.project`` (the one outcome
fold, ``scheduler.fold.outcomes.OutcomeFold``) into a database of their own, and
``projections.report.full_report`` reads it — what ``log export --until`` followed by
``project`` and ``report`` gives. The present projection filtered by time would not be
the same: a job ready later would count its later readiness, a job name submitted again
keeps only its newest run in ``jobs``, and queue paths are today's (docs/console.md).

Both read the ledger from offset 0, so their cost grows with the ledger; ``Travel`` keeps
the last few snapshots, reports and prefix projections, and projects a later moment
onwards from the nearest earlier prefix it holds (the projector is incremental).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from events.codec import Envelope
from events.port import LedgerReader
from events.sources import open_reader
from projections.projector import project
from projections.report import full_report
from scheduler.fold.state_at import state_at

__all__ = ["Prefix", "Travel", "nodes_of"]

_K = TypeVar("_K")
_V = TypeVar("_V")


def nodes_of(snapshot: Any) -> list[dict[str, Any]]:
    """The Nodes page's rows (the shape of ``queries.nodes``) from a folded state."""
    state = snapshot.state
    out: list[dict[str, Any]] = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        per_device: dict[int, list[dict[str, Any]]] = {}
        for pod, job_id in node.pods.items():
            job = state.jobs.get(job_id)
            placement = job.placements.get(pod) if job is not None else None
            if job is None or placement is None:
                continue
            for slot in placement.gpus:
                per_device.setdefault(int(slot.device), []).append(
                    {
                        "job": job.job,
                        "pod": pod,
                        "queue": job.queue,
                        "milli": int(slot.milli),
                        "running": job.status == "running",
                    }
                )
        devices = [
            {
                "device": d,
                "holders": per_device.get(d, []),
                "used_milli": sum(h["milli"] for h in per_device.get(d, [])),
            }
            for d in range(node.gpus)
        ]
        out.append(
            {
                "node": name,
                "gpus": node.gpus,
                "gpu_model": node.gpu_model,
                "cordoned": node.cordoned,
                "devices": devices,
                "idle_devices": sum(1 for d in devices if d["used_milli"] == 0),
                "used_gpus": sum(d["used_milli"] for d in devices) / 1000,
            }
        )
    return out


class Prefix:
    """A ledger reader that ends at ``end``: the records below that offset only."""

    def __init__(self, reader: LedgerReader, end: int) -> None:
        self.reader = reader
        self.end = end

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < min(end, self.end)``."""
        return self.reader.read(start, self.end if end is None else min(end, self.end))

    def end_offset(self) -> int:
        """The prefix's end (the ledger's, if that is shorter)."""
        return min(self.end, self.reader.end_offset())

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.05,  # noqa: ARG002  # a prefix never grows: nothing to wait for
        stop: Callable[[], bool] | None = None,  # noqa: ARG002
        idle_timeout_s: float | None = None,  # noqa: ARG002
    ) -> Iterator[tuple[int, Envelope]]:
        """A prefix does not grow: its records from ``start``, then the end."""
        return self.read(start)

    def close(self) -> None:
        """Close the underlying reader."""
        self.reader.close()


class Travel:
    """Snapshots and reports of one ledger at moments, the last few of each cached."""

    def __init__(self, source: str, keep: int = 8, keep_prefixes: int = 3) -> None:
        self.source = source
        self.keep = keep
        self.keep_prefixes = keep_prefixes
        self._cache: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._reports: OrderedDict[tuple[int, float | None], dict[str, Any]] = OrderedDict()
        self._prefixes: OrderedDict[int, Path] = OrderedDict()
        self._dir: Path | None = None
        self._lock = threading.Lock()
        self._projecting = threading.Lock()
        """One prefix projection at a time: each folds the ledger from the start."""

    def report(self, end: int, window_s: float | None) -> dict[str, Any]:
        """``gpuledger report``'s sections (``full_report``) over the ledger's records
        below offset ``end``, over its last ``window_s`` seconds or all of it."""
        key = (end, window_s)
        with self._lock:
            hit = _lookup(self._reports, key)
        if hit is not None:
            return hit
        with self._projecting:
            with self._lock:  # another request may have computed it meanwhile
                hit = _lookup(self._reports, key)
            if hit is not None:
                return hit
            db = self._prefix(end)
            con = duckdb.connect(str(db), read_only=True)
            try:
                report = full_report(con, window_s)
            finally:
                con.close()
        with self._lock:
            _remember(self._reports, key, report, self.keep)
        return report

    def _prefix(self, end: int) -> Path:
        """The projection of the records below ``end`` (called holding ``_projecting``)."""
        if end in self._prefixes:
            self._prefixes.move_to_end(end)
            return self._prefixes[end]
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="gpuledger-travel-"))
        path = self._dir / f"prefix-{end}.duckdb"
        earlier = [o for o in self._prefixes if o <= end]
        if earlier:
            # Projecting on from the nearest earlier prefix gives the tables projecting
            # from 0 would: the projector resumes from the offsets and the core's state
            # it committed with its last batch, as ``project --follow`` does.
            shutil.copyfile(self._prefixes[max(earlier)], path)
        reader = Prefix(open_reader(self.source), end)
        try:
            project(reader, path)
        except BaseException:
            _remove(path)
            raise
        finally:
            reader.close()
        self._prefixes[end] = path
        while len(self._prefixes) > self.keep_prefixes:
            _, old = self._prefixes.popitem(last=False)
            _remove(old)
        return path

    def close(self) -> None:
        """Remove the prefix projections."""
        with self._projecting:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            self._prefixes.clear()

    def at(self, bound: tuple[str, int], end_offset: int) -> Any:
        """The ``scheduler.fold.state_at.StateView`` at ``bound`` (``("time", ms)`` inclusive or
        ``("offset", n)`` exclusive) of the ledger as far as ``end_offset``."""
        key = (bound[0], bound[1], end_offset)
        with self._lock:
            hit = _lookup(self._cache, key)
        if hit is not None:
            return hit
        reader = open_reader(self.source)
        try:
            snapshot = state_at(reader, bound)
        finally:
            reader.close()
        with self._lock:
            _remember(self._cache, key, snapshot, self.keep)
        return snapshot


def _remove(path: Path) -> None:
    for name in (path, Path(f"{path}.wal")):
        with contextlib.suppress(FileNotFoundError):
            name.unlink()


def _lookup(cache: OrderedDict[_K, _V], key: _K) -> _V | None:
    """The cached value of ``key``, made the most recently used, or None."""
    if key not in cache:
        return None
    cache.move_to_end(key)
    return cache[key]


def _remember(cache: OrderedDict[_K, _V], key: _K, value: _V, keep: int) -> None:
    """Cache ``value`` under ``key``, dropping the least recently used beyond ``keep``."""
    cache[key] = value
    while len(cache) > keep:
        cache.popitem(last=False)
