"""Kubernetes object → event mapping, without a cluster."""

from __future__ import annotations

import pytest

from events.model import PodSpec, Resources
from scheduler.kube import mapping as m


def pod(name: str = "p", **kw: object) -> dict[str, object]:
    meta = {
        "name": name,
        "namespace": "ns",
        "labels": kw.pop("labels", {}),
        "annotations": kw.pop("annotations", {}),
    }
    if "owner" in kw:
        meta["ownerReferences"] = [
            {"kind": "Job", "apiVersion": "batch/v1", "name": kw.pop("owner")}
        ]
    return {
        "metadata": meta,
        "spec": {"schedulerName": "gpuledger", "containers": kw.pop("containers", [])},
    }


def test_quantities() -> None:
    assert m.milli("500m") == 500 and m.milli("2") == 2000 and m.milli(1.5) == 1500
    assert m.mib("1Gi") == 1024 and m.mib("1G") == 954 and m.mib("512Mi") == 512
    with pytest.raises(ValueError, match="not a resource quantity"):
        m.quantity("lots")


def test_pod_spec_whole_and_fractional_gpus() -> None:
    c = [
        {
            "name": "a",
            "resources": {
                "limits": {"nvidia.com/gpu": "2"},
                "requests": {"cpu": "1500m", "memory": "2Gi"},
            },
        },
        {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
    ]
    assert m.pod_spec(pod(containers=c)) == PodSpec(
        name="p", gpu_milli=2000, cpu_milli=2000, memory_mib=2048
    )
    frac = pod(annotations={"gpuledger.io/gpu-fraction": "0.25"})
    assert m.pod_spec(frac).gpu_milli == 250
    with pytest.raises(ValueError, match="gpu-fraction"):
        m.pod_spec(pod(annotations={"gpuledger.io/gpu-fraction": "1.5"}))


def test_identity_from_group_label_owner_job_or_pod() -> None:
    g = pod(
        "w-0",
        labels={"gpuledger.io/pod-group": "llm"},
        annotations={"gpuledger.io/min-member": "4"},
    )
    assert m.pod_identity(g) == m.PodIdentity("ns", "ns/llm", "w-0", 4)
    assert m.pod_identity(pod("j-x", owner="train"), owner_size=3) == m.PodIdentity(
        "ns", "ns/train", "j-x", 3
    )
    assert m.pod_identity(pod("solo")) == m.PodIdentity("ns", "ns/solo", "solo", 1)


def jobset_pod(name: str, jobset: str = "ft", rjob: str = "workers") -> dict[str, object]:
    """A pod as the JobSet controller makes it: labelled, owned by the child batch Job."""
    labels = {m.JOBSET_NAME_LABEL: jobset, m.JOBSET_REPLICATED_JOB_LABEL: rjob}
    return pod(name, labels=labels, owner=f"{jobset}-{rjob}-0")


def pytorch_pod(name: str, job: str = "bert", replica: str = "worker") -> dict[str, object]:
    p = pod(name, labels={m.PYTORCHJOB_NAME_LABEL: job, m.PYTORCHJOB_REPLICA_TYPE_LABEL: replica})
    meta = p["metadata"]
    assert isinstance(meta, dict)
    meta["ownerReferences"] = [{"kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1", "name": job}]
    return p


def test_gang_sizes_of_jobsets_and_pytorchjobs() -> None:
    jobset = {
        "spec": {
            "replicatedJobs": [
                {"name": "driver", "template": {"spec": {}}},  # 1 Job × 1 pod
                {"name": "workers", "replicas": 3, "template": {"spec": {"parallelism": 2}}},
                {
                    "name": "capped",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 4, "completions": 3}},
                },
            ]
        }
    }
    assert m.jobset_members(jobset) == 1 + 3 * 2 + 2 * 3
    assert m.owner_members(m.Owner("JobSet", "x"), {"spec": {}}) is None  # says nothing
    pt = {
        "spec": {
            "pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}},
        }
    }
    assert m.pytorchjob_members(pt) == 4
    assert m.pytorchjob_members({"spec": {"pytorchReplicaSpecs": {"Worker": {}}}}) == 1
    pt["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 2}}
    assert m.pytorchjob_members(pt) == 2
    assert m.owner_members(m.Owner("Job", "j"), {"spec": {"parallelism": 5}}) == 5
    assert m.owner_members(m.Owner("Job", "j"), {"spec": {}}) is None


def test_gang_owner_prefers_jobset_and_pytorchjob_and_falls_back() -> None:
    js = jobset_pod("ft-workers-0-0")
    assert m.pod_owners(js) == [m.Owner("JobSet", "ft"), m.Owner("Job", "ft-workers-0")]
    sizes = {m.Owner("JobSet", "ft"): 7, m.Owner("Job", "ft-workers-0"): 2}
    owner, size = m.gang_owner(js, sizes.get)
    assert (owner, size) == (m.Owner("JobSet", "ft"), 7)
    assert m.pod_identity(js, size, owner=owner) == m.PodIdentity(
        "ns", "ns/ft", "ft-workers-0-0", 7
    )
    # JobSet CRD absent (or the object gone): the pod falls back to its batch Job.
    owner, size = m.gang_owner(js, {m.Owner("Job", "ft-workers-0"): 2}.get)
    assert (owner, size) == (m.Owner("Job", "ft-workers-0"), 2)
    assert m.pod_identity(js, size, owner=owner).job == "ns/ft-workers-0"

    pt = pytorch_pod("bert-worker-1")
    assert m.pod_owners(pt) == [m.Owner("PyTorchJob", "bert")]
    owner, size = m.gang_owner(pt, {m.Owner("PyTorchJob", "bert"): 4}.get)
    assert m.pod_identity(pt, size, owner=owner) == m.PodIdentity(
        "ns", "ns/bert", "bert-worker-1", 4
    )
    # PyTorchJob absent and no other owner: the label/annotation rules, i.e. the pod alone.
    assert m.gang_owner(pt, lambda o: None) == (None, None)
    assert m.pod_identity(pt, None, owner=None) == m.PodIdentity(
        "ns", "ns/bert-worker-1", "bert-worker-1", 1
    )
    # A pod-group label and min-member annotation beat every owner, without a lookup.
    grouped = pytorch_pod("bert-master-0")
    meta = grouped["metadata"]
    assert isinstance(meta, dict)
    meta["labels"][m.POD_GROUP_LABEL] = "g"
    meta["annotations"][m.MIN_MEMBER_ANNOTATION] = "3"

    def no_lookup(o: m.Owner) -> int | None:
        raise AssertionError(o)

    assert m.gang_owner(grouped, no_lookup) == (None, None)
    assert m.pod_identity(grouped).job == "ns/g" and m.pod_identity(grouped).min_members == 3
    # The min-member annotation also overrides an owner's size.
    js_ann = jobset_pod("ft-driver-0-0", rjob="driver")
    meta = js_ann["metadata"]
    assert isinstance(meta, dict)
    meta["annotations"][m.MIN_MEMBER_ANNOTATION] = "2"
    assert m.pod_identity(js_ann, 7, owner=m.Owner("JobSet", "ft")).min_members == 2


def test_error_text_names_the_status_message() -> None:
    from kubernetes.client.exceptions import ApiException

    from scheduler.kube.client import error_text

    exc = ApiException(status=429, reason="Too Many Requests")
    exc.body = b'{"kind":"Status","message":"Cannot evict pod as it would violate the budget."}'
    assert error_text(exc) == (
        "ApiException 429 Too Many Requests: Cannot evict pod as it would violate the budget."
    )
    assert error_text(ConnectionError("refused")) == "ConnectionError: refused"


def test_queue_mapping_and_tenancy() -> None:
    q = {
        "metadata": {"name": "team-a"},
        "spec": {
            "parentQueue": "org",
            "priority": 2,
            "namespaces": ["b", "a"],
            "preemptMinRuntime": "5m",
            "resources": {
                "gpu": {"quota": 8, "limit": 16, "overQuotaWeight": 3},
                "cpu": {"quota": -1},
            },
        },
    }
    qc = m.queue_configured(q)
    assert qc.parent == "org" and qc.priority == 2 and qc.over_quota_weight == 3
    assert qc.deserved == Resources(gpu_milli=8000) and qc.limit == Resources(16000, -1, -1)
    assert qc.preempt_min_runtime_ms == 300_000
    bindings = {"team-a": m.queue_namespaces(q), "org": ()}
    assert m.admit("a", "team-a", bindings) is None
    assert "not bound" in (m.admit("c", "team-a", bindings) or "")
    assert "does not exist" in (m.admit("a", "nope", bindings) or "")
    assert m.default_queue("b", bindings, {"org"}) == "team-a"


def test_node_mapping() -> None:
    n = {
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "H100"}},
        "spec": {"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "256Gi"}},
    }
    ev = m.node_registered(n)
    assert (ev.gpus, ev.gpu_model, ev.cpu_milli, ev.memory_mib, ev.taints) == (
        8,
        "H100",
        64000,
        262144,
        ("gpu=x:NoSchedule",),
    )
