"""The binder: executes the ledger's decisions against the Kubernetes API.

It follows the ledger and, per scheduling cycle (the records up to a ``CycleCompleted``):

* ``JobPreempted`` → a ``Preempted`` Event on each victim pod naming the preemptor job, its
  queue and the rule, a ``Preempting`` Event on the preemptor's first pod, then the Eviction
  API for each victim pod → ``PodEvicted`` (a pod already gone counts as evicted), or
  ``EvictionFailed`` with the reason and an ``EvictionFailed`` Warning Event when the API
  keeps refusing (a PodDisruptionBudget's 429s outlast the retries) or refuses outright;
* ``PodsAllocated`` → annotate the pod with its GPU slots and job, then ``pods/binding`` →
  ``PodBound`` and a ``Scheduled`` Event, or ``BindFailed`` with the reason;
* ``JobUnschedulable`` → an ``Unschedulable`` Warning Event with the reason.

Idempotent: the annotation patch returns the pod as it is, so a pod already bound to the
chosen node is a success, one bound elsewhere or being deleted or gone is a ``BindFailed``;
a 409 on the binding re-reads the pod. Transient errors (throttling, 5xx, connection
errors) are retried with a doubling back-off, a bounded number of times.

Exactly once. Outcomes go to the binder's own intake ledger ``INTAKE/binder/``, one append per
cycle. Before that append ``INTAKE/binder.state.json`` records the intake end and the ledger
positions before and after the cycle; on restart, an intake end that moved past the recorded
one means the cycle's outcomes are already there (resume after it), otherwise the cycle is
executed again, which the idempotent calls make safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from events.codec import Envelope, UnknownEventType, decode_event, wrap
from events.filelog import FileLedger, LedgerDirReader, LedgerError
from events.model import (
    BindFailed,
    CycleCompleted,
    Event,
    EvictionFailed,
    JobPreempted,
    JobSubmitted,
    JobUnschedulable,
    PodBound,
    PodEvicted,
    PodPlacement,
    PodsAllocated,
)
from scheduler.embedded import open_source, read_json, wall_ms, write_json_atomic
from scheduler.kube import mapping as m
from scheduler.kube.client import emit_event, error_text, is_transient, raw

log = logging.getLogger(__name__)

SOURCE = "binder"
COMPONENT = "gpuledger-binder"


def split_job(job: str) -> tuple[str, str]:
    """``namespace/name`` of a ledger job id (the ingestor's convention)."""
    ns, _, name = job.partition("/")
    return (ns, name) if name else ("default", ns)


class Binder:
    """Follows a ledger and carries out its decisions; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        ledger: str | Path,
        intake: str | Path,
        *,
        attempts: int = 6,
        backoff_s: float = 0.1,
        workers: int = 8,
    ) -> None:
        """Open ``INTAKE/binder/`` (taking its writer lock) and find where to resume."""
        self.core = client.CoreV1Api(api)
        self.ledger = Path(ledger)
        self.intake = Path(intake)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.writer: FileLedger = open_source(self.intake, SOURCE)
        self.state_path = self.intake / f"{SOURCE}.state.json"
        saved = read_json(self.state_path) or {}
        before = int(str(saved.get("intake_end_before", 0)))
        done = self.writer.end_offset() > before
        self.next = int(str(saved.get("next_after" if done else "next_before", 0)))
        self.jobs: dict[str, tuple[str, tuple[str, ...]]] = {}
        """job → (queue, pod names), from the ledger's JobSubmitted inputs."""
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="bind")
        self.bound = 0
        self.failed = 0
        self.evicted = 0
        self.evict_failed = 0

    def close(self) -> None:
        """Release the intake writer lock and the worker threads."""
        self.pool.shutdown(wait=True)
        self.writer.close()

    # ------------------------------------------------------------------ API calls

    def _retry(self, what: str, call: Callable[[], Event]) -> Event | str:
        """Run ``call`` with bounded back-off on transient errors; the last error as text."""
        delay = self.backoff_s
        last = ""
        for attempt in range(self.attempts):
            try:
                return call()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                last = error_text(exc)
                log.warning("%s: transient error (attempt %d): %s", what, attempt + 1, last)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        return f"gave up after {self.attempts} attempts: {last[:200]}"

    def bind(self, job: str, p: PodPlacement) -> Event:
        """Bind one pod; PodBound or BindFailed."""
        ns, _ = split_job(job)
        slots = ",".join(f"{s.device}:{s.milli}" for s in p.gpus)

        def failed(reason: str) -> BindFailed:
            return BindFailed(job=job, pod=p.pod, node=p.node, reason=reason)

        def attempt() -> Event:
            for _ in range(3):  # a 409 means someone else moved: look again
                try:
                    pod = raw(
                        self.core.patch_namespaced_pod,
                        p.pod,
                        ns,
                        {
                            "metadata": {
                                "annotations": {
                                    m.GPU_SLOTS_ANNOTATION: slots,
                                    m.JOB_ANNOTATION: job,
                                }
                            }
                        },
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        return failed("pod gone")
                    raise
                current = m.pod_node(pod)
                if current == p.node:
                    return PodBound(job=job, pod=p.pod, node=p.node)
                if current:
                    return failed(f"pod already bound to node {current}")
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    return failed("pod is being deleted")
                body: Any = {  # the client serialises plain dicts as well as models
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": p.pod, "namespace": ns},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": p.node},
                }
                try:
                    self.core.create_namespaced_pod_binding(p.pod, ns, body, _preload_content=False)
                except ApiException as exc:
                    if exc.status == 409:
                        continue
                    if exc.status == 404:
                        return failed("pod gone")
                    raise
                emit_event(
                    self.core,
                    (ns, p.pod, pod["metadata"].get("uid", "")),
                    "Scheduled",
                    f"gpuledger assigned {ns}/{p.pod} to {p.node}"
                    + (f" (GPU slots {slots})" if slots else "")
                    + f", job {job}",
                    component=COMPONENT,
                )
                return PodBound(job=job, pod=p.pod, node=p.node)
            return failed("binding kept conflicting")

        try:
            result = self._retry(f"bind {ns}/{p.pod}", attempt)
        except ApiException as exc:
            return failed(f"api error {exc.status}: {exc.reason}")
        return failed(result) if isinstance(result, str) else result

    def evict(self, job: str, pod: str, node: str) -> Event:
        """Evict one pod through the Eviction API; PodEvicted (also when already gone) or
        EvictionFailed."""
        ns, _ = split_job(job)
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": ns},
        }

        def attempt() -> Event:
            try:
                self.core.create_namespaced_pod_eviction(pod, ns, body, _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            return PodEvicted(job=job, pod=pod, node=node)

        try:
            result = self._retry(f"evict {ns}/{pod}", attempt)
        except ApiException as exc:
            result = f"api error {error_text(exc)}"
        if isinstance(result, str):
            # The pod keeps running while the ledger says preempted: recorded in the ledger
            # (the core ignores it) and told to people through a Warning Event and the log.
            log.error("evict %s/%s failed: %s", ns, pod, result)
            emit_event(
                self.core,
                (ns, pod, ""),
                "EvictionFailed",
                result,
                component=COMPONENT,
                warning=True,
            )
            return EvictionFailed(job=job, pod=pod, node=node, reason=result)
        return result

    # ------------------------------------------------------------------ decisions

    def _pods_of(self, job: str) -> tuple[str, ...]:
        return self.jobs.get(job, ("", ()))[1]

    def execute(self, decisions: list[Event], nodes: dict[tuple[str, str], str]) -> list[Event]:
        """Carry out one cycle's decisions; return their outcomes in decision order."""
        outcomes: list[Event] = []
        for d in decisions:
            match d:
                case JobPreempted():
                    ns, _ = split_job(d.job)
                    pns, _ = split_job(d.preemptor)
                    rule = d.rule
                    for pod in d.pods:
                        by = (
                            f"by job {d.preemptor} (queue {d.preemptor_queue})"
                            if d.preemptor
                            else "with no preemptor"
                        )
                        emit_event(
                            self.core,
                            (ns, pod, ""),
                            "Preempted",
                            f"preempted {by}, rule {rule}; victim job {d.job} (queue {d.queue})",
                            component=COMPONENT,
                        )
                    preemptor_pods = self._pods_of(d.preemptor)
                    if preemptor_pods:
                        emit_event(
                            self.core,
                            (pns, preemptor_pods[0], ""),
                            "Preempting",
                            f"job {d.preemptor} (queue {d.preemptor_queue}) preempting "
                            f"job {d.job} (queue {d.queue}), rule {rule}, pods "
                            f"{', '.join(d.pods)}",
                            component=COMPONENT,
                        )
                    for pod in d.pods:
                        out = self.evict(d.job, pod, nodes.get((d.job, pod), ""))
                        outcomes.append(out)
                        if isinstance(out, PodEvicted):
                            self.evicted += 1
                        else:
                            self.evict_failed += 1
                case JobUnschedulable():
                    ns, _ = split_job(d.job)
                    for pod in self._pods_of(d.job)[:16]:
                        emit_event(
                            self.core,
                            (ns, pod, ""),
                            "Unschedulable",
                            f"job {d.job} (queue {d.queue}): {d.reason}",
                            component=COMPONENT,
                            warning=True,
                        )
                case _:
                    pass
        # Binds run in parallel: pods of a cycle's allocations are independent API calls.
        futures = [
            self.pool.submit(self.bind, d.job, p)
            for d in decisions
            if isinstance(d, PodsAllocated)
            for p in d.placements
        ]
        for f in futures:
            out = f.result()
            outcomes.append(out)
            if isinstance(out, PodBound):
                self.bound += 1
            else:
                self.failed += 1
        return outcomes

    def run(self, stop: Callable[[], bool] = lambda: False, *, poll_s: float = 0.02) -> None:
        """Follow the ledger from the saved position until ``stop()``."""
        while not (self.ledger.is_dir() and any(self.ledger.glob("*.seg"))):
            if stop():
                return
            time.sleep(poll_s * 5)
        reader = LedgerDirReader(self.ledger)
        nodes: dict[tuple[str, str], str] = {}
        # Job → pods and pod → node for records before the resume point (for Events).
        for offset, env in reader.read(0, self.next):
            self._learn(offset, env, nodes)
        pending: list[Event] = []
        cycle_start = self.next
        last_save = time.monotonic()
        halt = threading.Event()

        def stopping() -> bool:
            if stop():
                halt.set()
            return halt.is_set()

        for offset, env in reader.follow(self.next, poll_s=poll_s, stop=stopping):
            event = self._learn(offset, env, nodes)
            if event is None:
                continue
            if isinstance(event, PodsAllocated | JobPreempted | JobUnschedulable):
                if not pending:
                    cycle_start = offset
                pending.append(event)
            if not isinstance(event, CycleCompleted):
                continue
            if not pending:
                if time.monotonic() - last_save > 1.0:
                    self._save(offset + 1, offset + 1)
                    last_save = time.monotonic()
                self.next = offset + 1
                continue
            outcomes = self.execute(pending, nodes)
            pending = []
            self._save(cycle_start, offset + 1)
            if outcomes:
                self.writer.append([wrap(o, wall_ms()) for o in outcomes])
            self.next = offset + 1
            self._save(self.next, self.next)
            last_save = time.monotonic()

    def _learn(self, offset: int, env: Envelope, nodes: dict[tuple[str, str], str]) -> Event | None:
        try:
            event = decode_event(env, offset)
        except UnknownEventType:
            return None
        match event:
            case JobSubmitted(job=job, queue=q, pods=pods):
                self.jobs[job] = (q, tuple(p.name for p in pods))
            case PodsAllocated(job=job, placements=placements):
                for p in placements:
                    nodes[(job, p.pod)] = p.node
            case _:
                pass
        return event

    def _save(self, before: int, after: int) -> None:
        write_json_atomic(
            self.state_path,
            {
                "next_before": before,
                "next_after": after,
                "intake_end_before": self.writer.end_offset(),
            },
        )


__all__ = ["Binder", "LedgerError", "split_job"]
