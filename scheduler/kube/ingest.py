"""The ingestor: Kubernetes pods, nodes and Queues → intake events.

It watches pods with ``spec.schedulerName: gpuledger``, all nodes and ``Queue`` custom
resources, and appends to its intake (a directory's ``INTAKE/ingest/`` or the Kafka intake
topic, see ``scheduler.kube.transport``):

* ``NodeRegistered`` / ``NodeCordoned`` / ``NodeRemoved`` when a node's capacity, labels,
  taints or cordon change (heartbeats that change nothing record nothing);
* ``QueueConfigured`` / ``QueueRemoved`` for ``Queue`` objects. A Queue that cannot enter
  the ledger (numbers it cannot read, a missing parent, a parent cycle) gets an
  ``InvalidQueue`` Warning Event instead and is left out;
* ``JobSubmitted`` once a job's pods are all there: a gang (pod-group label, or an owner:
  a JobSet, a PyTorchJob or a batch Job, see ``mapping.gang_owner``) is submitted when
  ``min-member`` pods of it have been seen, with the pods seen by then. Until then each new
  member gets a ``WaitingForGang`` Event ("waiting for gang members: 1 of 2 (min-member 2)");
* ``JobRejected`` instead, with a ``Rejected`` Warning Event on the pods, when a pod cannot
  be read (an annotation or label with a value it cannot use: the Event names the field,
  the value and what is accepted) or its namespace is not bound to the queue it names.
  Intake goes on: one bad pod never stops the loop;
* ``PodStarted`` / ``PodFinished`` from pod phase changes;
* ``PodDeleted`` when a pod of a submitted job disappears from the API server; the core
  decides what that means for the job (``JobTerminated`` for a gang below its minimum).

Identity. Jobs are keyed by pod UID, not only by name: a pod or gang re-created under a
name already used (``kubectl delete`` then ``apply``, a StatefulSet, a controller
re-creating members) is a new submission, ``ns/name#2`` and so on (``job_id``). A pod that
comes while the job of its name still runs waits for that job to end.

Idempotence. What the ingestor has already said is derived at start-up from its own earlier
intake records, so re-seeing an object never duplicates an event; so is which job each pod
UID is, from the UIDs its ``JobSubmitted`` records carry. Its position (the pods watch's
resourceVersion, the gangs being assembled, and the UIDs of pods of jobs it rejected, which
no record names) is committed with what it produced: a few entries per batch, not one per
live pod. Pods are
listed in full at every start and every ``resync_s`` and compared with what intake said:
a pod deleted while nobody watched becomes a ``PodDeleted``, a phase change missed a
``PodStarted``/``PodFinished``. Given the scheduler's ledger, the same list is compared
with the ledger's allocations and held pods, and drift the ledger does not know becomes a
fact (``scheduler.kube.reconcile``). Nodes and Queues are re-listed at every start.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from events.codec import UnknownEventType, decode_event, wrap
from events.localfiles import wall_ms
from events.model import (
    Event,
    JobCancelled,
    JobRejected,
    JobSubmitted,
    NodeCordoned,
    NodeRegistered,
    NodeRemoved,
    PodDeleted,
    PodFinished,
    PodSpec,
    PodStarted,
    QueueConfigured,
    QueueRemoved,
)
from events.port import LedgerReader
from scheduler.kube import mapping as m
from scheduler.kube.client import Gone, Obj, emit_event, is_transient, raw, watch
from scheduler.kube.reconcile import Reconciler
from scheduler.kube.retry import Backoff, retry
from scheduler.kube.transport import IntakeSink, open_sink

log = logging.getLogger(__name__)

SOURCE = "ingest"
COMPONENT = "gpuledger-ingestor"


@dataclass(slots=True)
class _Said:
    """What the intake ledger already holds (derived from it at start-up)."""

    jobs: dict[str, frozenset[str]] = field(default_factory=dict)
    started: set[tuple[str, str]] = field(default_factory=set)
    finished: set[tuple[str, str]] = field(default_factory=set)
    deleted: set[tuple[str, str]] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    generation: dict[str, int] = field(default_factory=dict)
    """Per job base id (``namespace/group``), the last generation used (see ``job_id``)."""
    nodes: dict[str, NodeRegistered] = field(default_factory=dict)
    cordoned: dict[str, bool] = field(default_factory=dict)
    queues: dict[str, QueueConfigured] = field(default_factory=dict)

    def fold(self, event: Event) -> None:
        match event:
            case JobSubmitted(job=job, pods=pods):
                self.jobs[job] = frozenset(p.name for p in pods)
                self._generation(job)
            case JobRejected(job=job) | JobCancelled(job=job):
                self.closed.add(job)
                self._generation(job)
            case PodDeleted(job=job, pod=pod):
                self.deleted.add((job, pod))
            case PodStarted(job=job, pod=pod):
                self.started.add((job, pod))
            case PodFinished(job=job, pod=pod):
                self.finished.add((job, pod))
            case NodeRegistered(node=node):
                self.nodes[node] = event
            case NodeCordoned(node=node, cordoned=cordoned):
                self.cordoned[node] = cordoned
            case NodeRemoved(node=node):
                self.nodes.pop(node, None)
                self.cordoned.pop(node, None)
            case QueueConfigured(queue=name):
                self.queues[name] = event
            case QueueRemoved(queue=name):
                self.queues.pop(name, None)
            case _:
                pass

    def _generation(self, job: str) -> None:
        base, n = split_generation(job)
        self.generation[base] = max(self.generation.get(base, 0), n)

    def ended(self, job: str) -> bool:
        """Closed, or every pod of it finished or deleted: its name may start a new job."""
        if job in self.closed:
            return True
        pods = self.jobs.get(job)
        return pods is not None and all(
            (job, p) in self.finished or (job, p) in self.deleted for p in pods
        )


def _parents_first(queues: list[Obj]) -> list[Obj]:
    """Queue objects ordered so that each comes after its parent (unknown parents last)."""
    by_name = {q["metadata"]["name"]: q for q in queues}
    out: list[Obj] = []
    placed: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in placed or name in path or name not in by_name:
            return
        parent = (by_name[name].get("spec") or {}).get("parentQueue") or ""
        if parent:
            visit(str(parent), (*path, name))
        placed.add(name)
        out.append(by_name[name])

    for name in sorted(by_name):
        visit(name, ())
    return out


def split_generation(job: str) -> tuple[str, int]:
    """``ns/name#3`` → (``ns/name``, 3); a job id without a generation is generation 1."""
    base, sep, n = job.rpartition("#")
    return (base, int(n)) if sep and n.isdigit() else (job, 1)


