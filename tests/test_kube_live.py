"""The live deployment on Kafka and a real API server, as users run it, and under churn.

Ingestor, two scheduler replicas (active and standby), binder and projector run as separate
processes on one Kafka prefix, against a kube-apiserver with kwok GPU nodes. The churn test
drives a seeded random mix of what happens to clusters every day for ``CHURN_SECONDS``
(default 180) — pods and gangs created and deleted, one member of a running gang deleted,
nodes deleted and re-added, names re-used, poison annotations, Queue edits, and ``kill -9``
of each process in turn — and checks the API server itself after every step: no GPU device
bound to two live pods, no node with more GPUs bound than it has.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from kubernetes.client.exceptions import ApiException

from events.codec import decode_envelope, decode_event
from events.kafka_admin import KafkaSettings
from events.kafkalog import KafkaReader
from scheduler.fold.verify import run as replay_run
from scheduler.kube.client import raw
from tests.kafkakit import kafka, settings
from tests.kubeharness import ROOT, Cluster, Proc, apply_manifest, running, wait_established
from tests.kubeharness import wait_until as wait
from tests.test_kube_churn import assert_no_double_booking, live_pods
from tests.test_live_kafka import read_all

__all__ = ["kafka", "settings"]  # fixtures

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHURN_SECONDS = float(os.environ.get("GPULEDGER_CHURN_SECONDS", "180"))


@contextlib.contextmanager
def deployment(cluster: Cluster, s: KafkaSettings, work: Path) -> Iterator[dict[str, Proc]]:
    """The Kafka deployment: ingestor, active and standby scheduler, binder, projector."""
    url = f"kafka://{s.bootstrap}/{s.prefix}"
    sched = ["scheduler", "run", "--bootstrap", s.bootstrap, "--prefix", s.prefix]
    sched += ["--session-timeout-ms", "1500", "-v"]
    procs = {
        "ingest": Proc(
            "ingest",
            ["ingest", "--kubeconfig", str(cluster.ingestor_kubeconfig), "--intake", url],
            work,
        ),
        "scheduler-a": Proc("scheduler-a", sched, work, command=()),
        "scheduler-b": Proc("scheduler-b", sched, work, command=()),
        "bind": Proc(
            "bind",
            [
                *("bind", "--kubeconfig", str(cluster.binder_kubeconfig)),
                *("--ledger", url, "--intake", url),
            ],
            work,
        ),
        "project": Proc(
            "project",
            ["project", "--follow", url, "--db", str(work / "live.duckdb")],
            work,
            command=(),
        ),
    }
    with running(procs):
        yield procs


def ledger_events(s: KafkaSettings) -> list[Any]:
    out = []
    for offset, value, _ in read_all(s, s.ledger):
        with contextlib.suppress(Exception):
            out.append(decode_event(decode_envelope(value, offset), offset))
    return out


def node_of(cluster: Cluster, ns: str, name: str) -> str:
    try:
        return str(raw(cluster.core.read_namespaced_pod, name, ns)["spec"].get("nodeName") or "")
    except ApiException:
        return ""


def assert_replays_once(s: KafkaSettings) -> None:
    """The ledger replays with no mismatch and holds no fact about a pod twice."""
    with KafkaReader(s.bootstrap, s.ledger, security=s.security) as reader:
        result = replay_run(reader)
    assert result.ok, result.mismatch and result.mismatch.diff()
    seen: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for e in ledger_events(s):
        kind = type(e).__name__
        if kind in ("JobSubmitted", "PodBound", "PodStarted", "PodFinished", "PodDeleted"):
            seen[(kind, e.job, getattr(e, "pod", ""))] += 1
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"records twice in the ledger: {twice}"


def crd(cluster: Cluster) -> None:
    apply_manifest(cluster.api, ROOT / "tests/data/kube/pytorchjob-crd.yaml")
    wait_established(cluster.api, "pytorchjobs.kubeflow.org")


def test_end_to_end_on_kafka_with_standby_reclaim_and_projection(
    cluster: Cluster, settings: KafkaSettings, tmp_path: Path
) -> None:
    s = settings
    crd(cluster)
    a, b = cluster.namespace("lv-a"), cluster.namespace("lv-b")
    cluster.custom.delete_collection_namespaced_custom_object(
        "kubeflow.org", "v1", a, "pytorchjobs"
    )
    cluster.nodes("lv-gpu", 2, gpus=8)
    cluster.queue("lv-team-a", [a], quota=8)
    cluster.queue("lv-team-b", [b], quota=8)
    with deployment(cluster, s, tmp_path) as procs:
        for i in range(2):
            cluster.pod(a, f"single-{i}", gpus=1, duration="2s")
        cluster.gang(b, "grp", 2, gpus=2, duration="2s")
        bert = cluster.pytorchjob(a, "bert", workers=1)
        for name, role in (("bert-master-0", "master"), ("bert-worker-0", "worker")):
            labels = {
                "training.kubeflow.org/job-name": "bert",
                "training.kubeflow.org/replica-type": role,
            }
            cluster.pod(a, name, gpus=2, duration="2s", labels=labels, owner=bert)

        def succeeded(ns: str, names: list[str]) -> bool:
            phases = cluster.phases(ns)
            return all(phases.get(n) == "Succeeded" for n in names)

        wait(
            lambda: succeeded(a, ["single-0", "single-1", "bert-master-0", "bert-worker-0"]),
            90,
            "team a's pods to run and succeed",
        )
        wait(lambda: succeeded(b, ["grp-0", "grp-1"]), 60, "the pod-group gang")
        # The active scheduler dies: the standby takes over.
        active = next(n for n in ("scheduler-a", "scheduler-b") if "active after" in procs[n].log())
        procs[active].kill()
        # Team a borrows the whole cluster, then team b claims its quota: reclaim.
        for i in range(2):
            cluster.pod(a, f"hog-{i}", gpus=8, duration=None)
        wait(lambda: node_of(cluster, a, "hog-0") and node_of(cluster, a, "hog-1"), 60, "hogs")
        cluster.gang(b, "claim", 2, gpus=4, duration=None)
        wait(lambda: node_of(cluster, b, "claim-1"), 60, "team b's reclaiming gang bound")
        assert_no_double_booking(cluster)
        preempted = cluster.events(a, "Preempted")
        assert preempted and "by job lv-b/claim (queue lv-team-b)" in preempted[0]["message"]
        assert "rule reclaim" in preempted[0]["message"]
        # The projector has run past everything recorded so far (its log: "next offset N").
        last = max(offset for offset, _, _ in read_all(s, s.ledger))

        def projected() -> list[int]:
            return [int(n) for n in re.findall(r"next offset (\d+)", procs["project"].log())]

        wait(
            lambda: projected() and projected()[-1] > last,
            30,
            f"the projector past ledger offset {last}",
            detail=lambda: projected()[-3:],
        )
        for name, p in procs.items():
            if name != active:
                assert p.p is not None and p.p.poll() is None, f"{name} exited:\n{p.log()}"
            assert "Traceback" not in p.log(), f"{name}:\n{p.log()}"
    assert_replays_once(s)
    con = duckdb.connect(str(tmp_path / "live.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT queue, count(*), quantile_cont(time_to_ready_s, 0.5) FROM jobs "
        "WHERE time_to_ready_s IS NOT NULL GROUP BY queue ORDER BY queue"
    ).fetchall()
    ready = {q: (n, p50) for q, n, p50 in rows}
    assert set(ready) == {"lv-team-a", "lv-team-b"}, rows
    assert all(p50 >= 0 for _, p50 in ready.values())


def test_churn_keeps_the_books_true(
    cluster: Cluster, settings: KafkaSettings, tmp_path: Path
) -> None:
    s = settings
    rng = random.Random(14)
    ns = cluster.namespace("churn")
    nodes = cluster.nodes("churn-gpu", 4, gpus=8)
    quotas = {"churn-a": 16, "churn-b": 16}
    for q, quota in quotas.items():
        cluster.queue(q, [ns], quota=quota)
    removed: list[str] = []
    names: list[str] = []  # every pod name used, for re-creation
    poison: list[str] = []
    counter = 0
    steps: collections.Counter[str] = collections.Counter()

    def new_name(prefix: str) -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}-{counter}"

    def pod(name: str, gpus: int, queue: str = "", **kw: Any) -> None:
        cluster.pod(ns, name, gpus=gpus, queue=queue or rng.choice(list(quotas)), **kw)
        names.append(name)

    with deployment(cluster, s, tmp_path) as procs:
        order = ["ingest", "scheduler-a", "bind", "scheduler-b", "project"]
        deadline = time.monotonic() + CHURN_SECONDS
        step = 0
        while time.monotonic() < deadline:
            step += 1
            roll = rng.random()
            if step % 15 == 0:
                roll = 0.83  # each process is killed in turn, every 15th step
            live = [p["metadata"]["name"] for p in live_pods(cluster)]
            duration = f"{rng.randint(2, 8)}s"
            if roll < 0.25:
                steps["pod"] += 1
                pod(new_name("p"), rng.choice([1, 2, 4]), duration=duration)
            elif roll < 0.40:
                steps["gang"] += 1
                group, size, q = new_name("g"), rng.choice([2, 3]), rng.choice(list(quotas))
                for i in range(size):
                    pod(f"{group}-{i}", 2, q, group=group, min_member=size, duration=duration)
            elif roll < 0.50 and live:
                steps["delete pod"] += 1
                with contextlib.suppress(ApiException):
                    cluster.core.delete_namespaced_pod(rng.choice(live), ns, grace_period_seconds=0)
            elif roll < 0.58:
                gangs = [n for n in live if n.startswith("g-")]
                if gangs:
                    steps["delete gang member"] += 1
                    with contextlib.suppress(ApiException):
                        cluster.core.delete_namespaced_pod(
                            rng.choice(gangs), ns, grace_period_seconds=0
                        )
            elif roll < 0.64:
                if removed and rng.random() < 0.6:
                    steps["re-add node"] += 1
                    back = removed.pop()
                    with contextlib.suppress(ApiException):
                        cluster.core.delete_node(back)
                    cap = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
                    cluster.core.create_node(
                        {
                            "metadata": {"name": back, "labels": {"type": "kwok"}},
                            "status": {"allocatable": cap, "capacity": cap},
                        }
                    )
                elif len(removed) < 2:
                    steps["delete node"] += 1
                    gone = rng.choice([n for n in nodes if n not in removed])
                    removed.append(gone)
                    cluster.core.delete_node(gone)
            elif roll < 0.70 and names:
                steps["re-create name"] += 1
                name = rng.choice(names)
                with contextlib.suppress(ApiException):
                    cluster.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
                wait(lambda name=name: name not in cluster.phases(ns), 30, f"{name} deleted")
                # intentional: kwok finishes a deleted pod by name a moment later, which the
                # API does not show (test_kube_churn's re-created name)
                time.sleep(2)
                if not name.startswith("g-"):
                    pod(name, 1, duration=duration)
            elif roll < 0.75:
                steps["poison"] += 1
                bad = new_name("poison")
                poison.append(bad)
                cluster.core.create_namespaced_pod(
                    ns,
                    {
                        "metadata": {
                            "name": bad,
                            "labels": {"gpuledger.io/pod-group": bad},
                            "annotations": {
                                rng.choice(
                                    [
                                        "gpuledger.io/min-member",
                                        "gpuledger.io/preemptible",
                                        "gpuledger.io/priority-class",
                                        "gpuledger.io/gpu-fraction",
                                    ]
                                ): rng.choice(["abc", "maybe", "ultra", "-1"])
                            },
                        },
                        "spec": {
                            "schedulerName": "gpuledger",
                            "containers": [{"name": "c", "image": "x"}],
                        },
                    },
                )
            elif roll < 0.80:
                steps["queue edit"] += 1
                q = rng.choice(list(quotas))
                quotas[q] = rng.choice([8, 16, 24])
                cluster.custom.patch_cluster_custom_object(
                    "scheduling.gpuledger.io",
                    "v1alpha1",
                    "queues",
                    q,
                    {"spec": {"resources": {"gpu": {"quota": quotas[q]}}}},
                )
            elif roll < 0.86:
                steps["kill -9"] += 1
                victim = procs[order[steps["kill -9"] % len(order)]]
                victim.kill()
                time.sleep(rng.uniform(0.5, 2.0))  # intentional: down a while, as after a crash
                victim.start()
            assert_no_double_booking(cluster)
            time.sleep(rng.uniform(0.2, 0.8))  # intentional: the churn's pace between steps
        # Settle: nodes back, poison gone; every schedulable pod ends up bound or done.
        for back in removed:
            cap = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
            with contextlib.suppress(ApiException):
                cluster.core.create_node(
                    {
                        "metadata": {"name": back, "labels": {"type": "kwok"}},
                        "status": {"allocatable": cap, "capacity": cap},
                    }
                )
        for bad in poison:
            with contextlib.suppress(ApiException):
                cluster.core.delete_namespaced_pod(bad, ns, grace_period_seconds=0)

        def schedulable(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
            """Pods that can run: not poison, and not of a gang with fewer members left
            than its min-member (one of them deleted before the gang was complete)."""
            members = collections.Counter(
                (p["metadata"].get("labels") or {}).get("gpuledger.io/pod-group", "") for p in pods
            )
            out = []
            for p in pods:
                meta = p["metadata"]
                group = (meta.get("labels") or {}).get("gpuledger.io/pod-group", "")
                need = int((meta.get("annotations") or {}).get("gpuledger.io/min-member", "1"))
                if meta["name"] not in poison and (not group or members[group] >= need):
                    out.append(p)
            return out

        def settled() -> bool:
            assert_no_double_booking(cluster)
            pods = raw(cluster.core.list_namespaced_pod, ns)["items"]
            return all(
                p["spec"].get("nodeName") or p["status"].get("phase") in ("Succeeded", "Failed")
                for p in schedulable(pods)
            )

        try:
            wait(settled, 120, "every schedulable pod bound or finished")
        except AssertionError:
            pods = raw(cluster.core.list_namespaced_pod, ns)["items"]
            stuck = [
                (p["metadata"]["name"], p["metadata"].get("uid"), p["status"].get("phase"))
                for p in schedulable(pods)
                if not p["spec"].get("nodeName")
            ]
            raise AssertionError(f"never bound: {stuck}; prefix {s.prefix}") from None
        # intentional: an absence window; a component that fails on the settled cluster
        # would have exited by now (checked just below)
        time.sleep(2)
        for name, p in procs.items():
            assert p.p is not None and p.p.poll() is None, f"{name} exited:\n{p.log()[-3000:]}"
            assert "Traceback" not in p.log(), f"{name}:\n{p.log()[-5000:]}"
    print(f"churn: {step} steps over {CHURN_SECONDS:.0f} s: {dict(steps)}")
    assert steps["kill -9"] >= min(len(order), CHURN_SECONDS // 15)
    assert steps["delete node"] >= 1 and steps["poison"] >= 1
    assert_replays_once(s)
    events = ledger_events(s)
    assert any(type(e).__name__ == "JobTerminated" for e in events)
    assert any(type(e).__name__ == "JobRejected" for e in events)
