"""The Kubernetes adapters against a real kube-apiserver (scripts/k8s.sh) with kwok nodes."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import duckdb
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from events.codec import decode_event
from events.filelog import LedgerDirReader
from projections.projector import project
from scheduler.fold.verify import run as replay_run
from scheduler.kube.client import raw
from tests.kubeharness import (
    ROOT,
    Cluster,
    apply_manifest,
    gpuledger,
    wait_established,
    wait_until,
)

pytestmark = pytest.mark.integration


def ledger_events(path: Path) -> list[tuple[int, object]]:
    return [(o, decode_event(e, o)) for o, e in LedgerDirReader(path).read()]


def count(events: list[tuple[int, object]], tag: str) -> collections.Counter[tuple[str, ...]]:
    c: collections.Counter[tuple[str, ...]] = collections.Counter()
    for _, e in events:
        if type(e).__name__ == tag:
            c[(getattr(e, "job", ""), getattr(e, "pod", ""))] += 1
    return c


def wait_recorded(ledger: Path, tag: str, pods: int, timeout: float = 30) -> None:
    """Wait until the ledger holds ``tag`` events for at least ``pods`` distinct pods."""
    wait_until(
        lambda: len(count(ledger_events(ledger), tag)) >= pods,
        timeout,
        f"{tag} of {pods} pods in the ledger",
        detail=lambda: sorted(count(ledger_events(ledger), tag)),
    )


def test_end_to_end_three_queues_gangs_singles_tenancy(cluster: Cluster, tmp_path: Path) -> None:
    ns = [cluster.namespace(n) for n in ("e2e-a", "e2e-b", "e2e-c")]
    cluster.nodes("e2e-gpu", 3, gpus=8)
    cluster.queue("team-a", [ns[0]], quota=8)
    cluster.queue("team-b", [ns[1]], quota=8)
    cluster.queue("team-c", [ns[2]], quota=8)
    with gpuledger(cluster, tmp_path) as procs:
        # A gang: submitted once all four members are seen.
        cluster.gang(ns[0], "llm", 4, gpus=2, duration="3s")
        for i in range(3):
            cluster.pod(ns[1], f"nb-{i}", gpus=1, duration="2s")
        cluster.pod(ns[1], "frac", gpus=0, fraction="0.5", duration="2s")
        cluster.gang(ns[2], "ddp", 2, gpus=4, duration="2s")
        cluster.pod(ns[2], "sneaky", gpus=1, queue="team-a")  # ns e2e-c is not bound to team-a

        def all_done() -> bool:
            ph = {**cluster.phases(ns[0]), **cluster.phases(ns[1]), **cluster.phases(ns[2])}
            return all(v == "Succeeded" for k, v in ph.items() if k != "sneaky")

        wait_until(all_done, 60, "all admitted pods to succeed")
        wait_until(lambda: cluster.events(ns[2], "Rejected"), 10, "a Rejected event")
        wait_recorded(tmp_path / "ledger", "PodFinished", 10)
    for name, p in procs.items():
        assert "Traceback" not in p.log(), f"{name}:\n{p.log()}"
    assert cluster.phases(ns[2])["sneaky"] == "Pending"
    assert "not bound to queue" in cluster.events(ns[2], "Rejected")[0]["message"]
    assert cluster.events(ns[0], "Scheduled")
    ledger = tmp_path / "ledger"
    events = ledger_events(ledger)
    rejected = [e for _, e in events if type(e).__name__ == "JobRejected"]
    assert [(e.job, e.queue) for e in rejected] == [("e2e-c/sneaky", "team-a")]
    assert "e2e-c/sneaky" not in {
        getattr(e, "job", "") for _, e in events if type(e).__name__ == "PodsAllocated"
    }
    submitted = count(events, "JobSubmitted")
    assert {j for j, _ in submitted} == {
        "e2e-a/llm",
        "e2e-b/nb-0",
        "e2e-b/nb-1",
        "e2e-b/nb-2",
        "e2e-b/frac",
        "e2e-c/ddp",
    }
    assert all(n == 1 for n in submitted.values())
    assert sum(count(events, "PodBound").values()) == 10
    assert sum(count(events, "PodFinished").values()) == 10
    result = replay_run(LedgerDirReader(ledger))
    assert result.ok, result.mismatch and result.mismatch.diff()
    db = tmp_path / "p.duckdb"
    project(LedgerDirReader(ledger), db)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT job, time_to_ready_s FROM jobs ORDER BY job").fetchall()
    ready = dict(rows)
    assert ready["e2e-a/llm"] is not None and ready["e2e-a/llm"] >= 0
    assert all(ready[j] is not None for j, _ in submitted)


def test_reclaim_evicts_through_eviction_api_with_events(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.namespace("rc-a"), cluster.namespace("rc-b")
    cluster.nodes("rc-gpu", 1, gpus=8)
    cluster.queue("rc-team-a", [a], quota=4)
    cluster.queue("rc-team-b", [b], quota=4)
    with gpuledger(cluster, tmp_path) as procs:
        for i in range(4):  # team-a borrows the whole node: over its quota of 4
            cluster.pod(a, f"hog-{i}", gpus=2, duration=None)
        wait_until(lambda: list(cluster.phases(a).values()).count("Running") == 4, 30, "hogs")
        cluster.pod(b, "claim", gpus=4, group="claim", min_member=1, duration=None)
        wait_until(lambda: cluster.phases(b).get("claim") == "Running", 40, "reclaimer running")
        preempted = cluster.events(a, "Preempted")
        preempting = cluster.events(b, "Preempting")
        wait_recorded(tmp_path / "ledger", "PodEvicted", 2)
        wait_until(lambda: len(cluster.phases(a)) <= 2, 30, "the evicted hogs deleted")
    for name, p in procs.items():
        assert "Traceback" not in p.log(), f"{name}:\n{p.log()}"
    assert preempted and all(
        "rc-b/claim" in e["message"] and "rc-team-b" in e["message"] and "reclaim" in e["message"]
        for e in preempted
    )
    assert preempting and "reclaim" in preempting[0]["message"]
    remaining = cluster.phases(a)
    assert len(remaining) == 2, remaining  # two 2-GPU victims were evicted (and deleted)
    events = ledger_events(tmp_path / "ledger")
    jp = [e for _, e in events if type(e).__name__ == "JobPreempted"]
    assert {e.rule for e in jp} == {"reclaim"} and {e.preemptor for e in jp} == {"rc-b/claim"}
    assert sum(count(events, "PodEvicted").values()) == 2
    assert replay_run(LedgerDirReader(tmp_path / "ledger")).ok


def test_gangs_from_jobset_and_pytorchjob_owners(cluster: Cluster, tmp_path: Path) -> None:
    """One gang per JobSet / PyTorchJob, sized from the owner's spec, bound all-or-nothing;
    pods naming a PyTorchJob that does not exist fall back to the label rules (singles)."""
    for crd, name in (
        ("jobset-crd.yaml", "jobsets.jobset.x-k8s.io"),
        ("pytorchjob-crd.yaml", "pytorchjobs.kubeflow.org"),
    ):
        apply_manifest(cluster.api, ROOT / "tests/data/kube" / crd)
        wait_established(cluster.api, name)
    ns = cluster.namespace("og")
    for group, version, plural in (
        ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
        ("kubeflow.org", "v1", "pytorchjobs"),
    ):  # left by an earlier run (no finalizers: gone at once)
        cluster.custom.delete_collection_namespaced_custom_object(group, version, ns, plural)
    cluster.nodes("og-gpu", 2, gpus=8)
    cluster.queue("og-team", [ns], quota=16)
    jobset = cluster.custom.create_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        ns,
        "jobsets",
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "ft"},
            "spec": {
                "replicatedJobs": [
                    {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
                    {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2}}},
                ]
            },
        },
    )
    bert = cluster.pytorchjob(ns, "bert", workers=3)
    js_pods = ["ft-driver-0-0"] + [f"ft-workers-{j}-{i}" for j in range(2) for i in range(2)]
    bert_pods = ["bert-master-0"] + [f"bert-worker-{i}" for i in range(3)]
    with gpuledger(cluster, tmp_path) as procs:
        for name in js_pods:  # 5 pods × 2 GPUs: one gang of 5 (1×1 + 2×2)
            rjob = name.split("-")[1]
            labels = {
                "jobset.sigs.k8s.io/jobset-name": "ft",
                "jobset.sigs.k8s.io/replicatedjob-name": rjob,
            }
            cluster.pod(ns, name, gpus=2, duration="4s", labels=labels, owner=jobset)
        for i in range(2):  # no such PyTorchJob: each pod is its own job
            labels = {"training.kubeflow.org/job-name": "ghost"}
            cluster.pod(ns, f"ghost-{i}", gpus=1, duration="1s", labels=labels)
        wait_until(
            lambda: all(cluster.phases(ns).get(p) == "Running" for p in js_pods), 30, "JobSet"
        )
        # 4 pods × 4 GPUs fill both nodes: none may be bound while the JobSet holds 10.
        for name in bert_pods:
            replica = "master" if "master" in name else "worker"
            labels = {
                "training.kubeflow.org/job-name": "bert",
                "training.kubeflow.org/replica-type": replica,
            }
            cluster.pod(ns, name, gpus=4, duration="2s", labels=labels, owner=bert)

        def done() -> bool:
            return all(v == "Succeeded" for v in cluster.phases(ns).values())

        wait_until(done, 60, "every pod to succeed")
        wait_recorded(tmp_path / "ledger", "PodFinished", len(js_pods) + 2 + len(bert_pods))
    for name, p in procs.items():
        assert "Traceback" not in p.log(), f"{name}:\n{p.log()}"
    events = ledger_events(tmp_path / "ledger")
    submitted = {e.job: e for _, e in events if type(e).__name__ == "JobSubmitted"}
    assert set(submitted) == {"og/ft", "og/bert", "og/ghost-0", "og/ghost-1"}
    assert sum(count(events, "JobSubmitted").values()) == 4  # once each
    ft, bj = submitted["og/ft"], submitted["og/bert"]
    assert (ft.min_members, sorted(p.name for p in ft.pods)) == (5, sorted(js_pods))
    assert (bj.min_members, sorted(p.name for p in bj.pods)) == (4, sorted(bert_pods))
    assert submitted["og/ghost-0"].min_members == 0  # a single pod
    allocs = collections.defaultdict(list)
    for offset, e in events:
        if type(e).__name__ == "PodsAllocated":
            allocs[e.job].append((offset, len(e.placements)))
    assert [n for _, n in allocs["og/ft"]] == [5] and [n for _, n in allocs["og/bert"]] == [4]
    ft_done = max(o for o, e in events if type(e).__name__ == "PodFinished" and e.job == "og/ft")
    assert allocs["og/bert"][0][0] > ft_done  # all-or-nothing: no bert pod in the 6 free GPUs
    assert sum(count(events, "PodBound").values()) == 11
    assert replay_run(LedgerDirReader(tmp_path / "ledger")).ok


def test_failed_eviction_holds_the_gpus_and_is_retried(cluster: Cluster, tmp_path: Path) -> None:
    """A PodDisruptionBudget answers every eviction with 429: after bounded retries the
    binder records EvictionFailed and a Warning Event; the ledger holds the victim's GPUs
    again, so the preemptor is not bound onto them; once the budget allows it, the binder's
    retry evicts the victim and the preemptor is bound."""
    a, b = cluster.namespace("ef-a"), cluster.namespace("ef-b")
    cluster.nodes("ef-gpu", 1, gpus=8)
    cluster.queue("ef-team-a", [a], quota=4)
    cluster.queue("ef-team-b", [b], quota=4)
    policy = client.PolicyV1Api(cluster.api)
    policy.create_namespaced_pod_disruption_budget(
        a,
        {
            "metadata": {"name": "hog"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "hog"}}},
        },
    )
    pdb = True
    try:
        with gpuledger(cluster, tmp_path) as procs:
            cluster.pod(a, "hog", gpus=8, duration=None, labels={"app": "hog"})  # over quota
            wait_until(lambda: cluster.phases(a).get("hog") == "Running", 30, "the hog")
            cluster.pod(b, "claim", gpus=4, duration=None)  # reclaims its quota of 4

            def recorded() -> bool:
                return any(
                    type(e).__name__ == "EvictionFailed"
                    for _, e in ledger_events(tmp_path / "ledger")
                )

            wait_until(recorded, 40, "EvictionFailed in the ledger")
            warnings = wait_until(
                lambda: cluster.events(a, "EvictionFailed"), 10, "the EvictionFailed Event"
            )
            # intentional: an absence window; for 2 s the claim must not be bound onto the
            # GPUs the victim still holds (checked just below)
            time.sleep(2)
            assert cluster.phases(a)["hog"] == "Running"  # the API kept it
            claim = raw(cluster.core.read_namespaced_pod, "claim", b)
            assert not claim["spec"].get("nodeName"), "bound onto GPUs the victim still holds"
            state = replay_run(LedgerDirReader(tmp_path / "ledger")).state
            assert set(state.held.get("ef-a/hog", {})) == {"hog"}
            assert state.nodes["ef-gpu-0"].free_gpu_milli == 0
            policy.delete_namespaced_pod_disruption_budget("hog", a)
            pdb = False
            wait_until(lambda: "hog" not in cluster.phases(a), 60, "the retried eviction")
            wait_until(
                lambda: raw(cluster.core.read_namespaced_pod, "claim", b)["spec"].get("nodeName"),
                30,
                "the preemptor bound once the victim is gone",
            )
            wait_recorded(tmp_path / "ledger", "PodEvicted", 1)
            wait_recorded(tmp_path / "ledger", "PodBound", 2)  # the hog, then the claim
    finally:
        if pdb:
            policy.delete_namespaced_pod_disruption_budget("hog", a)
    for name, p in procs.items():
        assert "Traceback" not in p.log(), f"{name}:\n{p.log()}"
    events = ledger_events(tmp_path / "ledger")
    assert [e.job for _, e in events if type(e).__name__ == "JobPreempted"] == ["ef-a/hog"]
    failed = [e for _, e in events if type(e).__name__ == "EvictionFailed"]
    assert [(e.job, e.pod, e.node) for e in failed] == [("ef-a/hog", "hog", "ef-gpu-0")]
    assert "429" in failed[0].reason and "disruption budget" in failed[0].reason
    assert "gave up after" in failed[0].reason
    assert len(failed[0].gpus) == 8
    assert [e.pod for _, e in events if type(e).__name__ == "PodEvicted"] == ["hog"]
    assert warnings and warnings[0]["type"] == "Warning"
    assert replay_run(LedgerDirReader(tmp_path / "ledger")).ok


@pytest.mark.parametrize("who", ["binder", "ingestor"])
def test_service_account_rights_are_least_privilege(cluster_session: Cluster, who: str) -> None:
    from scheduler.kube.client import api_client

    kcfg = (
        cluster_session.binder_kubeconfig
        if who == "binder"
        else cluster_session.ingestor_kubeconfig
    )
    api = api_client(str(kcfg))
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    cluster_session.nodes(f"rbac-{who}", 1)
    try:
        with pytest.raises(ApiException) as exc:
            core.delete_node(f"rbac-{who}-0")
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            core.list_namespaced_secret("gpuledger-system")
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod(
                "default",
                {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
            )
        assert exc.value.status == 403
        if who == "ingestor":  # reads, never binds
            with pytest.raises(ApiException) as exc:
                core.create_namespaced_pod_binding(
                    "x",
                    "default",
                    {"metadata": {"name": "x"}, "target": {"kind": "Node", "name": "n"}},
                )
            assert exc.value.status == 403
            # It may get a JobSet or PyTorchJob (gang sizes), never list, change or delete one.
            for group, version, plural in (
                ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
                ("kubeflow.org", "v1", "pytorchjobs"),
            ):
                with pytest.raises(ApiException) as exc:
                    custom.list_namespaced_custom_object(group, version, "default", plural)
                assert exc.value.status == 403, plural
                with pytest.raises(ApiException) as exc:
                    custom.delete_namespaced_custom_object(group, version, "default", plural, "x")
                assert exc.value.status == 403, plural
        else:  # binds, never lists
            with pytest.raises(ApiException) as exc:
                core.list_pod_for_all_namespaces()
            assert exc.value.status == 403
            with pytest.raises(ApiException) as exc:
                custom.get_namespaced_custom_object(
                    "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "x"
                )
            assert exc.value.status == 403
    finally:
        cluster_session.core.delete_node(f"rbac-{who}-0")


def test_restarts_lose_and_duplicate_nothing(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.tenant("rs", 2, queue="rs-team")
    n = 36
    with gpuledger(cluster, tmp_path) as procs:
        for i in range(n):
            cluster.pod(ns, f"job-{i:02d}", gpus=2, duration="1s")
            if i in (8, 20):
                procs["ingest"].kill()
                procs["bind"].kill()
                time.sleep(0.3)  # intentional: down for a moment, as after a crash
                procs["ingest"].start()
                procs["bind"].start()
            if i == 14:
                procs["schedule"].kill()
                procs["schedule"].start()
        wait_until(
            lambda: list(cluster.phases(ns).values()).count("Succeeded") == n,
            90,
            "all pods to succeed",
        )
        wait_recorded(tmp_path / "ledger", "PodFinished", n)
    events = ledger_events(tmp_path / "ledger")
    jobs = {f"rs/job-{i:02d}" for i in range(n)}
    for tag in ("JobSubmitted",):
        c = count(events, tag)
        assert {j for j, _ in c} == jobs and set(c.values()) == {1}, (tag, c)
    for tag in ("PodBound", "PodStarted", "PodFinished"):
        c = count(events, tag)
        assert len(c) == n and set(c.values()) == {1}, (tag, c)
    assert not count(events, "BindFailed")
    assert replay_run(LedgerDirReader(tmp_path / "ledger")).ok
