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

Idempotent: one ``pods/binding`` call per pod carries its GPU slots and job id as
annotations, so a bound pod is never changed; a 409 re-reads the pod: bound to the chosen
node for this job is a success, bound elsewhere is a ``BindFailed`` naming ``bound_node``
(the ledger never retries it), being deleted or gone is a ``BindFailed``.

``JobTerminated`` → a ``Terminated`` Warning Event and an eviction of each listed pod (a pod
on a node that has left the cluster is deleted at once). A failed eviction is retried with
a doubling back-off, from what the ledger records (``EvictionFailed`` not yet followed by
``PodEvicted`` or ``PodDeleted``), so a restart keeps retrying.

Transient errors (throttling, 5xx, connection errors) are retried with a doubling
back-off, a bounded number of times.

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
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from events.codec import Envelope, UnknownEventType, decode_event, wrap
from events.filelog import LedgerError
from events.localfiles import wall_ms
from events.model import (
    BindFailed,
    CycleCompleted,
    Event,
    EvictionFailed,
    GpuSlot,
    JobPreempted,
    JobSubmitted,
    JobTerminated,
    JobUnschedulable,
    NodeRegistered,
    NodeRemoved,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodPlacement,
    PodsAllocated,
)
from scheduler.kube import mapping as m
from scheduler.kube.client import (
    Poster,
    binding_path,
    emit_event,
    error_text,
    event_body,
    events_path,
    is_transient,
    raw,
    send,
)
from scheduler.kube.retry import Backoff, retry
from scheduler.kube.transport import IntakeSink, LedgerFeed, open_feed, open_sink

log = logging.getLogger(__name__)

SOURCE = "binder"
COMPONENT = "gpuledger-binder"


def split_job(job: str) -> tuple[str, str]:
    """``namespace/name`` of a ledger job id (the ingestor's convention)."""
    ns, _, name = job.partition("/")
    return (ns, name) if name else ("default", ns)


@dataclass
class _Cycle:
    """One cycle's work under way: evictions done, binds started."""

    evictions: list[Event] = field(default_factory=list)
    refused: list[Event] = field(default_factory=list)
    """``BindFailed`` of pods not bound because a victim could not be evicted."""
    binds: list[Future[Event]] = field(default_factory=list)

    def done(self) -> bool:
        """Whether every bind has its outcome."""
        return all(f.done() for f in self.binds)


EVENT_THREADS = 2
"""Threads that send the ``Scheduled`` Events (see ``Binder.event_pool``)."""