def job_id(base: str, generation: int) -> str:
    """The ledger id of a job's ``generation``-th incarnation: pods and gangs re-created
    under a name already used (``kubectl delete`` then ``apply``, a StatefulSet or a
    controller re-creating members) are new submissions, ``ns/name#2`` and so on."""
    return base if generation == 1 else f"{base}#{generation}"


class Ingestor:
    """Watches the API and appends intake events; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        intake: str | Path | IntakeSink,
        *,
        ledger: LedgerReader | None = None,
        resync_s: float = 300.0,
    ) -> None:
        """Open the intake sink (an intake directory: ``INTAKE/ingest/``, taking its writer
        lock; or a ``kafka://`` deployment) and derive what it already says. With the
        scheduler's ``ledger``, every full list of pods is also compared with what the
        ledger holds (``scheduler.kube.reconcile``)."""
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.sink = intake if isinstance(intake, IntakeSink) else open_sink(intake, SOURCE)
        self.said = _Said()
        submitted: dict[str, tuple[str, str]] = {}
        for offset, env in self.sink.earlier():
            try:
                event = decode_event(env, offset)
            except UnknownEventType:
                continue
            self.said.fold(event)
            if isinstance(event, JobSubmitted):
                for spec in event.pods:
                    if spec.uid:
                        submitted[spec.uid] = (event.job, spec.name)
        saved = self.sink.saved()
        self.pods_rv: str = str(saved.get("pods_rv") or "")
        self._restore(saved, submitted)
        self.bindings: dict[str, tuple[str, ...]] = {}
        self.parents: set[str] = set()
        self._owner_sizes: dict[tuple[str, m.Owner], int | None] = {}
        self._out: list[Event] = []
        self._inbox: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self._halt = threading.Event()
        self.appended = 0
        self.resync_s = resync_s
        """How often the pods are listed in full and compared with what intake said."""
        self.reconciler = None if ledger is None else Reconciler(ledger)

    # ------------------------------------------------------------------ output

    def _emit(self, event: Event) -> None:
        self._out.append(event)
        self.said.fold(event)

    def flush(self) -> None:
        """Append what the last batch of watch events produced, then save the watch state."""
        at = wall_ms()
        self.sink.commit([wrap(e, at) for e in self._out], self._position())
        self.appended += len(self._out)
        self._out = []

    def close(self) -> None:
        """Stop the watch threads and release the intake writer (lock or producer)."""
        self._halt.set()
        self.sink.close()
        if self.reconciler is not None:
            self.reconciler.close()

    # ------------------------------------------------------------------ queues and nodes

    def on_queue(self, etype: str, obj: Obj) -> None:
        """A Queue was added, changed or deleted."""
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.bindings.pop(name, None)
            if name in self.said.queues:
                self._emit(QueueRemoved(queue=name))
        else:
            try:
                event = m.queue_configured(obj)
                namespaces = m.queue_namespaces(obj)
            except (ValueError, ArithmeticError, TypeError, AttributeError) as exc:
                self._bad_queue(obj, f"Queue {name} is invalid: {exc}")
                return
            why = self._queue_problem(event)
            if why:
                self._bad_queue(obj, why)
                return
            self.bad_queues.pop(name, None)
            self.bindings[name] = namespaces
            if self.said.queues.get(name) != event:
                self._emit(event)
        self.parents = {q.parent for q in self.said.queues.values() if q.parent}

    def _queue_problem(self, q: QueueConfigured) -> str | None:
        """Why a Queue cannot enter the ledger as it stands (its parent), or None."""
        if not q.parent:
            return None
        if q.parent == q.queue:
            return f"Queue {q.queue} names itself as its parent"
        seen = {q.queue}
        parent: QueueConfigured | None = self.said.queues.get(q.parent)
        if parent is None:
            return f"Queue {q.queue}: parent queue {q.parent!r} does not exist"
        while parent is not None and parent.parent:
            if parent.queue in seen or parent.parent == q.queue:
                return f"Queue {q.queue}: parent {q.parent!r} would make a cycle"
            seen.add(parent.queue)
            parent = self.said.queues.get(parent.parent)
        return None

    def _bad_queue(self, obj: Obj, reason: str) -> None:
        """A Queue that cannot enter the ledger: a Warning Event on it, once per reason."""
        name = obj["metadata"]["name"]
        if self.bad_queues.get(name) == reason:
            return
        self.bad_queues[name] = reason
        log.warning("%s", reason)
        emit_event(
            self.core,
            obj,
            "InvalidQueue",
            reason,
            component=COMPONENT,
            warning=True,
            kind="Queue",
            api_version=f"{m.QUEUE_GROUP}/{m.QUEUE_VERSION}",
        )

    def on_node(self, etype: str, obj: Obj) -> None:
        """A node was added, changed (capacity, labels, taints, cordon) or deleted."""
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            if name in self.said.nodes:
                self._emit(NodeRemoved(node=name))
            return
        event = m.node_registered(obj)
        if self.said.nodes.get(name) != event:
            self._emit(event)
        cordoned = m.node_cordoned(obj)
        if self.said.cordoned.get(name, False) != cordoned:
            self._emit(NodeCordoned(node=name, cordoned=cordoned))

    def sync(self, kind: str, items: list[Obj]) -> None:
        """A full list: objects missing from it were deleted while nobody watched."""
        if kind == "queue":
            # Parents before children, so a child configured in the same list finds its parent.
            items = _parents_first(items)
        if kind == "pod":
            # Deletions first: a pod re-created under a used name is then a new job.
            uids = {(o["metadata"].get("uid") or "") for o in items}
            for uid in [u for u in self.uids if u not in uids]:
                job, pod = self.uids.pop(uid)
                self.kept.pop(uid, None)
                self._gone(job, pod, "")
            for waiting in self.late.values():
                for uid in [u for u in waiting if u not in uids]:
                    del waiting[uid]
        handler = {"queue": self.on_queue, "node": self.on_node, "pod": self.on_pod}[kind]
        for obj in items:
            handler("ADDED", obj)
        if kind == "queue":
            names = {o["metadata"]["name"] for o in items}
            for name in sorted(set(self.said.queues) - names):
                self._emit(QueueRemoved(queue=name))
        elif kind == "node":
            names = {o["metadata"]["name"] for o in items}
            for name in sorted(set(self.said.nodes) - names):
                self._emit(NodeRemoved(node=name))

    # ------------------------------------------------------------------ pods

    def _restore(self, saved: dict[str, Any], submitted: dict[str, tuple[str, str]]) -> None:
        """Resume from a saved position and the pod UIDs of the ``submitted`` jobs (read
        from intake): gangs being assembled and which job each pod is.

        ``submitted`` names every pod ever submitted, live or not: the first full list of
        pods (at every start) drops those gone, as it would a pod deleted while nobody
        watched (``sync``)."""
        gangs = saved.get("gangs") or {}
        assert isinstance(gangs, dict)
        self.gangs: dict[str, dict[str, Obj]] = gangs
        uids = saved.get("uids") or {}
        assert isinstance(uids, dict)
        kept = {str(u): (str(j), str(p)) for u, (j, p) in uids.items()}
        self.uids: dict[str, tuple[str, str]] = dict(submitted)
        """pod uid → (job id, pod name) of every pod this ingestor has placed in a job."""
        for job, gang in gangs.items():
            for pod, entry in gang.items():
                if entry.get("uid"):
                    self.uids[str(entry["uid"])] = (job, pod)
        self.uids.update(kept)  # an older position held every uid; it agrees with the above
        self.kept: dict[str, tuple[str, str]] = {
            u: key for u, key in kept.items() if key[0] in self.said.closed
        }
        """The entries of ``uids`` no intake record names: pods of jobs the ingestor
        rejected (a ``JobRejected`` names no pod). Saved with the position."""
        self.late: dict[str, dict[str, Obj]] = {}
        """Per job base id, pods that came while the current job of that name still ran."""
        self.bad_queues: dict[str, str] = {}
        """Queues refused, with the reason last told in an Event."""
        for job in self.gangs:
            self.said._generation(job)

    def _position(self) -> dict[str, Any]:
        """What a restart needs beyond the intake records: see ``_restore``."""
        return {
            "pods_rv": self.pods_rv,
            "gangs": self.gangs,
            "uids": self.kept,  # the sink copies it (sorted, tuples as lists)
        }

    def _read_owner(self, ns: str, owner: m.Owner) -> Obj:
        if owner.kind == "Job":
            return raw(self.batch.read_namespaced_job, owner.name, ns)
        group, version, plural = (
            (m.JOBSET_GROUP, m.JOBSET_VERSION, m.JOBSET_PLURAL)
            if owner.kind == "JobSet"
            else (m.PYTORCHJOB_GROUP, m.PYTORCHJOB_VERSION, m.PYTORCHJOB_PLURAL)
        )
        return raw(self.custom.get_namespaced_custom_object, group, version, ns, plural, owner.name)

    def _owner_size(self, ns: str, owner: m.Owner) -> int | None:
        """The gang size an owner object defines, read once (None: absent or unreadable).

        404 (the CRD is not installed, or the object is gone) and 403 (not allowed) mean the
        owner does not define the gang, and are remembered. Transient errors are retried a
        few times; if they persist the owner is passed over for this pod only.
        """
        key = (ns, owner)
        if key in self._owner_sizes:
            return self._owner_sizes[key]
        what = f"reading {owner.kind} {ns}/{owner.name}"
        try:
            size = retry(
                lambda: m.owner_members(owner, self._read_owner(ns, owner)),
                what=what,
                attempts=3,
                transient=is_transient,
                backoff=Backoff(0.2, 0.4),
            )
        except ApiException as exc:
            if exc.status not in (403, 404):
                log.warning("%s: %s", what, exc.reason)
                return None
            size = None
        except Exception as exc:
            log.warning("%s: %s", what, exc)
            return None
        self._owner_sizes[key] = size
        return size

    def _identity(self, pod: Obj) -> m.PodIdentity:
        """The pod's base job id and gang size; ValueError naming a field it cannot read."""
        ns = pod["metadata"].get("namespace") or "default"
        owner, size = m.gang_owner(pod, lambda o: self._owner_size(ns, o))
        return m.pod_identity(pod, size, owner=owner)

    def _assign(self, base: str, name: str) -> str | None:
        """The job a new pod object named ``name`` of job ``base`` joins (None: it came
        while a job of that name still runs and must wait for it to end)."""
        gen = self.said.generation.get(base, 0)
        current = job_id(base, gen) if gen else None
        if current is not None and current in self.gangs:
            return current  # still being assembled (a re-created member replaces its entry)
        if current is not None and current in self.said.jobs and not self.said.ended(current):
            if name not in self.said.jobs[current]:
                return None  # a member beyond the submitted gang
            if (current, name) not in self.said.deleted:
                # Names are unique while an object lives, so this is the pod already taken
                # in, seen again after a restart that lost its uid: not a new job.
                return current
            # The same name after the pod was deleted: re-created, it starts a new job.
        self.said.generation[base] = gen + 1
        return job_id(base, gen + 1)

    def _reject_pod(self, pod: Obj, job: str, queue: str, reason: str) -> None:
        meta = pod["metadata"]
        ns = meta.get("namespace") or "default"
        self._emit(JobRejected(job=job, queue=queue, namespace=ns, reason=reason))
        emit_event(
            self.core,
            (ns, meta["name"], meta.get("uid", "")),
            "Rejected",
            f"gpuledger rejected job {job}: {reason}",
            component=COMPONENT,
            warning=True,
        )

    def on_pod(self, etype: str, pod: Obj) -> None:
        """A gpuledger pod was added, changed or deleted."""
        meta = pod["metadata"]
        uid, name = str(meta.get("uid") or ""), str(meta["name"])
        if etype == "DELETED":
            known = self.uids.pop(uid, None)
            self.kept.pop(uid, None)
            for late in self.late.values():
                late.pop(uid, None)
            if known is not None:
                self._gone(known[0], known[1], m.pod_node(pod))
            return
        known = self.uids.get(uid)
        if known is None:
            if meta.get("deletionTimestamp"):
                return  # going away before it was ever taken in
            try:
                ident = self._identity(pod)
            except ValueError as exc:
                ns = meta.get("namespace") or "default"
                base = f"{ns}/{name}"
                rejected = self._assign(base, name) or base
                self.uids[uid] = self.kept[uid] = (rejected, name)
                self._reject_pod(pod, rejected, m.pod_queue(pod, ""), f"invalid pod {name}: {exc}")
                return
            assigned = self._assign(ident.job, name)
            if assigned is None:
                self.late.setdefault(ident.job, {})[uid] = pod
                log.info("pod %s waits for the running job %s to end", name, ident.job)
                return
            job = assigned
            self.uids[uid] = (job, name)
        else:
            job = known[0]
            ident = None
        if job in self.said.closed:
            return
        if job not in self.said.jobs:
            if ident is None:
                try:
                    ident = self._identity(pod)
                except ValueError:
                    return  # it was read before; a later edit of the annotation is ignored
            self._gather(pod, job, ident)
            return
        phase, key = m.pod_phase(pod), (job, name)
        if phase in ("Running", "Succeeded", "Failed") and key not in self.said.started:
            self._emit(PodStarted(job=job, pod=name))
        if phase in ("Succeeded", "Failed") and key not in self.said.finished:
            self._emit(PodFinished(job=job, pod=name, succeeded=phase == "Succeeded"))
            self._retry_late(job)

    def _gone(self, job: str, name: str, node: str) -> None:
        """A pod of ``job`` was deleted from the cluster."""
        gang = self.gangs.get(job)
        if gang is not None and job not in self.said.jobs:
            gang.pop(name, None)
            if not gang:
                del self.gangs[job]
            return
        key = (job, name)
        if (
            job in self.said.jobs
            and job not in self.said.closed
            and name in self.said.jobs[job]
            and key not in self.said.finished
            and key not in self.said.deleted
        ):
            self._emit(PodDeleted(job=job, pod=name, node=node, reason="deleted from the cluster"))
        self._retry_late(job)

    def _retry_late(self, job: str) -> None:
        """Once a job has ended, pods that came for its name meanwhile start the next one."""
        base, _ = split_generation(job)
        if base in self.late and self.said.ended(job):
            for pod in list(self.late.pop(base).values()):
                self.on_pod("ADDED", pod)

    def _gather(self, pod: Obj, job: str, ident: m.PodIdentity) -> None:
        meta = pod["metadata"]
        default = m.default_queue(ident.namespace, self.bindings, self.parents)
        entry: Obj = {
            "ns": ident.namespace,
            "uid": meta.get("uid", ""),
            "queue": m.pod_queue(pod, default),
        }
        try:
            entry["class"] = m.pod_priority_class(pod)
            entry["preemptible"] = m.pod_preemptible(pod)
            entry["spec"] = msgspec.to_builtins(m.pod_spec(pod))
        except ValueError as exc:
            entry["error"] = str(exc)
        gang = self.gangs.setdefault(job, {})
        joined = ident.pod not in gang or gang[ident.pod].get("uid") != entry["uid"]
        gang[ident.pod] = entry
        if len(gang) >= ident.min_members:
            self._submit(job, self.gangs.pop(job), ident.min_members)
        elif joined:
            emit_event(
                self.core,
                (ident.namespace, ident.pod, entry["uid"]),
                "WaitingForGang",
                f"waiting for gang members: {len(gang)} of {ident.min_members} "
                f"(min-member {ident.min_members}), job {job}",
                component=COMPONENT,
            )

    def _submit(self, job: str, gang: dict[str, Obj], min_members: int) -> None:
        names = sorted(gang)
        first = gang[names[0]]
        ns, queue_name = first["ns"], first["queue"]
        queues = {e["queue"] for e in gang.values()}
        errors = [f"{n}: {gang[n]['error']}" for n in names if "error" in gang[n]]
        if errors:
            reason = "invalid pod: " + "; ".join(errors)
        elif len(queues) > 1:
            reason = f"pods of one job name different queues: {sorted(queues)}"
        elif not queue_name:
            reason = f"no queue named and none bound to namespace {ns!r}"
        else:
            reason = m.admit(ns, queue_name, self.bindings) or ""
        if reason:
            self._emit(JobRejected(job=job, queue=queue_name, namespace=ns, reason=reason))
            for n in names:
                if gang[n]["uid"]:
                    self.kept[gang[n]["uid"]] = (job, n)
                emit_event(
                    self.core,
                    (ns, n, gang[n]["uid"]),
                    "Rejected",
                    f"gpuledger rejected job {job}: {reason}",
                    component=COMPONENT,
                    warning=True,
                )
            return
        pods = tuple(msgspec.convert(gang[n]["spec"], PodSpec) for n in names)
        self._emit(
            JobSubmitted(
                job=job,
                queue=queue_name,
                pods=pods,
                min_members=min_members if min_members > 1 else 0,
                priority_class=first["class"],
                preemptible=first["preemptible"],
            )
        )

    # ------------------------------------------------------------------ the loop

    def _list(self, kind: str) -> tuple[list[Obj], str]:
        if kind == "queue":
            data = raw(
                self.custom.list_cluster_custom_object,
                m.QUEUE_GROUP,
                m.QUEUE_VERSION,
                m.QUEUE_PLURAL,
            )
        elif kind == "node":
            data = raw(self.core.list_node)
        else:
            data = raw(
                self.core.list_pod_for_all_namespaces,
                field_selector=f"spec.schedulerName={m.SCHEDULER_NAME}",
            )
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def _watch_call(self, kind: str) -> Callable[..., Any]:
        if kind == "queue":
            return lambda **kw: self.custom.list_cluster_custom_object(
                m.QUEUE_GROUP, m.QUEUE_VERSION, m.QUEUE_PLURAL, **kw
            )
        if kind == "node":
            return self.core.list_node
        return lambda **kw: self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.schedulerName={m.SCHEDULER_NAME}", **kw
        )

    def _watcher(self, kind: str, rv: str) -> None:
        backoff = Backoff(0.2, 10.0)
        delays = backoff.delays()
        listed_at = time.monotonic()
        while not self._halt.is_set():
            try:
                if kind == "pod" and time.monotonic() - listed_at > self.resync_s:
                    rv = ""  # the periodic full comparison with the API server
                if not rv:
                    items, rv = self._list(kind)
                    listed_at = time.monotonic()
                    self._inbox.put((kind, "SYNC", (items, rv)))
                # A watch call returns within its timeout, so the periodic list is on time.
                timeout = 30 if kind != "pod" else max(1, min(30, round(self.resync_s)))
                for event in watch(self._watch_call(kind), rv, timeout_s=timeout):
                    if self._halt.is_set():
                        return
                    obj = event["object"]
                    rv = str(obj["metadata"]["resourceVersion"])
                    self._inbox.put((kind, event["type"], obj))
                delays = backoff.delays()  # a watch that ran: the next failure waits briefly
            except Gone:
                log.info("%s watch expired (410 Gone); re-listing", kind)
                rv = ""
            except Exception as exc:
                if not is_transient(exc):
                    log.exception("%s watch failed", kind)
                time.sleep(next(delays))

    def start(self) -> None:
        """List Queues and nodes, then start the three watch threads."""
        rvs: dict[str, str] = {}
        for kind in ("queue", "node"):
            items, rvs[kind] = self._list(kind)
            self.sync(kind, items)
        self.flush()
        # Pods are listed afresh at every start (rv ""), then every ``resync_s``: what the
        # API server holds is compared with what intake said, and every difference (a pod
        # deleted while nobody watched, a phase change missed) becomes a fact.
        for kind, rv in (("queue", rvs["queue"]), ("node", rvs["node"]), ("pod", "")):
            threading.Thread(
                target=self._watcher, args=(kind, rv), name=f"watch-{kind}", daemon=True
            ).start()

    def handle(self, kind: str, etype: str, payload: Any) -> None:
        """Apply one message from a watch thread."""
        if etype == "SYNC":
            items, rv = payload
            self.sync(kind, items)
            if kind == "pod":
                self.pods_rv = rv
                if self.reconciler is not None:
                    for event in self.reconciler.compare(items):
                        key = (getattr(event, "job", ""), getattr(event, "pod", ""))
                        if not (isinstance(event, PodDeleted) and key in self.said.deleted):
                            self._emit(event)
            return
        if etype == "BOOKMARK":
            if kind == "pod":
                self.pods_rv = str(payload["metadata"]["resourceVersion"])
            return
        {"queue": self.on_queue, "node": self.on_node, "pod": self.on_pod}[kind](etype, payload)
        if kind == "pod":
            self.pods_rv = str(payload["metadata"]["resourceVersion"])

    def run(self, stop: Callable[[], bool] = lambda: False, *, batch_max: int = 500) -> None:
        """Start, then apply watch events in batches (one append each) until ``stop()``."""
        self.start()
        try:
            while not stop():
                items: list[tuple[str, str, Any]] = []
                try:
                    items.append(self._inbox.get(timeout=0.2))
                    while len(items) < batch_max:
                        items.append(self._inbox.get_nowait())
                except queue.Empty:
                    pass
                if not items:
                    continue
                for kind, etype, payload in items:
                    self.handle(kind, etype, payload)
                self.flush()
        finally:
            self.close()
