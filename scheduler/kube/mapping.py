"""Kubernetes objects → gpuledger events: pure functions over the API's plain dicts.

No I/O and no policy: these only translate fields (quantities to integer units, labels
and annotations to event fields). Objects are the JSON-shaped dicts the API returns
(``ApiClient.sanitize_for_serialization`` of the client's models, or raw JSON), so the same
code serves watch events and tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from events.ledgertime import parse_duration_ms
from events.model import (
    MILLI,
    NodeRegistered,
    PodSpec,
    QueueConfigured,
    Resources,
)

SCHEDULER_NAME = "gpuledger"
"""Pods with ``spec.schedulerName: gpuledger`` are ours."""
GPU_RESOURCE = "nvidia.com/gpu"
DOMAIN = "gpuledger.io"
QUEUE_LABEL = f"{DOMAIN}/queue"
POD_GROUP_LABEL = f"{DOMAIN}/pod-group"
MIN_MEMBER_ANNOTATION = f"{DOMAIN}/min-member"
GPU_FRACTION_ANNOTATION = f"{DOMAIN}/gpu-fraction"
GPU_MEMORY_ANNOTATION = f"{DOMAIN}/gpu-memory"
PRIORITY_CLASS_ANNOTATION = f"{DOMAIN}/priority-class"
PREEMPTIBLE_ANNOTATION = f"{DOMAIN}/preemptible"
GPU_SLOTS_ANNOTATION = f"{DOMAIN}/gpu-slots"
"""Written by the binder before binding: ``device:milli`` pairs, e.g. ``0:1000,1:1000``."""
JOB_ANNOTATION = f"{DOMAIN}/job"
"""Written by the binder: the ledger's job id, so Events and people can find the job."""

QUEUE_GROUP = "scheduling.gpuledger.io"
QUEUE_VERSION = "v1alpha1"
QUEUE_PLURAL = "queues"

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
PYTORCHJOB_GROUP = "kubeflow.org"
PYTORCHJOB_VERSION = "v1"
PYTORCHJOB_PLURAL = "pytorchjobs"
PYTORCHJOB_NAME_LABEL = "training.kubeflow.org/job-name"
PYTORCHJOB_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"

Obj = dict[str, Any]

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
}


def quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2", "16Gi", 1.5) as an exact Decimal."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a resource quantity: {value!r}")
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        raise ValueError(f"not a resource quantity: {value!r}") from None


