"""The Helm chart deploy/helm/gpuledger: `helm lint`, what `helm template` renders (an
active and a standby scheduler, no shared volume, a ServiceAccount per component, least
privilege), that every command in the chart and in compose.yaml is a real `gpuledger`
command with real flags, and that the test kube-apiserver (scripts/k8s.sh) accepts every
rendered object and `helm install` grants each ServiceAccount exactly its rights.

helm comes from `make helm` (scripts/helm.sh, cached in ~/.cache/gpuledger/helm). Without it
these tests skip, unless GPULEDGER_REQUIRE_HELM or CI is set, when they fail (tests/prereq.py).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubeharness import KUBECONFIG, ROOT, ensure_control_plane
from tests.prereq import require

pytestmark = pytest.mark.integration

CHART = ROOT / "deploy/helm/gpuledger"
RELEASE = "gl"
COMPONENTS = {"scheduler", "ingestor", "binder", "projector", "clock"}
API_COMPONENTS = {"ingestor", "binder"}  # the only ones that talk to the Kubernetes API
SECRET_DIR = "/run/gpuledger"

# Every security setting at once: SASL over TLS with a client certificate, secrets from a
# Secret, several bootstrap servers, and the projector's own PVC.
SECURITY_VALUES: dict[str, Any] = {
    "kafka": {
        "bootstrap": "kafka-0.kafka:9093,kafka-1.kafka:9093",
        "prefix": "prod",
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "gpuledger", "passwordKey": "password"},
        "ssl": {"caKey": "ca.pem", "certKey": "client.pem", "keyKey": "client.key"},
        "secret": {"name": "gpuledger-kafka"},
    },
    "projector": {"persistence": {"enabled": True, "size": "5Gi"}},
    "scheduler": {"policy": "kai", "extraArgs": ["--session-timeout-ms", "5000"]},
}
VALUES = {"default": {}, "security": SECURITY_VALUES}

# The console (gpuledger serve in the projector's pod): with its token, or behind oauth2-proxy
# with a NetworkPolicy that opens only the proxy's port to the ingress controller's namespace.
PROXY_FROM = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
CONSOLE_VALUES: dict[str, dict[str, Any]] = {
    "console-token": {"projector": {"console": {"enabled": True, "tokenSecret": "console-token"}}},
    "console-proxy": {
        "projector": {
            "console": {
                "enabled": True,
                "authProxy": {
                    "enabled": True,
                    "clientId": "gpuledger-console",
                    "oidcIssuerUrl": "https://id.example.com/realms/gpu",
                    "secret": {"name": "console-oauth"},
                    "extraArgs": ["--allowed-group=gpu-admins"],
                },
                "networkPolicy": {"enabled": True, "from": PROXY_FROM},
            }
        }
    },
}
ALL_VALUES = VALUES | CONSOLE_VALUES


def _find_helm() -> str | None:
    cache = Path(os.environ.get("GPULEDGER_HELM_CACHE", Path.home() / ".cache/gpuledger/helm"))
    for candidate in (os.environ.get("GPULEDGER_HELM"), cache / "bin/helm", shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


class Helm:
    """The helm binary, with its config, cache and data in a directory of the test session's
    (not the user's ~/.config/helm)."""

    def __init__(self, path: str, home: Path) -> None:
        self.path = path
        self.env = dict(os.environ)
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            self.env[var] = str(home / var.lower())

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.path, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=180,
            env=self.env,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def render(
        self, tmp_path: Path, values: dict[str, Any], namespace: str = "gpuledger-system"
    ) -> list[dict[str, Any]]:
        """`helm template` with ``values``, CRDs included, as a list of objects."""
        out = self(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            "--include-crds",
            "--values",
            values_file(tmp_path, values),
        ).stdout
        return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    path = _find_helm()
    if path is None:
        reason = "helm not found: run `make helm` (scripts/helm.sh builds it into ~/.cache/gpuledger/helm)"
        if os.environ.get("GPULEDGER_REQUIRE_HELM"):
            pytest.fail(f"GPULEDGER_REQUIRE_HELM is set but {reason}")
        require(False, reason)
    return Helm(path, tmp_path_factory.mktemp("helm-home"))


def values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def deployments(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    result = {component(d): d for d in by_kind(objects, "Deployment")}
    assert len(result) == len(by_kind(objects, "Deployment")), "one Deployment per component"
    return result


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(c)


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def rbac_rules(objects: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    """(apiGroup, resource, verb) per ClusterRole/Role, keyed by its component (deploy/rbac.yaml:
    by its name without the gpuledger- prefix)."""
    rules: dict[str, set[tuple[str, str, str]]] = {}
    for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role"):
        labels = role["metadata"].get("labels", {})
        key = labels.get("app.kubernetes.io/component") or role["metadata"]["name"].removeprefix(
            "gpuledger-"
        )
        rules[key] = {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }
    return rules


# ---------------------------------------------------------------------------- helm lint


def test_lint(helm: Helm, tmp_path: Path) -> None:
    for values in ALL_VALUES.values():
        out = helm("lint", "--strict", str(CHART), "-f", values_file(tmp_path, values))
        assert "0 chart(s) failed" in out.stdout, out.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka": {"sasl": {"passwordKey": "password"}}}, "set kafka.secret.name"),
        ({"kafka": {"securityProtocol": "TLS"}}, "securityProtocol"),
        ({"kafka": {"sasl": {"mechanism": "GSSAPI"}}}, "mechanism"),
        (
            {"kafka": {"secret": {"name": "s"}, "ssl": {"certKey": "client.pem"}}},
            "kafka.ssl.keyKey",
        ),
        ({"scheduler": {"replicas": 0}}, "replicas"),
        ({"kafka": {"prefix": "a.b"}}, "prefix"),  # a dot would break kafka://HOST/PREFIX
        ({"clock": {"every": "1h"}}, "clock"),  # `gpuledger clock --every` takes ms, s, m
        ({"projector": {"console": {"enabled": True}}}, "projector.console.tokenSecret"),
        (
            {"projector": {"console": {"enabled": True, "authProxy": {"enabled": True}}}},
            "projector.console.authProxy.secret.name",
        ),
        (
            {
                "projector": {
                    "console": {
                        "enabled": True,
                        "authProxy": {"enabled": True, "clientId": "c", "secret": {"name": "s"}},
                    }
                }
            },
            "projector.console.authProxy.oidcIssuerUrl",
        ),
    ],
)
def test_refuses_values_that_cannot_work(
    helm: Helm, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    proc = helm("template", RELEASE, str(CHART), "-f", values_file(tmp_path, values), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------- rendered objects


@pytest.mark.parametrize("name", VALUES)
def test_rendered_deployment_shape(helm: Helm, tmp_path: Path, name: str) -> None:
    objects = helm.render(tmp_path, VALUES[name])
    deps = deployments(objects)
    assert set(deps) == COMPONENTS

    # An active scheduler and a standby, elected through the consumer group: nothing forces
    # the old pod away before the new one starts (no Recreate), a PDB keeps one up in drains.
    sched = deps["scheduler"]["spec"]
    assert sched["replicas"] == 2
    assert sched.get("strategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
    (pdb,) = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == sched["selector"]["matchLabels"]
    for comp in COMPONENTS - {"scheduler"}:
        assert deps[comp]["spec"]["replicas"] == 1, comp

    # No volume is shared: each pod's volumes are emptyDirs, the Kafka Secret (read-only),
    # and for the projector alone its own claim.
    claims: dict[str, list[str]] = {}
    for comp, dep in deps.items():
        pod = dep["spec"]["template"]["spec"]
        for vol in pod.get("volumes", []):
            kinds = set(vol) - {"name"}
            assert kinds <= {"emptyDir", "secret", "persistentVolumeClaim"}, (comp, vol)
            if "persistentVolumeClaim" in vol:
                claims.setdefault(vol["persistentVolumeClaim"]["claimName"], []).append(comp)
            if "secret" in vol:
                mounts = [m for m in container(dep)["volumeMounts"] if m["name"] == vol["name"]]
                assert all(m.get("readOnly") for m in mounts), (comp, mounts)
    assert all(len(users) == 1 for users in claims.values()), claims
    assert set().union(*claims.values()) <= {"projector"}, claims
    rendered_claims = {p["metadata"]["name"] for p in by_kind(objects, "PersistentVolumeClaim")}
    assert rendered_claims == set(claims)
    assert bool(claims) == (name == "security")  # emptyDir unless persistence is enabled
    projector = container(deps["projector"])
    assert arg(projector["args"], "--db") == "/data/history.duckdb"
    assert {"name": "data", "mountPath": "/data"} in projector["volumeMounts"]

    # Image, pull policy, resources everywhere.
    for comp, dep in deps.items():
        c = container(dep)
        assert c["image"] == "gpuledger:0.1.0", comp
        assert c["imagePullPolicy"] == "IfNotPresent", comp
        assert c["resources"]["requests"], comp
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, comp

    # The metrics Service reaches every scheduler instance on the port it listens on.
    (svc,) = by_kind(objects, "Service")
    assert svc["spec"]["selector"] == sched["template"]["metadata"]["labels"]
    (port,) = svc["spec"]["ports"]
    sched_container = container(deps["scheduler"])
    (cport,) = sched_container["ports"]
    assert port["targetPort"] == cport["name"] == "metrics"
    assert arg(sched_container["args"], "--metrics-addr") == f"0.0.0.0:{cport['containerPort']}"

    # The Queue CRD is the one of deploy/queue-crd.yaml, under crds/.
    (crd,) = by_kind(objects, "CustomResourceDefinition")
    assert crd == yaml.safe_load((ROOT / "deploy/queue-crd.yaml").read_text())
    assert (CHART / "crds/queue-crd.yaml").is_file()


@pytest.mark.parametrize("name", VALUES)
def test_least_privilege(helm: Helm, tmp_path: Path, name: str) -> None:
    objects = helm.render(tmp_path, VALUES[name])
    deps = deployments(objects)
    accounts = {sa["metadata"]["name"]: sa for sa in by_kind(objects, "ServiceAccount")}

    # One ServiceAccount per component, each used by that component only.
    used = {comp: d["spec"]["template"]["spec"]["serviceAccountName"] for comp, d in deps.items()}
    assert len(set(used.values())) == len(used) == len(accounts)
    assert set(used.values()) == set(accounts)
    for comp, sa_name in used.items():
        assert component(accounts[sa_name]) == comp
        pod_token = deps[comp]["spec"]["template"]["spec"]["automountServiceAccountToken"]
        sa_token = accounts[sa_name]["automountServiceAccountToken"]
        want = comp in API_COMPONENTS
        assert pod_token is want and sa_token is want, comp

    # Only the ingestor and the binder have API rights, bound to their own ServiceAccount,
    # and exactly the rules of deploy/rbac.yaml: no wildcard, no Secrets.
    reference = rbac_rules(list(yaml.safe_load_all((ROOT / "deploy/rbac.yaml").read_text())))
    rules = rbac_rules(objects)
    assert set(rules) == API_COMPONENTS
    for comp, granted in rules.items():
        assert granted == reference[comp], comp
        assert not any("*" in t for t in granted), comp
        assert not any(r == "secrets" for _, r, _ in granted), comp
    # What either may change at all, whatever deploy/rbac.yaml says: the binder binds,
    # evicts, deletes or patches pods and writes Events; the ingestor only writes Events.
    binder_writes = {(r, v) for _, r, v in rules["binder"] if v not in {"get", "list", "watch"}}
    assert binder_writes <= {
        ("pods", "patch"),
        ("pods", "delete"),
        ("pods/binding", "create"),
        ("pods/eviction", "create"),
        ("events", "create"),
    }
    assert {("pods/binding", "create"), ("pods/eviction", "create")} <= binder_writes
    ingestor_writes = {(r, v) for _, r, v in rules["ingestor"] if v not in {"get", "list", "watch"}}
    assert ingestor_writes == {("events", "create")}

    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert len(bindings) == len(API_COMPONENTS)
    roles = {r["metadata"]["name"]: component(r) for r in by_kind(objects, "ClusterRole")}
    for b in bindings:
        (subject,) = b["subjects"]
        assert subject["kind"] == "ServiceAccount"
        assert subject["namespace"] == "gpuledger-system"
        assert subject["name"] == used[component(b)]
        assert roles[b["roleRef"]["name"]] == component(b)


@pytest.mark.parametrize("name", VALUES)
def test_kafka_settings_reach_every_component(helm: Helm, tmp_path: Path, name: str) -> None:
    values = VALUES[name]
    kafka = values.get("kafka", {})
    bootstrap, prefix = kafka.get("bootstrap", "kafka:9092"), kafka.get("prefix", "gpuledger")
    url = f"kafka://{bootstrap}/{prefix}"
    deps = deployments(helm.render(tmp_path, values))
    args = {comp: [str(a) for a in container(d)["args"]] for comp, d in deps.items()}

    assert args["scheduler"][:2] == ["scheduler", "run"]
    assert arg(args["scheduler"], "--bootstrap") == bootstrap
    assert arg(args["scheduler"], "--prefix") == prefix
    assert arg(args["scheduler"], "--policy") == ("kai" if name == "security" else "gpuledger")
    assert args["clock"][:1] == ["clock"]
    assert (arg(args["clock"], "--bootstrap"), arg(args["clock"], "--prefix")) == (
        bootstrap,
        prefix,
    )
    assert args["ingestor"] == ["kube", "ingest", "--intake", url]
    assert args["binder"] == ["kube", "bind", "--ledger", url, "--intake", url]
    assert args["projector"][:3] == ["project", "--follow", url]
    if name == "security":
        assert args["scheduler"][-2:] == ["--session-timeout-ms", "5000"]

    want = {"GPULEDGER_KAFKA": bootstrap}
    if name == "security":
        want |= {
            "GPULEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "GPULEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "GPULEDGER_KAFKA_SASL_USERNAME": "gpuledger",
            "GPULEDGER_KAFKA_SASL_PASSWORD_FILE": f"{SECRET_DIR}/password",
            "GPULEDGER_KAFKA_SSL_CAFILE": f"{SECRET_DIR}/ca.pem",
            "GPULEDGER_KAFKA_SSL_CERTFILE": f"{SECRET_DIR}/client.pem",
            "GPULEDGER_KAFKA_SSL_KEYFILE": f"{SECRET_DIR}/client.key",
        }
    for comp, dep in deps.items():
        c = container(dep)
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env == want, comp  # files only: never the password itself
        secret_vols = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
        if name == "security":
            (vol,) = secret_vols
            assert vol["secret"]["secretName"] == "gpuledger-kafka"
            assert {"name": vol["name"], "mountPath": SECRET_DIR, "readOnly": True} in c[
                "volumeMounts"
            ]
        else:
            assert not secret_vols, comp

    # The variables are the ones the client reads (events.kafka_security.KafkaSecurity.from_env),
    # with the Secret's files where the pod has them (the TLS ones left out: no real PEM here).
    from events.kafka_security import KafkaSecurity

    (tmp_path / "password").write_text("s3cret\n")
    pod_env = {k: v.replace(SECRET_DIR, str(tmp_path)) for k, v in want.items() if "_SSL_" not in k}
    read = KafkaSecurity.from_env(pod_env)
    if name == "security":
        assert (read.security_protocol, read.sasl_mechanism, read.sasl_username) == (
            "SASL_SSL",
            "SCRAM-SHA-512",
            "gpuledger",
        )
        assert read.sasl_password == "s3cret"
    else:
        assert read.security_protocol == "PLAINTEXT"


def test_console_with_its_token(helm: Helm, tmp_path: Path) -> None:
    """Without the proxy the console listens on the pod IP and wants its token."""
    objects = helm.render(tmp_path, CONSOLE_VALUES["console-token"])
    console = container(deployments(objects)["projector"])
    assert console["args"][0] == "serve" and arg(console["args"], "--listen") == "0.0.0.0:8080"
    (token,) = [e for e in console["env"] if e["name"] == "GPULEDGER_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "console-token", "key": "token"}
    (svc,) = [o for o in by_kind(objects, "Service") if o["metadata"]["name"].endswith("-console")]
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == "http"
    assert {"name": "http", "containerPort": 8080} in console["ports"]
    assert not by_kind(objects, "NetworkPolicy")


def test_console_sql_limits(helm: Helm, tmp_path: Path) -> None:
    """The console's SQL limits are values of the chart, passed to `serve` in both modes;
    by default its memory limit stays below the projector's container limit."""
    defaults = container(
        deployments(helm.render(tmp_path, CONSOLE_VALUES["console-token"]))["projector"]
    )
    args = [str(a) for a in defaults["args"]]
    check_command("chart (console-token) projector", args)
    assert arg(args, "--sql-timeout") == "10" and arg(args, "--sql-max-rows") == "10000"
    assert (
        arg(args, "--sql-memory") == "512MB" and defaults["resources"]["limits"]["memory"] == "1Gi"
    )
    limits = {"timeoutSeconds": 2.5, "maxRows": 500, "maxBytes": 1048576}
    limits |= {"maxConcurrent": 2, "memoryLimit": "256MiB"}
    for name in ("console-token", "console-proxy"):
        values = copy.deepcopy(CONSOLE_VALUES[name])
        values["projector"]["console"]["sql"] = limits
        (console,) = [
            c
            for c in deployments(helm.render(tmp_path, values))["projector"]["spec"]["template"][
                "spec"
            ]["containers"]
            if c["name"] == "projector"
        ]
        args = [str(a) for a in console["args"]]
        check_command(f"chart ({name}) projector", args)
        got = {f: arg(args, f) for f in ("--sql-timeout", "--sql-max-rows", "--sql-max-bytes")}
        assert got == {
            "--sql-timeout": "2.5",
            "--sql-max-rows": "500",
            "--sql-max-bytes": "1048576",
        }
        assert arg(args, "--sql-concurrency") == "2" and arg(args, "--sql-memory") == "256MiB"
    bad = copy.deepcopy(CONSOLE_VALUES["console-token"])
    bad["projector"]["console"]["sql"] = {"memoryLimit": "lots"}
    with pytest.raises(AssertionError, match="memoryLimit"):
        helm.render(tmp_path, bad)


def test_console_behind_the_auth_proxy(helm: Helm, tmp_path: Path) -> None:
    """oauth2-proxy beside the console in the projector's pod is the only way in: the console
    listens on the pod's loopback without a token, the Service and the NetworkPolicy lead
    to the proxy's port, and the proxy's secrets come from a Secret."""
    values = CONSOLE_VALUES["console-proxy"]
    objects = helm.render(tmp_path, values)
    dep = deployments(objects)["projector"]
    pod = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"projector", "auth-proxy"}
    console, proxy = containers["projector"], containers["auth-proxy"]

    # the console: gpuledger serve on 127.0.0.1, no port for the pod, no token anywhere
    check_command("chart (console-proxy) projector", [str(a) for a in console["args"]])
    assert console["args"][0] == "serve"
    assert arg(console["args"], "--listen") == "127.0.0.1:8080"
    assert "ports" not in console
    assert all(e["name"] != "GPULEDGER_TOKEN" for e in console["env"])
    assert "GPULEDGER_TOKEN" not in yaml.safe_dump(objects)

    # the proxy: the values' image, forwarding to the console's loopback address
    assert proxy["image"] == "quay.io/oauth2-proxy/oauth2-proxy:v7.12.0"
    flags = dict(a.removeprefix("--").split("=", 1) for a in proxy["args"])
    assert flags["upstream"] == "http://127.0.0.1:8080/"
    assert flags["provider"] == "oidc"
    assert flags["oidc-issuer-url"] == "https://id.example.com/realms/gpu"
    assert flags["allowed-group"] == "gpu-admins"  # extraArgs, after the chart's own
    (http,) = proxy["ports"]
    assert http["name"] == "http"
    assert flags["http-address"] == f"0.0.0.0:{http['containerPort']}"
    env = {e["name"]: e for e in proxy["env"]}
    assert env["OAUTH2_PROXY_CLIENT_ID"]["value"] == "gpuledger-console"
    for var, key in (
        ("OAUTH2_PROXY_CLIENT_SECRET", "client-secret"),
        ("OAUTH2_PROXY_COOKIE_SECRET", "cookie-secret"),
    ):
        assert "value" not in env[var]  # never the secret itself
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "console-oauth", "key": key}
    assert proxy["readinessProbe"]["httpGet"]["port"] == "http"
    assert proxy["securityContext"]["allowPrivilegeEscalation"] is False
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["resources"]["requests"]

    # the Service's target is the proxy's port, the only port named http in the pod
    (svc,) = [o for o in by_kind(objects, "Service") if o["metadata"]["name"].endswith("-console")]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    (port,) = svc["spec"]["ports"]
    named = [
        p for c in pod["containers"] for p in c.get("ports", []) if p["name"] == port["targetPort"]
    ]
    assert named == [http]

    # the NetworkPolicy: the projector's pod, the proxy's port, from the given peers only
    (policy,) = by_kind(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == PROXY_FROM


# ------------------------------------------------------- commands are real gpuledger commands


def gpuledger_argv() -> list[str]:
    script = Path(sys.executable).parent / "gpuledger"
    return [str(script)] if script.exists() else [sys.executable, "-m", "scheduler.cli"]


@functools.cache
def help_flags(path: tuple[str, ...]) -> frozenset[str]:
    """The flags `gpuledger PATH --help` lists (exit 0, or PATH is not a command)."""
    proc = subprocess.run(
        [*gpuledger_argv(), *path, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"gpuledger {' '.join(path)} --help: {proc.stderr}"
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", proc.stdout))


def check_command(where: str, argv: list[str]) -> None:
    """``argv`` names a `gpuledger` subcommand whose --help lists every flag given, and
    parses whole (values, required flags) with the CLI's own parser."""
    from events.kafkalog import parse_url
    from scheduler.cli import build_parser

    first_flag = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    path = tuple(argv[:first_flag])
    assert path, where
    known = help_flags(path)
    flags = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
    unknown = [f for f in flags if f not in known]
    assert not unknown, f"{where}: `gpuledger {' '.join(path)}` has no {unknown}"
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{where}: `gpuledger {' '.join(argv)}` does not parse") from exc
    assert callable(args.func), where
    for a in argv:
        if a.startswith("kafka://"):
            parse_url(a)  # raises unless a kafka://HOST:PORT/PREFIX the readers accept


def test_every_command_is_a_real_gpuledger_command(helm: Helm, tmp_path: Path) -> None:
    commands: dict[str, list[str]] = {}
    for name, values in VALUES.items():
        for comp, dep in deployments(helm.render(tmp_path, values)).items():
            commands[f"chart ({name}) {comp}"] = [str(a) for a in container(dep)["args"]]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for svc_name, svc in compose.items():
        if "build" in svc:
            commands[f"compose.yaml {svc_name}"] = [str(a) for a in svc["command"]]
    assert len(commands) >= 10
    for where, argv in commands.items():
        check_command(where, argv)


# ------------------------------------------------------------ against the real API server


@pytest.fixture(scope="module")
def api() -> Any:
    from scheduler.kube.client import api_client

    ensure_control_plane()
    return api_client(str(KUBECONFIG))


def ensure_namespace(api: Any, name: str) -> str:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


@pytest.mark.kube
@pytest.mark.parametrize("name", ALL_VALUES)
def test_api_server_accepts_every_object(helm: Helm, api: Any, tmp_path: Path, name: str) -> None:
    """Server-side apply, dry run, strict field validation: the API server runs defaulting,
    validation and admission on every object (CRDs first) and stores nothing."""
    from kubernetes import dynamic

    ns = ensure_namespace(api, "gpuledger-helm-dryrun")
    objects = helm.render(tmp_path, ALL_VALUES[name], namespace=ns)
    objects.sort(key=lambda o: o["kind"] != "CustomResourceDefinition")
    dyn = dynamic.DynamicClient(api)
    for obj in objects:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        applied = resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager="gpuledger-test-helm",
            force_conflicts=True,
            dry_run="All",
            query_params=[("fieldValidation", "Strict")],
        )
        assert applied.metadata.name == obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            spec = applied.to_dict()["spec"]["template"]["spec"]
            assert [(c["name"], c["args"]) for c in spec["containers"]] == [
                (c["name"], c["args"]) for c in obj["spec"]["template"]["spec"]["containers"]
            ]


def review(api: Any, ns: str, account: str, verb: str, resource: str, group: str = "") -> bool:
    """Whether ServiceAccount ns/account may `verb` `resource` in some namespace."""
    from kubernetes import client

    sub = ""
    if "/" in resource:
        resource, sub = resource.split("/", 1)
    attrs = {"verb": verb, "resource": resource, "group": group, "namespace": "team-a"}
    if sub:
        attrs["subresource"] = sub
    if resource in {"nodes", "queues"}:
        del attrs["namespace"]
    body = {
        "spec": {
            "user": f"system:serviceaccount:{ns}:{account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{ns}",
                "system:authenticated",
            ],
            "resourceAttributes": attrs,
        }
    }
    result = client.AuthorizationV1Api(api).create_subject_access_review(body)
    return bool(result.status.allowed)


@pytest.mark.kube
def test_helm_install_grants_each_component_exactly_its_rights(
    helm: Helm, api: Any, tmp_path: Path
) -> None:
    """`helm install` as a user runs it (the CRD from crds/ unless the cluster has it, the
    namespace created by helm), then the API server's authorizer answers for each
    ServiceAccount; `helm uninstall` after. The namespace stays: without a controller-manager
    a deleted namespace is never finalized, so the next run reuses it."""
    from kubernetes import client

    ns, release = "gpuledger-helm-install", "gl-test"
    base = [f"--kubeconfig={KUBECONFIG}", f"--namespace={ns}"]
    helm("uninstall", release, "--ignore-not-found", *base)  # a run killed midway
    helm(
        "install",
        release,
        str(CHART),
        "--create-namespace",
        "--values",
        values_file(tmp_path, SECURITY_VALUES),
        *base,
    )
    try:
        apps = client.AppsV1Api(api)
        deps = {
            d.metadata.labels["app.kubernetes.io/component"]: d
            for d in apps.list_namespaced_deployment(ns).items
        }
        assert set(deps) == COMPONENTS
        assert deps["scheduler"].spec.replicas == 2
        crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(
            "queues.scheduling.gpuledger.io"
        )
        assert crd.spec.names.kind == "Queue"

        def sa(comp: str) -> str:
            return str(deps[comp].spec.template.spec.service_account_name)

        # Each component may do exactly what deploy/rbac.yaml grants it (the scheduler, the
        # projector and the clock nothing), asked for every right any component has and more.
        reference = rbac_rules(list(yaml.safe_load_all((ROOT / "deploy/rbac.yaml").read_text())))
        extra = {
            ("", "secrets", "get"),
            ("", "secrets", "list"),
            ("", "pods", "delete"),
            ("", "pods", "create"),
            ("", "nodes", "update"),
            ("", "configmaps", "get"),
            ("scheduling.gpuledger.io", "queues", "create"),
            ("apps", "deployments", "get"),
        }
        asked = set().union(*reference.values()) | extra
        for comp in COMPONENTS:
            mine = reference.get(comp, set())
            for group, res, verb in sorted(asked):
                got = review(api, ns, sa(comp), verb, res, group)
                assert got == ((group, res, verb) in mine), (comp, verb, res, group)
    finally:
        helm("uninstall", release, *base)
    rbac = client.RbacAuthorizationV1Api(api)
    left = [
        r.metadata.name
        for r in rbac.list_cluster_role().items
        if r.metadata.name.startswith(release)
    ]
    assert not left, left


def test_the_grafana_dashboard_charts_documented_metrics(helm: Helm, tmp_path: Path) -> None:
    """The dashboard ConfigMap carries the Grafana sidecar's label, its JSON parses, and
    every metric a panel queries is one docs/operations.md lists (which the live test
    scrapes from a running service)."""
    objects = helm.render(tmp_path, {})
    (board,) = [
        o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")
    ]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(board["data"]["gpuledger.json"])
    table = (ROOT / "docs" / "operations.md").read_text().split("<!-- metrics:", 1)[1]
    documented = set(
        re.findall(r"^\| `(gpuledger_\w+)`", table.split("<!-- /metrics -->")[0], re.M)
    )
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"gpuledger_\w+", target["expr"]):
                queried.add(re.sub(r"_(bucket|count|sum)$", "", name))
    assert queried and queried <= documented, queried - documented
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("fair share", "pending", "time to ready", "preemption", "lost", "cycle"):
        assert topic in titles, topic
    assert not by_kind(helm.render(tmp_path, {"dashboard": {"enabled": False}}), "ConfigMap")
