"""gpuledger vs the upstream kube-scheduler through the real kube-apiserver, in one run.

    python -m bench.kube [--nodes 500] [--pods 4000] [--kube-scheduler-qps N ...]
                         [--skip-kube-scheduler] [--backlog] [--json out/bench-kube.json]

Brings up scripts/k8s.sh's control plane (shared with other people's tests: see below) and
builds, once, the upstream kube-scheduler of the API server's own version
(``scripts/k8s.sh kube-scheduler``). It creates ``--nodes`` kwok nodes of 8 GPUs and then
fills them with ``--pods`` one-GPU pods, twice or more, from the same clean state:

1. gpuledger: the ingestor, the embedded scheduler and the binder as subprocesses (as in
   production; the binder makes one ``pods/binding`` call per pod, carrying the GPU-slot
   annotations, plus one Event), pods with ``schedulerName: gpuledger-bench`` (the
   ingestor's selector is set to that name, so it never sees other people's test pods);
2. the kube-scheduler (leader election off, the admin kubeconfig), once per
   ``--kube-scheduler-qps``: its client's QPS/burst (50/100 is its default; a higher one
   takes the client-side throttle out), pods with ``schedulerName: default-scheduler``.

The pods of every run have the same shape (``nvidia.com/gpu: 1``, 1 CPU, a node selector
and a toleration for the bench's nodes) and are created the same way (16 threads); a watch
on the namespace records when each pod gets its ``spec.nodeName``. Per run: pods/s from the
first pod created to the last pod bound (the headline figure), and from the first to the
last bound; and CPU-seconds: of each scheduler process from its start to its end (read from
``/proc`` just before it is stopped), of the control plane (API server, etcd, kwok) and of
the bench itself (the pod creator and the watch) over the run. Between runs every pod of
the bench is deleted and gone before the next starts.
``--backlog`` creates all the pods first and starts the scheduler then (the clock with it):
each scheduler's own rate, where the headline may be the pod creator's.

Sharing the API server. Everything this bench creates is its own: namespace ``bench-kube``,
nodes ``bench-kube-gpu-N`` labelled ``bench=kube`` (and ``type=kwok``, for kwok) and tainted
``bench=kube:NoSchedule`` (no one else's pods land on them), Queue ``bench-kube``; only those
are deleted (never ``Cluster.reset()``). Before each run it waits (polling every 30 s, up to
``--wait-quiet`` s) until no pytest and no ``scheduler.cli kube`` process of someone else has
run for 30 s, and it refuses to start a scheduler while someone else's pod is pending for it
(it would bind that pod). A run during which such a process appeared is marked; a run whose
nodes someone deleted (a test's ``Cluster.reset()`` deletes every kwok node) is repeated.

KAI-Scheduler's published scale test took 6 min 37 s (397 s) for this fill on its
infrastructure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from events.codec import decode_event
from events.filelog import LedgerDirReader
from events.model import NodeRegistered, PodBound
from scheduler.kube.client import Gone, api_client, raw, send, watch

ROOT = Path(__file__).resolve().parent.parent
KAI_SECONDS = 397.0
NS = "bench-kube"
LABEL = "bench=kube"
NODE_PREFIX = "bench-kube-gpu"
QUEUE = "bench-kube"
GROUP, VERSION = "scheduling.gpuledger.io", "v1alpha1"
CACHE = Path(os.environ.get("GPULEDGER_K8S_CACHE", Path.home() / ".cache/gpuledger/k8s"))
KUBECONFIG = CACHE / "kubeconfig"  # scripts/k8s.sh's admin kubeconfig
BENCH_TAINT = {"key": "bench", "value": "kube", "effect": "NoSchedule"}
BENCH_SCHEDULER = "gpuledger-bench"
"""schedulerName of the bench's gpuledger pods (see ``gpuledger`` below)."""


# --------------------------------------------------------------------------- sharing


def _others_running() -> list[str]:
    """Command lines of pytest and ``scheduler.cli kube`` processes not started by us."""
    mine = {os.getpid()}
    found = []
    procs: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(d.name)] = (ppid, cmd)
    for pid, (_, cmd) in procs.items():
        if "pytest" not in cmd and "scheduler.cli kube" not in cmd:
            continue
        p, ours = pid, False
        while p > 1:  # started by this process (our own gpuledger components)?
            if p in mine:
                ours = True
                break
            p = procs.get(p, (1, ""))[0]
        if not ours:
            found.append(f"{pid}: {cmd.strip()[:120]}")
    return found


