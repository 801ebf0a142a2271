"""Drift between the API server and the ledger, turned into facts the core folds.

The ingestor lists every gpuledger pod at start and every ``resync_s``; ``Reconciler``
folds the ledger (``scheduler.core.apply``, the core's own meaning of each record) up to its
end and compares the two:

* a pod bound to a node, not being deleted, carrying the job annotation the binder writes,
  whose GPUs the ledger counts free (its job ended, waits again, or never placed this pod)
  is still running outside the ledger's books: ``EvictionFailed`` with the slots from its
  ``gpu-slots`` annotation, so the core holds them again and the binder evicts it;
* a pod bound to another node than the ledger placed it on: ``BindFailed`` naming
  ``bound_node`` (the job ends; its pods are evicted);
* a pod the ledger places or holds whose object (by UID) is gone: ``PodDeleted``.

A difference is reported only when two consecutive comparisons find it, so the ordinary
lag between a decision and its execution (a preempted pod the binder is evicting right
now, a pod bound a moment after its allocation) is never mistaken for drift.
"""

from __future__ import annotations

import logging
from typing import Any

from events.codec import DecodeError, decode_event
from events.model import BindFailed, Event, EvictionFailed, GpuSlot, PodDeleted
from events.port import LedgerReader
from scheduler.core.apply import apply
from scheduler.core.state import ACTIVE, State
from scheduler.kube import mapping as m

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def gpu_slots(text: str) -> tuple[GpuSlot, ...]:
    """The binder's ``gpu-slots`` annotation (``0:1000,1:500``); () if unreadable."""
    try:
        pairs = [part.split(":") for part in text.split(",") if part]
        return tuple(GpuSlot(int(d), int(milli)) for d, milli in pairs)
    except ValueError:
        return ()


def differences(state: State, pods: list[Obj]) -> dict[tuple[str, str, str], Event]:
    """What the API server's ``pods`` show that the ledger's ``state`` does not, as facts,
    keyed by (kind, job, pod)."""
    found: dict[tuple[str, str, str], Event] = {}
    uids: set[str] = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        uids.add(str(meta.get("uid") or ""))
        node = m.pod_node(pod)
        annotations = meta.get("annotations") or {}
        job_id = str(annotations.get(m.JOB_ANNOTATION) or "")
        if (
            not node
            or not job_id
            or meta.get("deletionTimestamp")
            or m.pod_phase(pod) in ("Succeeded", "Failed")
            or not state.known(job_id)
        ):
            continue
        name = str(meta["name"])
        job = state.jobs.get(job_id)
        if job is not None and job.status in ACTIVE and name in job.placements:
            placed = job.placements[name]
            if name not in job.finished and placed.node != node:
                found[("bound", job_id, name)] = BindFailed(
                    job=job_id,
                    pod=name,
                    node=placed.node,
                    reason=f"reconcile: the pod is bound to {node}",
                    bound_node=node,
                )
            continue
        if name in state.held.get(job_id, {}) or node not in state.nodes:
            continue
        try:
            spec = m.pod_spec(pod)
        except ValueError:
            continue
        found[("running", job_id, name)] = EvictionFailed(
            job=job_id,
            pod=name,
            node=node,
            reason="reconcile: still running, though the ledger counts its resources free",
            gpus=gpu_slots(str(annotations.get(m.GPU_SLOTS_ANNOTATION) or "")),
            cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib,
        )
    for job in state.jobs.values():
        if job.status not in ACTIVE:
            continue
        for spec in job.pods:
            if (
                spec.uid
                and spec.name in job.placements
                and spec.name not in job.finished
                and spec.uid not in uids
            ):
                found[("gone", job.job, spec.name)] = PodDeleted(
                    job=job.job, pod=spec.name, reason="reconcile: gone from the API server"
                )
    return found


class Reconciler:
    """Folds a ledger as it grows and reports drift confirmed by two comparisons."""

    def __init__(self, reader: LedgerReader) -> None:
        """Fold ``reader`` from its start at the first comparison."""
        self.reader = reader
        self.state = State()
        self.next = 0
        self.suspects: dict[tuple[str, str, str], Event] = {}

    def catch_up(self) -> None:
        """Fold the ledger's new records."""
        for offset, env in self.reader.read(self.next, self.reader.end_offset()):
            self.next = offset + 1
            try:
                event = decode_event(env, offset)
            except DecodeError:
                continue  # a newer writer's type: the core would ignore it too
            apply(self.state, event, env.at)

    def compare(self, pods: list[Obj]) -> list[Event]:
        """The facts to record for ``pods`` (the API server's list) now."""
        self.catch_up()
        now = differences(self.state, pods)
        confirmed = [event for key, event in now.items() if key in self.suspects]
        self.suspects = now
        for event in confirmed:
            log.warning("reconcile: %s", event)
        return confirmed

    def close(self) -> None:
        """Release the ledger reader."""
        self.reader.close()


__all__ = ["Reconciler", "differences", "gpu_slots"]