class Binder:
    """Follows a ledger and carries out its decisions; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        ledger: str | Path | LedgerFeed,
        intake: str | Path | IntakeSink,
        *,
        attempts: int = 6,
        backoff_s: float = 0.1,
        workers: int = 32,
        eviction_retry_s: float = 2.0,
        max_cycles_in_flight: int = 16,
    ) -> None:
        """Open the ledger feed and the intake sink (directories: ``INTAKE/binder/``, taking
        its writer lock; or ``kafka://`` deployments) and find where to resume."""
        self.core = client.CoreV1Api(api)
        self.poster = Poster(api)
        self.post: Callable[[str, Any], None] = self.poster
        """The per-pod calls (bindings, Scheduled Events): ``http.client`` on kept-alive
        connections, past the generated layer and urllib3 (``scheduler.kube.client.Poster``)."""
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.feed = ledger if isinstance(ledger, LedgerFeed) else open_feed(ledger)
        try:
            self.sink = intake if isinstance(intake, IntakeSink) else open_sink(intake, SOURCE)
        except BaseException:
            self.feed.close()
            raise
        self.next = int(str(self.sink.saved().get("next", 0)))
        self.jobs: dict[str, tuple[str, tuple[str, ...]]] = {}
        """job → (queue, pod names), from the ledger's JobSubmitted inputs."""
        self.requests: dict[tuple[str, str], tuple[int, int]] = {}
        """(job, pod) → (CPU, memory) asked for, from JobSubmitted."""
        self.holdings: dict[tuple[str, str], tuple[tuple[GpuSlot, ...], int, int]] = {}
        """(job, pod) → (GPU slots, CPU, memory) of its last allocation, for EvictionFailed."""
        self.uids: dict[tuple[str, str], str] = {}
        """(job, pod) → the pod object's UID, from JobSubmitted: binds and evictions name
        it, so a pod re-created under the same name is never bound or evicted for this job."""
        self.removed_nodes: set[str] = set()
        """Nodes the ledger says have left: their pods are deleted rather than evicted."""
        self.failed_evictions: dict[tuple[str, str], tuple[float, float, str]] = {}
        """(job, pod) → (next try, back-off, node) for evictions the ledger records as
        failed and not yet followed by the pod's end."""
        self.eviction_retry_s = eviction_retry_s
        self.max_cycles_in_flight = max_cycles_in_flight
        """Cycles of allocations whose binds may be under way at once (see ``run``)."""
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="bind")
        self.event_pool = ThreadPoolExecutor(EVENT_THREADS, thread_name_prefix="event")
        """Scheduled Events are sent from a few threads of their own, queued behind the
        bindings: a courtesy to people, they must not take the API server's time from the
        next binding (the kube-scheduler, too, sends its Events from one queue)."""
        self.bound = 0
        self.failed = 0
        self.evicted = 0
        self.evict_failed = 0

    def close(self) -> None:
        """Release the intake writer (lock or producer), the feed and the worker threads."""
        self.pool.shutdown(wait=True)
        self.event_pool.shutdown(wait=True)
        self.poster.close()
        self.sink.close()
        self.feed.close()

    # ------------------------------------------------------------------ API calls

    def _retry(self, what: str, call: Callable[[], Event]) -> Event | str:
        """``call`` through the adapters' ``retry``; an error that stays transient, or any
        API error, as text for the ledger (other errors are raised)."""
        try:
            return retry(
                call,
                what=what,
                attempts=self.attempts,
                transient=is_transient,
                backoff=Backoff(self.backoff_s, 5.0),
                describe=error_text,
            )
        except Exception as exc:
            if is_transient(exc):
                return f"gave up after {self.attempts} attempts: {error_text(exc)[:200]}"
            if isinstance(exc, ApiException):
                return f"api error {error_text(exc)}"
            raise

    def bind(self, job: str, p: PodPlacement, uid: str | None = None) -> Event:
        """Bind one pod; PodBound or BindFailed.

        One ``pods/binding`` call carries the GPU slots and the job id as annotations (the
        API server copies a Binding's annotations onto the pod), so a pod that is already
        bound is never touched: the API answers 409 and the pod is read to say where it is.
        """
        ns, _ = split_job(job)
        slots = ",".join(f"{s.device}:{s.milli}" for s in p.gpus)
        if uid is None:
            uid = self.uids.get((job, p.pod), "")

        def failed(reason: str, bound_node: str = "") -> BindFailed:
            return BindFailed(job=job, pod=p.pod, node=p.node, reason=reason, bound_node=bound_node)

        def attempt() -> Event:
            body: Any = {  # the client serialises plain dicts as well as models
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": p.pod,
                    "namespace": ns,
                    "annotations": {m.GPU_SLOTS_ANNOTATION: slots, m.JOB_ANNOTATION: job},
                    # The API server binds only the pod object with this UID (409 otherwise).
                    **({"uid": uid} if uid else {}),
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": p.node},
            }
            try:
                self.post(binding_path(ns, p.pod), body)
            except ApiException as exc:
                if exc.status == 404:
                    return failed("pod gone")
                if exc.status != 409:
                    raise
                try:
                    pod = raw(self.core.read_namespaced_pod, p.pod, ns)
                except ApiException as again:
                    if again.status == 404:
                        return failed("pod gone")
                    raise
                if uid and (pod.get("metadata") or {}).get("uid") != uid:
                    return failed("pod gone (re-created under the same name)")
                current = m.pod_node(pod)
                annotations = (pod.get("metadata") or {}).get("annotations") or {}
                if current == p.node and annotations.get(m.JOB_ANNOTATION) == job:
                    return PodBound(job=job, pod=p.pod, node=p.node)  # ours, bound before
                if current:
                    return failed(f"pod already bound to node {current}", bound_node=current)
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    return failed("pod is being deleted")
                raise
            log.info("bound %s/%s to %s (GPU slots %s), job %s", ns, p.pod, p.node, slots, job)
            self.event_pool.submit(
                self._scheduled_event,
                ns,
                p.pod,
                f"gpuledger assigned {ns}/{p.pod} to {p.node}"
                + (f" (GPU slots {slots})" if slots else "")
                + f", job {job}",
            )
            return PodBound(job=job, pod=p.pod, node=p.node)

        result = self._retry(f"bind {ns}/{p.pod}", attempt)
        return failed(result) if isinstance(result, str) else result

    def _scheduled_event(self, ns: str, pod: str, message: str) -> None:
        """The ``Scheduled`` Event of a bound pod (a courtesy: failures are logged only)."""
        event_ns, body = event_body((ns, pod, ""), "Scheduled", message, component=COMPONENT)
        try:
            self.post(events_path(event_ns), body)
        except Exception:
            log.warning("could not create Scheduled event on %s/%s", ns, pod, exc_info=True)

    def evict(self, job: str, pod: str, node: str) -> Event:
        """Evict one pod through the Eviction API; PodEvicted (also when already gone) or
        EvictionFailed (with the slots it holds, so the ledger keeps them taken).

        A pod whose node has left the cluster is deleted at once (grace period 0), as the
        pod garbage collector does: no kubelet will ever confirm its graceful end.
        """
        ns, _ = split_job(job)
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": ns},
        }
        orphaned = bool(node) and node in self.removed_nodes

        def attempt() -> Event:
            try:
                if orphaned:
                    send(self.core.delete_namespaced_pod, pod, ns, grace_period_seconds=0)
                else:
                    send(self.core.create_namespaced_pod_eviction, pod, ns, body)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            return PodEvicted(job=job, pod=pod, node=node)

        result = self._retry(f"evict {ns}/{pod}", attempt)
        if isinstance(result, str):
            # The pod keeps running: the ledger holds its slots again (EvictionFailed) and
            # the eviction is retried with back-off until it succeeds or the pod is gone.
            log.error("evict %s/%s failed: %s", ns, pod, result)
            emit_event(
                self.core,
                (ns, pod, ""),
                "EvictionFailed",
                f"{result}; retrying",
                component=COMPONENT,
                warning=True,
            )
            gpus, cpu, memory = self.holdings.get((job, pod), ((), 0, 0))
            return EvictionFailed(
                job=job,
                pod=pod,
                node=node,
                reason=result,
                gpus=gpus,
                cpu_milli=cpu,
                memory_mib=memory,
            )
        log.info("evicted %s/%s from %s, job %s", ns, pod, node, job)
        return result

    def retry_evictions(self, now: float | None = None) -> list[Event]:
        """Evict again the pods whose eviction failed and whose back-off has run out."""
        now = time.monotonic() if now is None else now
        outcomes: list[Event] = []
        for key, (due, delay, node) in list(self.failed_evictions.items()):
            if due > now:
                continue
            out = self.evict(key[0], key[1], node)
            if isinstance(out, PodEvicted):
                self.failed_evictions.pop(key, None)
                outcomes.append(out)
                self.evicted += 1
            else:
                self.failed_evictions[key] = (now + delay * 2, min(delay * 2, 300.0), node)
        return outcomes

    # ------------------------------------------------------------------ decisions

    def _pods_of(self, job: str) -> tuple[str, ...]:
        return self.jobs.get(job, ("", ()))[1]

    def _start(self, decisions: list[Event], nodes: dict[tuple[str, str], str]) -> _Cycle:
        """Carry out one cycle's evictions and Events, and start its binds.

        Binds come first in the outcomes, evictions after: a preemptor is not bound on a
        device whose victim could not be evicted (its pods get ``BindFailed``), so the
        ledger releases it before it holds the victim's slots again.
        """
        evictions: list[Event] = []
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
                        evictions.append(self.evict(d.job, pod, nodes.get((d.job, pod), "")))
                case JobTerminated():
                    ns, _ = split_job(d.job)
                    for pod in d.pods:
                        emit_event(
                            self.core,
                            (ns, pod, ""),
                            "Terminated",
                            f"job {d.job} (queue {d.queue}) ended: {d.reason}; evicting its pods",
                            component=COMPONENT,
                            warning=True,
                        )
                    for pod in d.pods:
                        evictions.append(self.evict(d.job, pod, nodes.get((d.job, pod), "")))
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
        stuck = [e for e in evictions if isinstance(e, EvictionFailed)]
        work = _Cycle(evictions=evictions)
        allocations = [d for d in decisions if isinstance(d, PodsAllocated)]
        blocked = {d.job: _blocking_victim(d, stuck) for d in allocations}
        # Binds run in parallel: pods of a cycle's allocations are independent API calls.
        work.binds = [
            # The UID as of this cycle: the ledger may forget it (the pod's end) meanwhile.
            self.pool.submit(self.bind, d.job, p, self.uids.get((d.job, p.pod), ""))
            for d in allocations
            if not blocked[d.job]
            for p in d.placements
        ]
        for d in allocations:
            if blocked[d.job]:
                work.refused += [
                    BindFailed(
                        job=d.job,
                        pod=p.pod,
                        node=p.node,
                        reason=f"not bound: {blocked[d.job]} could not be evicted",
                    )
                    for p in d.placements
                ]
        return work

    def execute(self, decisions: list[Event], nodes: dict[tuple[str, str], str]) -> list[Event]:
        """Carry out one cycle's decisions and wait for them; return their outcomes."""
        return self._outcomes(self._start(decisions, nodes))

    def _outcomes(self, work: _Cycle) -> list[Event]:
        """Wait for a started cycle's binds; its outcomes in ``execute``'s order."""
        outcomes = [*work.refused, *(f.result() for f in work.binds)]
        for out in outcomes:
            if isinstance(out, PodBound):
                self.bound += 1
            else:
                self.failed += 1
        for out in work.evictions:
            if isinstance(out, PodEvicted):
                self.evicted += 1
            else:
                self.evict_failed += 1
        return outcomes + work.evictions

    def run(self, stop: Callable[[], bool] = lambda: False, *, poll_s: float = 0.02) -> None:
        """Follow the ledger from the saved position until ``stop()``."""
        if not self.feed.wait(stop, poll_s=poll_s * 5):
            return
        reader = self.feed
        nodes: dict[tuple[str, str], str] = {}
        # Job → pods and pod → node for records before the resume point (for Events).
        for offset, env in reader.read(0, self.next):
            self._learn(offset, env, nodes)
        pending: list[Event] = []
        cycle_start = self.next
        last_save = time.monotonic()
        halt = threading.Event()
        flying: deque[tuple[int, int, _Cycle]] = deque()
        """Cycles whose binds are under way: (first offset, next offset, work), in ledger
        order. Each is saved, with the position after it, once it and all before it are
        done, so a restart resumes after the last cycle carried out in full."""

        def land(wait: bool) -> None:
            while flying and (wait or flying[0][2].done()):
                start, after, work = flying.popleft()
                self._save(start, after, self._outcomes(work))
                self.next = after

        def stopping() -> bool:
            land(wait=False)  # the feed polls this while it waits
            if stop():
                halt.set()
            elif self.failed_evictions and not pending and not flying:
                # Between cycles: evictions that failed are tried again once their
                # back-off has run out.
                retried = self.retry_evictions()
                if retried:
                    self._save(self.next, self.next, retried)
            return halt.is_set()

        for offset, env in reader.follow(self.next, poll_s=poll_s, stop=stopping):
            event = self._learn(offset, env, nodes)
            if event is None:
                continue
            if isinstance(event, PodsAllocated | JobPreempted | JobUnschedulable | JobTerminated):
                if not pending:
                    cycle_start = offset
                pending.append(event)
            if not isinstance(event, CycleCompleted):
                continue
            if not pending:
                if flying:
                    continue  # the position moves with the cycles under way
                if time.monotonic() - last_save > 1.0:
                    self._save(offset + 1, offset + 1)
                    last_save = time.monotonic()
                self.next = offset + 1
                continue
            # Cycles that only allocate overlap: the next one's binds start while earlier
            # ones are still waiting for the API server. Any other decision (an eviction,
            # a termination) waits until every bind before it is done, so a pod is never
            # evicted while its own binding is still on the way.
            only_binds = all(isinstance(d, PodsAllocated) for d in pending)
            land(wait=not only_binds or len(flying) >= self.max_cycles_in_flight)
            flying.append((cycle_start, offset + 1, self._start(pending, nodes)))
            pending = []
            land(wait=False)
            last_save = time.monotonic()
        land(wait=True)

    def _learn(self, offset: int, env: Envelope, nodes: dict[tuple[str, str], str]) -> Event | None:
        try:
            event = decode_event(env, offset)
        except UnknownEventType:
            return None
        match event:
            case JobSubmitted(job=job, queue=q, pods=pods):
                self.jobs[job] = (q, tuple(p.name for p in pods))
                for spec in pods:
                    self.requests[(job, spec.name)] = (spec.cpu_milli, spec.memory_mib)
                    if spec.uid:
                        self.uids[(job, spec.name)] = spec.uid
            case PodsAllocated(job=job, placements=placements):
                for placed in placements:
                    nodes[(job, placed.pod)] = placed.node
                    cpu, memory = self.requests.get((job, placed.pod), (0, 0))
                    self.holdings[(job, placed.pod)] = (placed.gpus, cpu, memory)
            case NodeRemoved(node=node):
                self.removed_nodes.add(node)
            case NodeRegistered(node=node):
                self.removed_nodes.discard(node)
            case EvictionFailed(job=job, pod=pod, node=node):
                if (job, pod) not in self.failed_evictions:
                    delay = self.eviction_retry_s
                    self.failed_evictions[(job, pod)] = (time.monotonic() + delay, delay, node)
            case PodEvicted(job=job, pod=pod) | PodDeleted(job=job, pod=pod):
                self.failed_evictions.pop((job, pod), None)
                self.holdings.pop((job, pod), None)
                self.requests.pop((job, pod), None)
                self.uids.pop((job, pod), None)
            case _:
                pass
        return event

    def _save(self, before: int, after: int, outcomes: Sequence[Event] = ()) -> None:
        """Append a cycle's outcomes with the ledger position after it, atomically; where
        that takes two writes (files), ``before`` is where a restart resumes if the append
        did not land (the cycle is executed again: the API calls are idempotent)."""
        at = wall_ms()
        self.sink.commit([wrap(o, at) for o in outcomes], {"next": after}, before={"next": before})


def _uid_conflict(exc: ApiException) -> bool:
    """A 409 that says the object's UID is not the one asked for (a precondition)."""
    return "uid" in str(exc.body or "").lower() or "precondition" in str(exc.body or "").lower()


def _blocking_victim(allocation: PodsAllocated, stuck: list[EvictionFailed]) -> str:
    """The first pod whose failed eviction leaves one of this allocation's GPU slots taken
    (``job/pod``), or "" when nothing blocks it."""
    wanted = {(p.node, s.device) for p in allocation.placements for s in p.gpus}
    for out in stuck:
        if any((out.node, s.device) in wanted for s in out.gpus) or (
            not out.gpus and any(p.node == out.node for p in allocation.placements)
        ):
            return f"{out.job}/{out.pod}"
    return ""


__all__ = ["Binder", "LedgerError", "split_job"]