def wait_quiet(limit_s: float, quiet_s: float = 30) -> None:
    """Wait until nobody else's kube tests have run for ``quiet_s`` (they share the API
    server; a loop of test runs has gaps of a few seconds between them). ``limit_s`` 0:
    do not wait (a run with others about is still marked so in the table)."""
    if limit_s <= 0:
        return
    deadline = time.monotonic() + limit_s
    quiet_since = time.monotonic()
    while True:
        if others := _others_running():
            if time.monotonic() > deadline:
                raise SystemExit(f"other kube tests still running after {limit_s:.0f}s: {others}")
            print(f"waiting for {len(others)} other test process(es): {others[0]}", file=sys.stderr)
            time.sleep(30)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        else:
            time.sleep(5)


# --------------------------------------------------------------------------- CPU


_TICK = os.sysconf("SC_CLK_TCK")
PLANE = ("kube-apiserver", "etcd", "kwok")
"""scripts/k8s.sh's processes (pid files in its run directory)."""


def cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) a live process has used so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def plane_cpu_s() -> float:
    """CPU-seconds the control plane's processes have used so far."""
    total = 0.0
    for name in PLANE:
        with contextlib.suppress(OSError, ValueError):
            total += cpu_s(int((CACHE / "run" / f"{name}.pid").read_text().strip()))
    return total


# --------------------------------------------------------------------------- objects


def _node(name: str) -> dict[str, Any]:
    cap = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"type": "kwok", "bench": "kube", "nvidia.com/gpu.product": "A100"},
        },
        "spec": {"taints": [BENCH_TAINT]},
        "status": {"allocatable": cap, "capacity": cap},
    }


def _pod(name: str, scheduler: str) -> dict[str, Any]:
    """The one pod shape of every run; only ``schedulerName`` differs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "kube"}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"bench": "kube"},
            "tolerations": [
                {"key": "bench", "operator": "Equal", "value": "kube", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}},
                }
            ],
        },
    }


def _pool_map(fn: Callable[[int], object], n: int) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(fn, range(n)))


def ensure_nodes(core: client.CoreV1Api, count: int) -> None:
    """Our ``count`` nodes exist (created when missing, e.g. after someone's reset), with
    only the bench's taint: the API server's TaintNodesByCondition admission adds
    ``node.kubernetes.io/not-ready:NoSchedule`` at creation and no node lifecycle controller
    runs here to lift it once kwok reports the node Ready, so the bench lifts it."""
    want = [f"{NODE_PREFIX}-{i}" for i in range(count)]
    have = {n["metadata"]["name"]: n for n in raw(core.list_node, label_selector=LABEL)["items"]}
    for name in sorted(set(have) - set(want)):  # ours, from a run with more nodes
        with contextlib.suppress(ApiException):
            core.delete_node(name)
    missing = [n for n in want if n not in have]
    if missing:
        t = time.perf_counter()
        _pool_map(lambda i: send(core.create_node, _node(missing[i])), len(missing))
        print(f"{len(missing)} nodes created in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    have = {n["metadata"]["name"]: n for n in raw(core.list_node, label_selector=LABEL)["items"]}
    tainted = [n for n in want if (have[n].get("spec") or {}).get("taints") != [BENCH_TAINT]]
    _pool_map(
        lambda i: send(core.patch_node, tainted[i], {"spec": {"taints": [BENCH_TAINT]}}),
        len(tainted),
    )


def ensure_queue(cluster: Any, nodes: int) -> None:
    """The bench's Queue (a test's reset deletes every Queue)."""
    with contextlib.suppress(ApiException):
        cluster.custom.get_cluster_custom_object(GROUP, VERSION, "queues", QUEUE)
        return
    cluster.queue(QUEUE, [NS], quota=8 * nodes)


class NodesGoneError(RuntimeError):
    """Someone deleted the bench's nodes mid-run (a test's ``Cluster.reset()``)."""


def nodes_left(core: client.CoreV1Api) -> int:
    return len(raw(core.list_node, label_selector=LABEL)["items"])


def delete_pods(core: client.CoreV1Api, timeout: float = 600) -> None:
    """Delete every pod of the bench and wait until the API server has none left."""
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_pod(
            NS, label_selector=LABEL, grace_period_seconds=0, _preload_content=False
        )
    _wait(
        lambda: not raw(core.list_namespaced_pod, NS, label_selector=LABEL, limit=1)["items"],
        timeout,
        "the bench's pods to be gone",
    )


def cleanup(core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
    """Delete what the bench made (its pods, Events, nodes and Queue; the namespace stays:
    without a controller-manager it would never finish terminating)."""
    delete_pods(core)
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_event(NS, _preload_content=False)
    with contextlib.suppress(ApiException):
        core.delete_collection_node(label_selector=LABEL, _preload_content=False)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(GROUP, VERSION, "queues", QUEUE)


def foreign_pending(core: client.CoreV1Api, scheduler: str) -> list[str]:
    """Someone else's pods waiting for ``scheduler``: our scheduler would bind them."""
    items = raw(
        core.list_pod_for_all_namespaces,
        field_selector=f"spec.schedulerName={scheduler},spec.nodeName=",
    )["items"]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in items
        if p["metadata"]["namespace"] != NS
    ]


