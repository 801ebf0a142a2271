"""Time travel: the cluster as it was at a moment, for the console's pages.

It is ``gpuledger state --at`` (``replay.inspect.state_at``): the ledger's records up to
the moment are folded with the policy core's ``apply``, nothing re-decided, so a page at
a past moment shows exactly what ``state --at`` prints. The fold reads the ledger from
offset 0, so its cost grows with the ledger; ``Travel`` keeps the last few snapshots.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from events.sources import open_reader
from replay.inspect import state_at

__all__ = ["Travel", "nodes_of"]


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


class Travel:
    """Snapshots of one ledger at moments, the last ``keep`` of them cached."""

    def __init__(self, source: str, keep: int = 8) -> None:
        self.source = source
        self.keep = keep
        self._cache: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._lock = threading.Lock()

    def at(self, bound: tuple[str, int], end_offset: int) -> Any:
        """The ``replay.inspect.StateView`` at ``bound`` (``("time", ms)`` inclusive or
        ``("offset", n)`` exclusive) of the ledger as far as ``end_offset``."""
        key = (bound[0], bound[1], end_offset)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        reader = open_reader(self.source)
        try:
            snapshot = state_at(reader, bound)
        finally:
            reader.close()
        with self._lock:
            self._cache[key] = snapshot
            while len(self._cache) > self.keep:
                self._cache.popitem(last=False)
        return snapshot
