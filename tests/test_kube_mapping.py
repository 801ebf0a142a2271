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
    assert m.pod_identity(pod("j-x", owner="train"), owner_parallelism=3) == m.PodIdentity(
        "ns", "ns/train", "j-x", 3
    )
    assert m.pod_identity(pod("solo")) == m.PodIdentity("ns", "ns/solo", "solo", 1)


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