def _wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- one run


class BindWatch:
    """Watches the bench namespace and records when each pod first has a node."""

    def __init__(self, kubeconfig: str) -> None:
        self.core = client.CoreV1Api(api_client(kubeconfig, pool=2))
        self.bound: dict[str, float] = {}
        self._stop = threading.Event()
        listed = raw(self.core.list_namespaced_pod, NS, label_selector=LABEL)
        self._rv = str(listed["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for ev in watch(
                    self.core.list_namespaced_pod, self._rv, timeout_s=30,
                    namespace=NS, label_selector=LABEL,
                ):  # fmt: skip
                    obj = ev["object"]
                    self._rv = str(obj["metadata"].get("resourceVersion") or self._rv)
                    name = obj["metadata"].get("name")
                    if name and (obj.get("spec") or {}).get("nodeName"):
                        self.bound.setdefault(name, time.perf_counter())
                    if self._stop.is_set():
                        return
            except Gone:  # cannot happen within a run's minutes; list again to be safe
                listed = raw(self.core.list_namespaced_pod, NS, label_selector=LABEL)
                now = time.perf_counter()
                for p in listed["items"]:
                    if p["spec"].get("nodeName"):
                        self.bound.setdefault(p["metadata"]["name"], now)
                self._rv = str(listed["metadata"]["resourceVersion"])
            except Exception as exc:  # a dropped watch: resume
                print(f"watch: {exc!r}; resuming", file=sys.stderr)
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()


def fill(
    core: client.CoreV1Api,
    scheduler: str,
    running: Callable[[], contextlib.AbstractContextManager[None]],
    nodes: int,
    pods: int,
    *,
    backlog: bool = False,
    timeout: float = 1800,
) -> dict[str, Any]:
    """Create ``pods`` pods for ``scheduler`` and wait until each is bound, with the
    scheduler ``running`` from the start (the clock starts at the first pod created), or
    with ``backlog``, only once they all exist (the clock starts with the scheduler).
    The control plane's and this process's CPU-seconds are counted from the first pod
    created to the last bound."""
    watcher = BindWatch(str(KUBECONFIG))
    plane0, own0 = plane_cpu_s(), time.process_time()
    checked = [time.monotonic()]
    others: set[str] = set()

    def done() -> bool:
        if len(watcher.bound) >= pods:
            return True
        if time.monotonic() - checked[0] > 5:
            checked[0] = time.monotonic()
            others.update(_others_running())  # someone's tests share the machine and server
            if nodes_left(core) < nodes:
                raise NodesGoneError(f"only {nodes_left(core)} of the bench's {nodes} nodes left")
        return False

    try:
        with contextlib.ExitStack() as stack:
            if not backlog:
                stack.enter_context(running())
            start = time.perf_counter()
            _pool_map(
                # send() reads each answer, so the 16 threads reuse their connections.
                lambda i: send(core.create_namespaced_pod, NS, _pod(f"fill-{i:05d}", scheduler)),
                pods,
            )
            created = time.perf_counter() - start
            print(f"  {pods} pods created in {created:.1f}s", file=sys.stderr)
            others.update(_others_running())
            if backlog:
                start = time.perf_counter()
                stack.enter_context(running())
            _wait(done, timeout, f"{pods} pods bound by {scheduler}")
            plane, own = plane_cpu_s() - plane0, time.process_time() - own0
    finally:
        watcher.stop()
    stamps = sorted(watcher.bound.values())
    span = stamps[-1] - start
    bind_span = max(stamps[-1] - stamps[0], 1e-3)
    return {
        "pods": len(stamps),
        "create_s": round(created, 1),
        "fill_s": round(span, 1),
        "pods_per_s": round(len(stamps) / span, 1),
        "bind_span_s": round(bind_span, 1),
        "bound_per_s": round(len(stamps) / bind_span, 1),
        "plane_cpu_s": round(plane, 1),
        "bench_cpu_s": round(own, 1),
        "others_running": sorted(others),
    }


# The components run as ``python -m scheduler.cli kube ...`` would, except that the ingestor
# watches pods of schedulerName BENCH_SCHEDULER (a module constant, set before ``main``):
# other people's tests on the shared API server run their own gpuledger on "gpuledger" pods,
# and neither may see, bind or evict the other's. ``scheduler.cli kube`` stays in the command
# line so that ``ps aux | grep "scheduler.cli kube"`` shows the bench at work.
_COMPONENT = (
    "import sys; import scheduler.kube.mapping as m; m.SCHEDULER_NAME = sys.argv[1]; "
    "from scheduler.cli import main; sys.exit(main(sys.argv[3:]))"
)


PY_SPY: str | None = None
"""``--py-spy``: the py-spy binary each gpuledger component runs under."""


@contextlib.contextmanager
def gpuledger(cluster: Any, work: Path, cpu: dict[str, float] | None = None) -> Iterator[None]:
    """Ingestor, embedded scheduler and binder, as ``tests.kubeharness.gpuledger``; their
    CPU-seconds, read just before they are stopped, go to ``cpu`` (by component). With
    ``PY_SPY`` each runs under ``py-spy record --nonblocking`` (``<name>.pyspy.txt``, raw
    folded stacks; the CPU-seconds are then the profiled process's)."""
    intake, ledger = work / "intake", work / "ledger"
    args = {
        "ingest": ["--kubeconfig", str(cluster.ingestor_kubeconfig), "--intake", str(intake)],
        "schedule": ["--intake", str(intake), "--ledger", str(ledger)],
        "bind": ["--kubeconfig", str(cluster.binder_kubeconfig), "--ledger", str(ledger),
                 "--intake", str(intake)],
    }  # fmt: skip
    procs = []
    try:
        for name, rest in args.items():
            cmd = [sys.executable, "-c", _COMPONENT, BENCH_SCHEDULER, "scheduler.cli", "kube"]
            if PY_SPY:
                out = work / f"{name}.pyspy.txt"
                cmd = [PY_SPY, "record", "--nonblocking", "-r", "50", "-f", "raw", "-o", str(out),
                       "--", *cmd]  # fmt: skip
            with open(work / f"{name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [*cmd, "-v", name, *rest], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        yield
    finally:
        if cpu is not None:
            for name, p in zip(args, procs, strict=False):
                cpu[name] = round(cpu_s(_profiled(p.pid) if PY_SPY else p.pid), 1)
        for p in procs:
            if PY_SPY:  # py-spy writes its profile when the profiled process ends
                with contextlib.suppress(ProcessLookupError):
                    os.kill(_profiled(p.pid), 15)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(30)
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _profiled(pid: int) -> int:
    """The child py-spy started (its only one), or ``pid`` itself."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return pid
    return int(children[0]) if children else pid


def run_gpuledger(cluster: Any, work: Path, nodes: int, pods: int, backlog: bool) -> dict[str, Any]:
    ingest, binder = work / "intake" / "ingest", work / "intake" / "binder"

    def registered() -> int:
        if not ingest.is_dir() or not any(ingest.glob("*.seg")):
            return 0
        names = {
            e.node
            for off, env in LedgerDirReader(ingest).read()
            if isinstance(e := decode_event(env, off), NodeRegistered)
        }
        return sum(n.startswith(NODE_PREFIX) for n in names)

    cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def running() -> Iterator[None]:
        with gpuledger(cluster, work, cpu):
            try:
                _wait(lambda: registered() >= nodes, 60, "the ingestor to register the nodes")
            except RuntimeError:
                if nodes_left(cluster.core) < nodes:
                    raise NodesGoneError("the bench's nodes went away") from None
                raise
            if not backlog:
                time.sleep(1)  # and the embedded scheduler to fold them
            yield

    work.mkdir(parents=True, exist_ok=True)
    row = fill(cluster.core, BENCH_SCHEDULER, running, nodes, pods, backlog=backlog)
    stamps = [
        env.at
        for off, env in LedgerDirReader(binder).read()
        if isinstance(decode_event(env, off), PodBound)
    ]
    # Outcomes are appended once per cycle, all stamped alike: over a span under a second
    # (a backlog bound in one cycle) there is no rate to read.
    span_s = (max(stamps) - min(stamps)) / 1000
    row["binder_pods_per_s"] = round(len(stamps) / span_s, 1) if span_s >= 1 else None
    row["cpu_s"] = {**cpu, "total": round(sum(cpu.values()), 1)}
    return row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def kube_scheduler(
    binary: str, work: Path, qps: int, cpu: dict[str, float] | None = None
) -> Iterator[None]:
    """The upstream kube-scheduler, leader election off, client at ``qps`` (burst 2×); its
    CPU-seconds, read just before it is stopped, go to ``cpu["kube-scheduler"]``."""
    config = work / f"kube-scheduler-qps{qps}.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection: {{kubeconfig: {json.dumps(str(KUBECONFIG))}, "
        f"qps: {qps}, burst: {2 * qps}}}\n"
        "leaderElection: {leaderElect: false}\n"
        "profiles:\n- schedulerName: default-scheduler\n"
    )
    port = _free_port()
    log = open(work / f"kube-scheduler-qps{qps}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, "--config", str(config), "--bind-address", "127.0.0.1",
         "--secure-port", str(port), "--v", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its self-signed serving cert

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"kube-scheduler exited; see {log.name}")
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        _wait(ready, 60, "the kube-scheduler to be ready")
        yield
    finally:
        if cpu is not None:
            cpu["kube-scheduler"] = round(cpu_s(proc.pid), 1)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# --------------------------------------------------------------------------- main


def _table(rows: list[dict[str, Any]], backlog: bool) -> str:
    origin = "scheduler start" if backlog else "create"
    cols = [
        ("scheduler", "scheduler"), ("pods", "pods"), ("create_s", "create s"),
        ("fill_s", "fill s"), ("pods_per_s", f"pods/s ({origin}→last bound)"),
        ("bound_per_s", "pods/s (first→last bound)"), ("vs", "gpuledger ÷ this"),
        ("cpu", "scheduler CPU-s"), ("plane_cpu_s", "API server+etcd+kwok CPU-s"),
        ("bench_cpu_s", "bench CPU-s"), ("quiet", "no other tests"),
    ]  # fmt: skip
    for r in rows:
        r["cpu"] = " + ".join(f"{v}" for k, v in r["cpu_s"].items() if k != "total")
        if len(r["cpu_s"]) > 2:
            r["cpu"] += f" = {r['cpu_s']['total']}"
    cells = [[h for _, h in cols]] + [[str(r.get(k, "")) for k, _ in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fills and print the table."""
    from tests.kubeharness import make_cluster  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m bench.kube")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument(
        "--kube-scheduler-qps", type=int, action="append",
        help="client QPS of a kube-scheduler run (repeatable; default: 5000, then 50)",
    )  # fmt: skip
    parser.add_argument("--skip-kube-scheduler", action="store_true")
    parser.add_argument(
        "--backlog", action="store_true",
        help="create all pods first, then start the scheduler (its own rate, not the creator's)",
    )  # fmt: skip
    parser.add_argument(
        "--wait-quiet", type=float, default=1200, help="seconds (default 1200; 0: do not wait)"
    )
    parser.add_argument(
        "--py-spy", metavar="PATH",
        help="run each gpuledger component under this py-spy (profiles in the work directory)",
    )  # fmt: skip
    parser.add_argument("--json", default="out/bench-kube.json")
    args = parser.parse_args(argv)
    global PY_SPY  # noqa: PLW0603  # one run's setting, read by gpuledger()
    PY_SPY = args.py_spy
    qps_runs = [] if args.skip_kube_scheduler else (args.kube_scheduler_qps or [5000, 50])
    binary = ""
    if qps_runs:
        t = time.perf_counter()
        binary = subprocess.run(
            ["bash", str(ROOT / "scripts/k8s.sh"), "kube-scheduler"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        print(f"kube-scheduler ready in {time.perf_counter() - t:.1f}s: {binary}", file=sys.stderr)
    wait_quiet(args.wait_quiet)
    work = Path(tempfile.mkdtemp(prefix="gpuledger-bench-kube-"))
    cluster = make_cluster(work)
    core, custom = cluster.core, cluster.custom
    with contextlib.suppress(ApiException):
        core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NS, labels={"bench": "kube"}))
        )
    rows: list[dict[str, Any]] = []
    try:
        delete_pods(core)  # a killed earlier run's
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "queues", QUEUE)
        runs: list[tuple[str, int]] = [("gpuledger", 0)] + [("kube", q) for q in qps_runs]
        for kind, qps in runs:
            label = "gpuledger" if kind == "gpuledger" else f"kube-scheduler (qps {qps})"
            scheduler = BENCH_SCHEDULER if kind == "gpuledger" else "default-scheduler"
            for attempt in range(1, 4):
                wait_quiet(args.wait_quiet)
                ensure_nodes(core, args.nodes)
                ensure_queue(cluster, args.nodes)
                if others := foreign_pending(core, scheduler):
                    raise SystemExit(f"someone else's pods wait for {scheduler}: {others[:5]}")
                print(f"== {label}: {args.pods} pods on {args.nodes} nodes", file=sys.stderr)
                try:
                    if kind == "gpuledger":
                        row = run_gpuledger(
                            cluster, work / f"gpuledger-{attempt}", args.nodes, args.pods,
                            args.backlog,
                        )  # fmt: skip
                    else:
                        cpu: dict[str, float] = {}
                        row = fill(
                            core, scheduler, partial(kube_scheduler, binary, work, qps, cpu),
                            args.nodes, args.pods, backlog=args.backlog,
                        )  # fmt: skip
                        row["cpu_s"] = {**cpu, "total": cpu.get("kube-scheduler", 0.0)}
                except NodesGoneError as exc:
                    print(f"  {exc}: run again (attempt {attempt} of 3)", file=sys.stderr)
                    delete_pods(core)
                    if attempt == 3:
                        raise
                    continue
                rows.append({"scheduler": label, **row})
                print(f"  {json.dumps(rows[-1])}", file=sys.stderr)  # kept if a later run fails
                delete_pods(core)
                break
    finally:
        cleanup(core, custom)
    ours = rows[0]["pods_per_s"]
    for r in rows:
        r["vs"] = f"{ours / r['pods_per_s']:.2f}x"
        r["quiet"] = "no" if r["others_running"] else "yes"
    mode = "all pods created first (--backlog)" if args.backlog else "pods created as it runs"
    print(f"\n{args.pods:,} one-GPU pods onto {args.nodes} kwok nodes via kube-apiserver; {mode}")
    print(_table(rows, args.backlog))
    print()
    for r in rows[1:]:
        print(
            f"gpuledger / {r['scheduler']}: {ours / r['pods_per_s']:.2f} "
            f"({ours} vs {r['pods_per_s']} pods/s)"
        )
    fill_s = rows[0]["fill_s"]
    print(
        f"gpuledger fill {fill_s} s; KAI-Scheduler's published 397 s: {KAI_SECONDS / fill_s:.1f}x"
    )
    print(f"gpuledger binder alone (first → last PodBound): {rows[0]['binder_pods_per_s']} pods/s")
    print(
        "gpuledger CPU-s per fill: "
        + ", ".join(f"{k} {v}" for k, v in rows[0]["cpu_s"].items())
        + "".join(f"; {r['scheduler']} {r['cpu_s']['total']}" for r in rows[1:])
    )
    out = {
        "mode": "backlog" if args.backlog else "fill",
        "nodes": args.nodes,
        "pods": args.pods,
        "runs": rows,
        "ratio_gpuledger_vs_kube_scheduler": {
            r["scheduler"]: round(ours / r["pods_per_s"], 2) for r in rows[1:]
        },
        "kai_published_s": KAI_SECONDS,
        "ratio_vs_kai": round(KAI_SECONDS / fill_s, 2),
        "work": str(work),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