def milli(value: object) -> int:
    """A quantity in thousandths (CPU cores → millicores, GPUs → milli-GPUs), rounded up."""
    return int((quantity(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def mib(value: object) -> int:
    """A memory quantity in MiB, rounded up."""
    return int((quantity(value) / (2**20)).to_integral_value(rounding="ROUND_CEILING"))


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _labels(obj: Obj) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def _annotations(obj: Obj) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


# --------------------------------------------------------------------------- pods


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """Summed container requests (limits where a request is absent), as the scheduler sees them."""
    total: dict[str, Decimal] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = dict(res.get("limits") or {})
        asked.update(res.get("requests") or {})
        for name, q in asked.items():
            total[name] = total.get(name, Decimal(0)) + quantity(q)
    return total


def pod_spec(pod: Obj) -> PodSpec:
    """The ``PodSpec`` of a pod: GPUs, CPU, memory, node selector, tolerations."""
    req = pod_requests(pod)
    ann = _annotations(pod)
    gpus = req.get(GPU_RESOURCE, Decimal(0))
    if gpus < 0 or gpus != gpus.to_integral_value():
        raise ValueError(f"resource {GPU_RESOURCE}: {gpus} is not a whole number of GPUs")
    gpu_milli = int(gpus * MILLI)
    if not gpu_milli and GPU_FRACTION_ANNOTATION in ann:
        try:
            gpu_milli = milli(ann[GPU_FRACTION_ANNOTATION])
        except ValueError:
            gpu_milli = 0
        if not 0 < gpu_milli < MILLI:
            raise ValueError(
                f"annotation {GPU_FRACTION_ANNOTATION}: {ann[GPU_FRACTION_ANNOTATION]!r} is not "
                "a fraction of one GPU (between 0 and 1)"
            )
    gpu_memory = 0
    if GPU_MEMORY_ANNOTATION in ann:
        try:
            gpu_memory = mib(ann[GPU_MEMORY_ANNOTATION])
        except ValueError:
            gpu_memory = -1
        if gpu_memory <= 0:
            raise ValueError(
                f"annotation {GPU_MEMORY_ANNOTATION}: {ann[GPU_MEMORY_ANNOTATION]!r} is not a "
                "memory quantity (e.g. 20Gi)"
            )
    spec = pod.get("spec") or {}
    tolerations = []
    for t in spec.get("tolerations") or []:
        key = t.get("key") or ""
        if not key:
            continue
        value = t.get("value")
        tolerations.append(f"{key}={value}" if value and t.get("operator") != "Exists" else key)
    return PodSpec(
        name=_meta(pod)["name"],
        uid=str(_meta(pod).get("uid") or ""),
        gpu_milli=gpu_milli,
        cpu_milli=int((req.get("cpu", Decimal(0)) * 1000).to_integral_value("ROUND_CEILING")),
        memory_mib=int(
            (req.get("memory", Decimal(0)) / (2**20)).to_integral_value("ROUND_CEILING")
        ),
        node_selector=dict(spec.get("nodeSelector") or {}),
        gpu_memory_mib=gpu_memory,
        tolerations=tuple(sorted(tolerations)),
    )


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Which ledger job a pod belongs to, and how big its gang is."""

    namespace: str
    job: str
    """``namespace/group`` for a gang, ``namespace/pod`` for a single pod."""
    pod: str
    min_members: int
    """Pods of the group that must be seen before the job is submitted (1: submit at once)."""


def owner_job(pod: Obj) -> str | None:
    """Name of the batch/v1 Job that owns the pod, if any."""
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref["name"])
    return None


@dataclass(frozen=True, slots=True)
class Owner:
    """A workload object that may define a pod's gang: ``JobSet``, ``PyTorchJob`` or ``Job``."""

    kind: str
    name: str


def pod_owners(pod: Obj) -> list[Owner]:
    """The workloads a pod belongs to, the one defining the largest gang first.

    A JobSet's pods carry its name in a label (they are owned by one batch Job per replicated
    job, which comes next); a PyTorchJob's pods carry its name in a label and own it
    directly; a plain Job owns its pods.
    """
    labels = _labels(pod)
    owners: list[Owner] = []
    if labels.get(JOBSET_NAME_LABEL):
        owners.append(Owner("JobSet", labels[JOBSET_NAME_LABEL]))
    pytorch = labels.get(PYTORCHJOB_NAME_LABEL) or ""
    for ref in _meta(pod).get("ownerReferences") or []:
        api_version = str(ref.get("apiVersion", ""))
        if ref.get("kind") == "PyTorchJob" and api_version.startswith(f"{PYTORCHJOB_GROUP}/"):
            pytorch = pytorch or str(ref["name"])
    if pytorch:
        owners.append(Owner("PyTorchJob", pytorch))
    job = owner_job(pod)
    if job:
        owners.append(Owner("Job", job))
    return owners


def _count(value: object, default: int = 1) -> int:
    return default if value is None else max(int(str(value)), 0)


def job_members(job: Obj) -> int | None:
    """Pods a batch/v1 Job runs at once: ``parallelism`` (None when unset)."""
    value = (job.get("spec") or {}).get("parallelism")
    return None if value is None else _count(value)


def jobset_members(jobset: Obj) -> int:
    """A JobSet's gang size: the sum over ``replicatedJobs`` of ``replicas`` × pods per Job.

    Pods per Job are its ``parallelism`` (default 1), capped by ``completions`` when set.
    """
    total = 0
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job_spec = ((rj.get("template") or {}).get("spec")) or {}
        per_job = _count(job_spec.get("parallelism"))
        if job_spec.get("completions") is not None:
            per_job = min(per_job, _count(job_spec["completions"]))
        total += _count(rj.get("replicas")) * per_job
    return total


def pytorchjob_members(job: Obj) -> int:
    """A PyTorchJob's gang size: ``runPolicy.schedulingPolicy.minAvailable`` when set, else
    the ``replicas`` (default 1) of its ``Master`` and ``Worker`` replica specs."""
    spec = job.get("spec") or {}
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy") or {}
    if policy.get("minAvailable") is not None:
        return _count(policy["minAvailable"])
    replicas = spec.get("pytorchReplicaSpecs") or {}
    return sum(
        _count((replicas[t] or {}).get("replicas")) for t in ("Master", "Worker") if t in replicas
    )


def owner_members(owner: Owner, obj: Obj) -> int | None:
    """The gang size an owner object defines (None: it does not say)."""
    if owner.kind == "JobSet":
        return jobset_members(obj) or None
    if owner.kind == "PyTorchJob":
        return pytorchjob_members(obj) or None
    return job_members(obj)


def gang_owner(pod: Obj, members: Callable[[Owner], int | None]) -> tuple[Owner | None, int | None]:
    """The owner defining the pod's gang, and its size, given a lookup of owner sizes.

    The first of ``pod_owners`` whose size ``members`` can tell wins. A JobSet or
    PyTorchJob that cannot be read (its CRD is not installed, the object is gone) is passed
    over, so the pod falls back to its batch Job (group by Job name, size from
    ``parallelism`` when known) or, without one, to the label and annotation rules.
    A pod-group label overrides every owner: None is returned without a lookup.
    """
    if _labels(pod).get(POD_GROUP_LABEL):
        return None, None
    for owner in pod_owners(pod):
        size = members(owner)
        if size is not None or owner.kind == "Job":
            return owner, size
    return None, None


def pod_identity(
    pod: Obj, owner_size: int | None = None, *, owner: Owner | None = None
) -> PodIdentity:
    """The job a pod belongs to: its pod-group label, else its owner, else itself.

    ``owner`` is the workload defining the gang (see ``gang_owner``; by default the batch
    Job owning the pod). ``min_members`` comes from the min-member annotation, else the
    owner's size (``owner_size``, looked up by the caller), else 1.
    """
    meta = _meta(pod)
    ns, name = meta.get("namespace") or "default", meta["name"]
    labels, ann = _labels(pod), _annotations(pod)
    if owner is None:
        job = owner_job(pod)
        owner = Owner("Job", job) if job else None
    group = labels.get(POD_GROUP_LABEL) or (owner.name if owner else "")
    if not group:
        return PodIdentity(ns, f"{ns}/{name}", name, 1)
    if MIN_MEMBER_ANNOTATION in ann:
        text = str(ann[MIN_MEMBER_ANNOTATION]).strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"annotation {MIN_MEMBER_ANNOTATION}: {ann[MIN_MEMBER_ANNOTATION]!r} is not a "
                "whole number of pods (1 or more)"
            )
        minimum = int(text)
    elif owner_size is not None and POD_GROUP_LABEL not in labels:
        minimum = owner_size
    else:
        minimum = 1
    return PodIdentity(ns, f"{ns}/{group}", name, max(minimum, 1))


def pod_queue(pod: Obj, default: str) -> str:
    """The queue a pod asks for (its queue label), else the namespace's default."""
    return _labels(pod).get(QUEUE_LABEL) or default


PRIORITY_CLASS_NAMES = ("train", "build-preemptible", "build", "inference")
"""The priority classes the priority-class annotation accepts (or a whole number)."""
_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")


def pod_priority_class(pod: Obj) -> str:
    """The gpuledger priority class: annotation, else ``spec.priorityClassName``, else train.

    The annotation must name one of ``PRIORITY_CLASS_NAMES`` or be a whole number
    (ValueError otherwise, naming the accepted values); a Kubernetes PriorityClass name that
    is not one of ours counts as ``train``.
    """
    ann = _annotations(pod)
    if PRIORITY_CLASS_ANNOTATION in ann:
        value = str(ann[PRIORITY_CLASS_ANNOTATION]).strip()
        if value in PRIORITY_CLASS_NAMES or value.isdigit():
            return value
        raise ValueError(
            f"annotation {PRIORITY_CLASS_ANNOTATION}: {ann[PRIORITY_CLASS_ANNOTATION]!r} is not "
            f"one of {', '.join(PRIORITY_CLASS_NAMES)} (or a whole number)"
        )
    name = (pod.get("spec") or {}).get("priorityClassName") or ""
    return name if name in PRIORITY_CLASS_NAMES else "train"


def pod_preemptible(pod: Obj) -> bool | None:
    """The preemptible annotation, or None to default from the class.

    ``true``/``yes``/``1`` or ``false``/``no``/``0`` (any case); ValueError otherwise.
    """
    value = _annotations(pod).get(PREEMPTIBLE_ANNOTATION)
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(
        f"annotation {PREEMPTIBLE_ANNOTATION}: {value!r} is not true or false "
        f"(accepted: {', '.join(_TRUE + _FALSE)})"
    )


def pod_phase(pod: Obj) -> str:
    """``status.phase`` (Pending when absent)."""
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_node(pod: Obj) -> str:
    """``spec.nodeName`` (empty when unbound)."""
    return str((pod.get("spec") or {}).get("nodeName") or "")


# --------------------------------------------------------------------------- nodes


def node_registered(node: Obj) -> NodeRegistered:
    """A node's allocatable GPUs, CPU, memory, labels and taints as ``NodeRegistered``."""
    status = node.get("status") or {}
    alloc = dict(status.get("capacity") or {})
    alloc.update(status.get("allocatable") or {})
    labels = _labels(node)
    taints = []
    for t in (node.get("spec") or {}).get("taints") or []:
        kv = f"{t['key']}={t['value']}" if t.get("value") else t["key"]
        taints.append(f"{kv}:{t.get('effect', 'NoSchedule')}")
    gpu_memory = labels.get("nvidia.com/gpu.memory")
    return NodeRegistered(
        node=_meta(node)["name"],
        gpus=int(quantity(alloc.get(GPU_RESOURCE, 0))),
        gpu_model=labels.get("nvidia.com/gpu.product", ""),
        gpu_memory_mib=int(gpu_memory) if gpu_memory and gpu_memory.isdigit() else 0,
        cpu_milli=milli(alloc.get("cpu", 0)),
        memory_mib=mib(alloc.get("memory", 0)),
        labels=dict(sorted(labels.items())),
        taints=tuple(sorted(taints)),
    )


def node_cordoned(node: Obj) -> bool:
    """``spec.unschedulable``."""
    return bool((node.get("spec") or {}).get("unschedulable"))


# --------------------------------------------------------------------------- queues


def _duration_ms(value: object) -> int:
    """A Go-style duration ("90s", "5m", "1h30m") or a number of seconds, in ms."""
    if value is None or value == "":
        return 0
    if isinstance(value, int | float):
        return int(value * 1000)
    try:
        return parse_duration_ms(str(value))
    except ValueError:
        raise ValueError(f"not a duration: {value!r}") from None


def _resource(spec: Obj, name: str) -> Obj:
    res: Obj = (spec.get("resources") or {}).get(name) or {}
    return res


def queue_configured(queue: Obj) -> QueueConfigured:
    """A ``Queue`` custom resource as ``QueueConfigured`` (KAI field meanings).

    ``resources.<gpu|cpu|memory>.quota`` is the deserved share (GPUs in devices, CPU in
    millicores, memory in MiB; -1 or absent: none), ``limit`` the hard cap (-1: none) and
    ``overQuotaWeight`` the weight for sharing what is left over (GPU's is used).
    """
    spec = queue.get("spec") or {}
    gpu, cpu, mem = (_resource(spec, r) for r in ("gpu", "cpu", "memory"))

    def quota(r: Obj, scale: int) -> int:
        q = r.get("quota", 0)
        return 0 if q is None or Decimal(str(q)) < 0 else int(Decimal(str(q)) * scale)

    def limit(r: Obj, scale: int) -> int:
        q = r.get("limit", -1)
        return -1 if q is None or Decimal(str(q)) < 0 else int(Decimal(str(q)) * scale)

    return QueueConfigured(
        queue=_meta(queue)["name"],
        parent=spec.get("parentQueue") or "",
        deserved=Resources(
            gpu_milli=quota(gpu, MILLI), cpu_milli=quota(cpu, 1), memory_mib=quota(mem, 1)
        ),
        over_quota_weight=int(gpu.get("overQuotaWeight", 1)),
        limit=Resources(
            gpu_milli=limit(gpu, MILLI), cpu_milli=limit(cpu, 1), memory_mib=limit(mem, 1)
        ),
        priority=int(spec.get("priority", 0)),
        preempt_min_runtime_ms=_duration_ms(spec.get("preemptMinRuntime")),
        reclaim_min_runtime_ms=_duration_ms(spec.get("reclaimMinRuntime")),
    )


def queue_namespaces(queue: Obj) -> tuple[str, ...]:
    """Namespaces allowed to submit to the queue (``spec.namespaces``; none when absent)."""
    return tuple(sorted((queue.get("spec") or {}).get("namespaces") or ()))


def admit(namespace: str, queue: str, bindings: dict[str, tuple[str, ...]]) -> str | None:
    """Tenancy admission: None if ``namespace`` may submit to ``queue``, else the reason."""
    if queue not in bindings:
        return f"queue {queue!r} does not exist"
    if namespace not in bindings[queue]:
        return f"namespace {namespace!r} is not bound to queue {queue!r}"
    return None


def default_queue(namespace: str, bindings: dict[str, tuple[str, ...]], parents: set[str]) -> str:
    """The namespace's default queue: the first leaf queue (by name) bound to it, else ""."""
    for name in sorted(bindings):
        if namespace in bindings[name] and name not in parents:
            return name
    return ""
