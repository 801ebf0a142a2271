"""Helpers for tests against the real kube-apiserver of scripts/k8s.sh (kwok nodes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.kube.client import api_client, raw
from tests import waiting

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GPULEDGER_K8S_CACHE", Path.home() / ".cache/gpuledger/k8s"))
KUBECONFIG = CACHE / "kubeconfig"


def ensure_control_plane() -> None:
    """Bring the control plane up (idempotent: a healthy one is reused)."""
    subprocess.run(["bash", str(ROOT / "scripts/k8s.sh"), "up"], check=True)


def apply_manifest(api: client.ApiClient, path: Path) -> None:
    """Create every object of a YAML file; existing ones are updated to match it (a
    control plane kept up between runs then gets, say, an RBAC rule added since)."""
    from kubernetes import dynamic, utils

    dyn: Any = None
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        try:
            utils.create_from_dict(api, doc)  # type: ignore[no-untyped-call]  # (untyped)
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise
            dyn = dyn or dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
            meta = doc["metadata"]
            dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).patch(
                body=doc,
                name=meta["name"],
                namespace=meta.get("namespace"),
                content_type="application/merge-patch+json",
            )


def wait_established(api: client.ApiClient, crd: str) -> None:
    """Wait until the CustomResourceDefinition ``crd`` serves its resource."""
    ext = client.ApiextensionsV1Api(api)

    def established() -> bool:
        status = ext.read_custom_resource_definition(crd).status
        conditions = (status.conditions if status is not None else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until(
        established,
        30,
        f"CRD {crd} to be established",
    )


def sa_kubeconfig(core: client.CoreV1Api, name: str, dest: Path) -> Path:
    """A kubeconfig authenticating as ServiceAccount gpuledger-system/<name> (TokenRequest)."""
    # (the client takes plain dicts for bodies, as the API server reads them)
    request: Any = {"spec": {"expirationSeconds": 86400}}
    tok = core.create_namespaced_service_account_token(name, "gpuledger-system", request)
    assert tok.status is not None, f"no token for ServiceAccount {name}"
    cfg = yaml.safe_load(KUBECONFIG.read_text())
    cfg["users"] = [{"name": name, "user": {"token": tok.status.token}}]
    cfg["contexts"][0]["context"]["user"] = name
    dest.write_text(yaml.safe_dump(cfg))
    return dest


@dataclass
class Cluster:
    """Admin clients plus the ServiceAccount kubeconfigs of the binder and the ingestor."""

    api: client.ApiClient
    binder_kubeconfig: Path
    ingestor_kubeconfig: Path
    core: client.CoreV1Api = field(init=False)
    custom: client.CustomObjectsApi = field(init=False)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # ------------------------------------------------------------------ objects

    def reset(self) -> None:
        """Delete gpuledger pods, Queues and kwok nodes left by an earlier test."""
        pods = raw(
            self.core.list_pod_for_all_namespaces, field_selector="spec.schedulerName=gpuledger"
        )["items"]
        for p in pods:
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(
                    p["metadata"]["name"], p["metadata"]["namespace"], grace_period_seconds=0
                )
        for q in raw(
            self.custom.list_cluster_custom_object, "scheduling.gpuledger.io", "v1alpha1", "queues"
        )["items"]:
            self.custom.delete_cluster_custom_object(
                "scheduling.gpuledger.io", "v1alpha1", "queues", q["metadata"]["name"]
            )
        with contextlib.suppress(ApiException):
            self.core.delete_collection_node(label_selector="type=kwok")
        wait_until(
            lambda: (
                not raw(
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.schedulerName=gpuledger",
                )["items"]
            ),
            30,
        )

    def namespace(self, name: str) -> str:
        with contextlib.suppress(ApiException):
            body: Any = {"metadata": {"name": name}}
            self.core.create_namespace(body)
        return name

    def tenant(self, name: str, nodes: int, *, queue: str = "") -> str:
        """Namespace ``name``, ``nodes`` 8-GPU nodes ``<name>-gpu-<i>``, and a queue over the
        namespace (``queue``, default ``<name>-q``) whose quota is all their GPUs."""
        ns = self.namespace(name)
        self.nodes(f"{name}-gpu", nodes, gpus=8)
        self.queue(queue or f"{name}-q", [ns], quota=8 * nodes)
        return ns

    def nodes(self, prefix: str, count: int, gpus: int = 8) -> list[str]:
        names = []
        for i in range(count):
            name = f"{prefix}-{i}"
            cap = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
            node: Any = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"type": "kwok", "nvidia.com/gpu.product": "A100"},
                },
                "status": {"allocatable": cap, "capacity": cap},
            }
            self.core.create_node(node)
            names.append(name)
        return names

    def queue(
        self,
        name: str,
        namespaces: list[str],
        *,
        quota: float = 0,
        limit: float = -1,
        weight: int = 1,
        parent: str = "",
        priority: int = 0,
    ) -> None:
        spec: dict[str, Any] = {
            "namespaces": namespaces,
            "priority": priority,
            "resources": {"gpu": {"quota": quota, "limit": limit, "overQuotaWeight": weight}},
        }
        if parent:
            spec["parentQueue"] = parent
        self.custom.create_cluster_custom_object(
            "scheduling.gpuledger.io",
            "v1alpha1",
            "queues",
            {
                "apiVersion": "scheduling.gpuledger.io/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def pod(
        self,
        ns: str,
        name: str,
        *,
        gpus: int = 1,
        queue: str = "",
        group: str = "",
        min_member: int = 0,
        duration: str | None = "2s",
        fraction: str = "",
        priority_class: str = "",
        labels: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None,
    ) -> None:
        """A gpuledger pod; ``owner`` is the JSON of an object to name in ownerReferences."""
        labels, ann = dict(labels or {}), {}
        if queue:
            labels["gpuledger.io/queue"] = queue
        if group:
            labels["gpuledger.io/pod-group"] = group
        if min_member:
            ann["gpuledger.io/min-member"] = str(min_member)
        if duration:
            ann["gpuledger.io/run-duration"] = duration
        if fraction:
            ann["gpuledger.io/gpu-fraction"] = fraction
        if priority_class:
            ann["gpuledger.io/priority-class"] = priority_class
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        meta: dict[str, Any] = {"name": name, "labels": labels, "annotations": ann}
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ]
        pod: Any = {
            "metadata": meta,
            "spec": {
                "schedulerName": "gpuledger",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "trainer:1",
                        "resources": {"limits": limits, "requests": {"cpu": "1"}},
                    }
                ],
            },
        }
        self.core.create_namespaced_pod(ns, pod)

    def gang(
        self, ns: str, group: str, size: int, *, gpus: int = 1, duration: str | None = "2s"
    ) -> None:
        """``size`` pods ``<group>-0``, ... of one pod group with ``min_member=size``."""
        for i in range(size):
            self.pod(ns, f"{group}-{i}", gpus=gpus, group=group, min_member=size, duration=duration)

    def pytorchjob(self, ns: str, name: str, workers: int) -> dict[str, Any]:
        """A Kubeflow PyTorchJob with one master and ``workers`` workers, as the API server
        returns it. No operator runs here: the test creates its pods (``owner=`` it)."""
        job = self.custom.create_namespaced_custom_object(
            "kubeflow.org",
            "v1",
            ns,
            "pytorchjobs",
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": name},
                "spec": {
                    "pytorchReplicaSpecs": {
                        "Master": {"replicas": 1, "template": {}},
                        "Worker": {"replicas": workers, "template": {}},
                    }
                },
            },
        )
        assert isinstance(job, dict), job  # (the client returns the object as JSON)
        return job

    def phases(self, ns: str) -> dict[str, str]:
        items = raw(self.core.list_namespaced_pod, ns)["items"]
        return {p["metadata"]["name"]: p["status"].get("phase", "") for p in items}

    def events(self, ns: str, reason: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = raw(
            self.core.list_namespaced_event, ns, field_selector=f"reason={reason}"
        )["items"]
        return items


def make_cluster(tmp: Path) -> Cluster:
    ensure_control_plane()
    api = api_client(str(KUBECONFIG))
    apply_manifest(api, ROOT / "deploy/queue-crd.yaml")
    apply_manifest(api, ROOT / "deploy/rbac.yaml")
    wait_established(api, "queues.scheduling.gpuledger.io")
    core = client.CoreV1Api(api)
    return Cluster(
        api,
        sa_kubeconfig(core, "gpuledger-binder", tmp / "binder.kubeconfig"),
        sa_kubeconfig(core, "gpuledger-ingestor", tmp / "ingestor.kubeconfig"),
    )


def wait_until(
    cond: Callable[[], T],
    timeout: float,
    what: str = "condition",
    *,
    detail: Callable[[], object] | None = None,
) -> T:
    """tests.waiting.wait_until, polling every 0.2 s (each poll asks the API server)."""
    return waiting.wait_until(cond, timeout, what, poll=0.2, detail=detail)


class Proc:
    """A gpuledger component as a subprocess (so tests can SIGKILL it): ``gpuledger kube -v
    ARGS`` by default, ``gpuledger ARGS`` with ``command=()``."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log_dir: Path,
        *,
        command: tuple[str, ...] = ("kube", "-v"),
    ) -> None:
        self.name, self.args, self.log_dir = name, [*command, *args], log_dir
        self.p: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> Proc:
        self.runs += 1
        log = open(self.log_dir / f"{self.name}.{self.runs}.log", "wb")  # noqa: SIM115
        self.p = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", *self.args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()

    def stop(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def log(self) -> str:
        return "\n".join(
            (self.log_dir / f"{self.name}.{i}.log").read_text(errors="replace")
            for i in range(1, self.runs + 1)
        )


@contextlib.contextmanager
def gpuledger(
    cluster: Cluster, work: Path, *, resync_s: float | None = None
) -> Iterator[dict[str, Proc]]:
    """Ingestor, embedded scheduler and binder running against the cluster (the ingestor
    reconciling with the ledger every ``resync_s`` when given)."""
    intake, ledger = work / "intake", work / "ledger"
    resync = [] if resync_s is None else ["--ledger", str(ledger), "--resync-s", str(resync_s)]
    procs = {
        "ingest": Proc(
            "ingest",
            [
                *("ingest", "--kubeconfig", str(cluster.ingestor_kubeconfig)),
                *("--intake", str(intake), *resync),
            ],
            work,
        ),
        "schedule": Proc(
            "schedule", ["schedule", "--intake", str(intake), "--ledger", str(ledger)], work
        ),
        "bind": Proc(
            "bind",
            [
                "bind",
                "--kubeconfig",
                str(cluster.binder_kubeconfig),
                "--ledger",
                str(ledger),
                "--intake",
                str(intake),
            ],
            work,
        ),
    }
    with running(procs):
        yield procs


@contextlib.contextmanager
def running(procs: dict[str, Proc]) -> Iterator[dict[str, Proc]]:
    """Start every process; stop them all on leaving, however the block ends (printing
    their logs when it raises)."""
    for p in procs.values():
        p.start()
    try:
        yield procs
    except BaseException:
        for p in procs.values():  # pytest shows what a failing test printed
            print(f"---- {p.name}'s log (last 40 lines)", *p.log().splitlines()[-40:], sep="\n")
        raise
    finally:
        for p in procs.values():
            p.stop()
