"""The ingestor: Kubernetes pods, nodes and Queues → intake events.

It watches pods with ``spec.schedulerName: gpuledger``, all nodes and ``Queue`` custom
resources, and appends to its own intake ledger ``INTAKE/ingest/``:

* ``NodeRegistered`` / ``NodeCordoned`` / ``NodeRemoved`` when a node's capacity, labels,
  taints or cordon change (heartbeats that change nothing record nothing);
* ``QueueConfigured`` / ``QueueRemoved`` for ``Queue`` objects;
* ``JobSubmitted`` once a job's pods are all there: a gang (pod-group label, or an owner:
  a JobSet, a PyTorchJob or a batch Job, see ``mapping.gang_owner``) is submitted when
  ``min-member`` pods of it have been seen, with the pods seen by then (members created
  after that are not scheduled: re-create the group to grow it);
* ``JobRejected`` instead, with a Warning Event on the pods, when the pods' namespace is
  not bound to the queue they name (tenancy admission);
* ``PodStarted`` / ``PodFinished`` from pod phase changes;
* ``JobCancelled`` when an unfinished pod of a submitted job is deleted (the job can no
  longer run as submitted; a controller re-creating the pods makes a new submission).

Idempotence. What the ingestor has already said is derived at start-up from its own intake
ledger, so re-seeing an object (a restart, a re-list after "410 Gone") never duplicates an
event. The pod watch's resourceVersion and the gangs still being assembled are kept in
``INTAKE/ingest.state.json``, written after each append: a restart resumes the watch there,
and anything between that snapshot and the ledger's end is recognised as already recorded.
Nodes and Queues are re-listed at every start (they are few; tenancy needs them in memory).
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
from events.filelog import FileLedger, LedgerDirReader
from events.model import (
    Event,
    JobCancelled,
    JobRejected,
    JobSubmitted,
    NodeCordoned,
    NodeRegistered,
    NodeRemoved,
    PodFinished,
    PodSpec,
    PodStarted,
    QueueConfigured,
    QueueRemoved,
)
from scheduler.embedded import open_source, read_json, wall_ms, write_json_atomic
from scheduler.kube import mapping as m
from scheduler.kube.client import Gone, Obj, emit_event, is_transient, raw, watch

log = logging.getLogger(__name__)

SOURCE = "ingest"
COMPONENT = "gpuledger-ingestor"


@dataclass(slots=True)
class _Said:
    """What the intake ledger already holds (derived from it at start-up)."""

    jobs: dict[str, frozenset[str]] = field(default_factory=dict)
    started: set[tuple[str, str]] = field(default_factory=set)
    finished: set[tuple[str, str]] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    nodes: dict[str, NodeRegistered] = field(default_factory=dict)
    cordoned: dict[str, bool] = field(default_factory=dict)
    queues: dict[str, QueueConfigured] = field(default_factory=dict)

    def fold(self, event: Event) -> None:
        match event:
            case JobSubmitted(job=job, pods=pods):
                self.jobs[job] = frozenset(p.name for p in pods)
            case JobRejected(job=job) | JobCancelled(job=job):
                self.closed.add(job)
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


class Ingestor:
    """Watches the API and appends intake events; see the module docstring."""

    def __init__(self, api: client.ApiClient, intake: str | Path) -> None:
        """Open ``INTAKE/ingest/`` (taking its writer lock) and derive what it already says."""
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.intake = Path(intake)
        self.writer: FileLedger = open_source(self.intake, SOURCE)
        self.state_path = self.intake / f"{SOURCE}.state.json"
        self.said = _Said()
        for offset, env in LedgerDirReader(self.intake / SOURCE).read():
            try:
                self.said.fold(decode_event(env, offset))
            except UnknownEventType:
                continue
        saved = read_json(self.state_path) or {}
        self.pods_rv: str = str(saved.get("pods_rv") or "")
        gangs = saved.get("gangs") or {}
        assert isinstance(gangs, dict)
        self.gangs: dict[str, dict[str, Obj]] = gangs
        self.bindings: dict[str, tuple[str, ...]] = {}
        self.parents: set[str] = set()
        self._owner_sizes: dict[tuple[str, m.Owner], int | None] = {}
        self._out: list[Event] = []
        self._inbox: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self._halt = threading.Event()
        self.appended = 0

    # ------------------------------------------------------------------ output

    def _emit(self, event: Event) -> None:
        self._out.append(event)
        self.said.fold(event)

    def flush(self) -> None:
        """Append what the last batch of watch events produced, then save the watch state."""
        if self._out:
            at = wall_ms()
            self.writer.append([wrap(e, at) for e in self._out])
            self.appended += len(self._out)
            self._out = []
        write_json_atomic(self.state_path, {"pods_rv": self.pods_rv, "gangs": self.gangs})

    def close(self) -> None:
        """Stop the watch threads and release the intake writer lock."""
        self._halt.set()
        self.writer.close()

    # ------------------------------------------------------------------ queues and nodes

    def on_queue(self, etype: str, obj: Obj) -> None:
        """A Queue was added, changed or deleted."""
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.bindings.pop(name, None)
            if name in self.said.queues:
                self._emit(QueueRemoved(queue=name))
        else:
            event = m.queue_configured(obj)
            self.bindings[name] = m.queue_namespaces(obj)
            if self.said.queues.get(name) != event:
                self._emit(event)
        self.parents = {q.parent for q in self.said.queues.values() if q.parent}

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
        else:
            present = {(self._identity(o).job, o["metadata"]["name"]) for o in items}
            for job, pods in sorted(self.said.jobs.items()):
                if job in self.said.closed:
                    continue
                if any(
                    (job, p) not in present and (job, p) not in self.said.finished for p in pods
                ):
                    self._emit(JobCancelled(job=job))
            for job, gang in list(self.gangs.items()):
                for pod in [p for p in gang if (job, p) not in present]:
                    del gang[pod]
                if not gang:
                    del self.gangs[job]

    # ------------------------------------------------------------------ pods

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
        for attempt in range(3):
            try:
                size = m.owner_members(owner, self._read_owner(ns, owner))
                break
            except ApiException as exc:
                if exc.status in (403, 404):
                    size = None
                    break
                if not is_transient(exc) or attempt == 2:
                    log.warning("reading %s %s/%s: %s", owner.kind, ns, owner.name, exc.reason)
                    return None
            except Exception as exc:
                if not is_transient(exc) or attempt == 2:
                    log.warning("reading %s %s/%s: %s", owner.kind, ns, owner.name, exc)
                    return None
            time.sleep(0.2 * (attempt + 1))
        self._owner_sizes[key] = size
        return size

    def _identity(self, pod: Obj) -> m.PodIdentity:
        ns = pod["metadata"].get("namespace", "default")
        owner, size = m.gang_owner(pod, lambda o: self._owner_size(ns, o))
        return m.pod_identity(pod, size, owner=owner)

    def on_pod(self, etype: str, pod: Obj) -> None:
        """A gpuledger pod was added, changed or deleted."""
        ident = self._identity(pod)
        job, name = ident.job, ident.pod
        if etype == "DELETED":
            gang = self.gangs.get(job)
            if gang is not None and job not in self.said.jobs:
                gang.pop(name, None)
                if not gang:
                    del self.gangs[job]
            elif (
                job in self.said.jobs
                and job not in self.said.closed
                and name in self.said.jobs[job]
                and (job, name) not in self.said.finished
            ):
                self._emit(JobCancelled(job=job))
            return
        if job in self.said.closed:
            return
        if job not in self.said.jobs:
            self._gather(pod, ident)
            if job not in self.said.jobs:
                return
        if name not in self.said.jobs[job]:
            log.info("pod %s joined job %s after it was submitted; not scheduled", name, job)
            return
        phase, key = m.pod_phase(pod), (job, name)
        if phase in ("Running", "Succeeded", "Failed") and key not in self.said.started:
            self._emit(PodStarted(job=job, pod=name))
        if phase in ("Succeeded", "Failed") and key not in self.said.finished:
            self._emit(PodFinished(job=job, pod=name, succeeded=phase == "Succeeded"))

    def _gather(self, pod: Obj, ident: m.PodIdentity) -> None:
        meta = pod["metadata"]
        default = m.default_queue(ident.namespace, self.bindings, self.parents)
        entry: Obj = {
            "ns": ident.namespace,
            "uid": meta.get("uid", ""),
            "queue": m.pod_queue(pod, default),
            "class": m.pod_priority_class(pod),
            "preemptible": m.pod_preemptible(pod),
            "min": ident.min_members,
        }
        try:
            entry["spec"] = msgspec.to_builtins(m.pod_spec(pod))
        except ValueError as exc:
            entry["error"] = str(exc)
        gang = self.gangs.setdefault(ident.job, {})
        gang[ident.pod] = entry
        if len(gang) >= ident.min_members:
            self._submit(ident.job, self.gangs.pop(ident.job), ident.min_members)

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
        delay = 0.2
        while not self._halt.is_set():
            try:
                if not rv:
                    items, rv = self._list(kind)
                    self._inbox.put((kind, "SYNC", (items, rv)))
                for event in watch(self._watch_call(kind), rv, timeout_s=30):
                    if self._halt.is_set():
                        return
                    obj = event["object"]
                    rv = str(obj["metadata"]["resourceVersion"])
                    self._inbox.put((kind, event["type"], obj))
                delay = 0.2
            except Gone:
                log.info("%s watch expired (410 Gone); re-listing", kind)
                rv = ""
            except Exception as exc:
                if not is_transient(exc):
                    log.exception("%s watch failed", kind)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def start(self) -> None:
        """List Queues and nodes, then start the three watch threads."""
        rvs: dict[str, str] = {}
        for kind in ("queue", "node"):
            items, rvs[kind] = self._list(kind)
            self.sync(kind, items)
        self.flush()
        for kind, rv in (("queue", rvs["queue"]), ("node", rvs["node"]), ("pod", self.pods_rv)):
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
