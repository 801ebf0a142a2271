"""compose.yaml: every service's command is a real CLI command and every build path exists."""

from __future__ import annotations

from pathlib import Path

import yaml

from scheduler.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def services() -> dict[str, dict[str, object]]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    result: dict[str, dict[str, object]] = data["services"]
    return result


def test_every_service_command_parses() -> None:
    parser = build_parser()
    commands = 0
    for name, svc in services().items():
        if "build" not in svc:
            continue
        command = svc["command"]
        assert isinstance(command, list), name
        args = parser.parse_args([str(c) for c in command])  # exits (fails) if not a command
        assert callable(args.func), name
        commands += 1
    assert commands >= 3


def test_build_paths_and_images_exist() -> None:
    for name, svc in services().items():
        if "build" in svc:
            context = ROOT / str(svc["build"])
            assert context.is_dir(), name
            dockerfile = (context / "Dockerfile").read_text()
            stages = {
                line.split()[-1].lower()
                for line in dockerfile.splitlines()
                if line.upper().startswith("FROM ") and " AS " in line.upper()
            }
            for line in dockerfile.splitlines():
                if not line.startswith("COPY "):
                    continue
                words = line.split()[1:-1]
                source = [w for w in words if w.startswith("--from=")]
                if source:  # from an earlier build stage of this Dockerfile
                    stage = source[0].removeprefix("--from=").lower()
                    assert stage in stages, f"{name}: no build stage {stage!r}"
                    continue
                for src in words:
                    assert (context / src).exists(), f"{name}: {src} missing"
        else:
            assert str(svc["image"]).startswith("apache/kafka:4."), name


def test_services_cover_the_live_path() -> None:
    commands = {str(s["command"][0]) for s in services().values() if "command" in s}  # type: ignore[index]
    assert {"scheduler", "clock", "project"} <= commands


def test_kube_adapters_run_on_the_kafka_deployment() -> None:
    """Kubernetes mode is Kafka too: ingest writes the intake topic and the binder follows
    the ledger topic of the deployment the scheduler service runs (bootstrap and prefix),
    and writes to its intake; no volume is shared and no embedded scheduler runs."""
    svc = services()

    def arg(name: str, flag: str) -> str:
        command = [str(c) for c in svc[name]["command"]]  # type: ignore[attr-defined]
        return command[command.index(flag) + 1]

    scheduler = [str(c) for c in svc["scheduler"]["command"]]  # type: ignore[attr-defined]
    prefix = arg("scheduler", "--prefix") if "--prefix" in scheduler else "gpuledger"
    url = f"kafka://{arg('scheduler', '--bootstrap')}/{prefix}"
    assert svc["ingest"]["command"][:2] == ["kube", "ingest"]  # type: ignore[index]
    assert svc["binder"]["command"][:2] == ["kube", "bind"]  # type: ignore[index]
    assert arg("ingest", "--intake") == url
    assert arg("binder", "--ledger") == arg("binder", "--intake") == url
    for name in ("ingest", "binder"):
        assert svc[name]["profiles"] == ["kube"], name
        assert "kafka" in svc[name]["depends_on"], name  # type: ignore[operator]
    commands = [[str(c) for c in s.get("command", [])] for s in svc.values()]  # type: ignore[attr-defined]
    assert not any(c[:2] == ["kube", "schedule"] for c in commands)  # the scheduler serves it

    # Named volumes (not bind mounts of host files) are the only thing pods could share.
    named: dict[str, list[str]] = {}
    for name, s in svc.items():
        for v in s.get("volumes", []):  # type: ignore[attr-defined]
            source = _interpolate(str(v), {}).split(":")[0]
            if not source.startswith((".", "/", "~")):
                named.setdefault(source, []).append(name)
    assert named == {"history": ["projector"]}, named
    top = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert set(top["volumes"]) == {"history"}


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${NAME:-default}`` substitution, the only form compose.yaml uses."""
    import re

    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), value)


def test_kafka_clients_take_security_settings_and_mounted_secrets(tmp_path: Path) -> None:
    """Every service that talks to Kafka gets the GPULEDGER_KAFKA_* settings and the secrets
    directory; unset, they mean PLAINTEXT; set, they reach KafkaSecurity as given."""
    from events.kafka_security import ENV_PREFIX, KafkaSecurity

    svc = services()
    kafka_clients = [n for n, s in svc.items() if "kafka:9092" in str(s.get("command"))]
    assert {"scheduler", "scheduler-standby", "clock", "projector"} <= set(kafka_clients)
    for name in kafka_clients:
        env = svc[name]["environment"]
        assert isinstance(env, dict), name
        for key in (
            "SECURITY_PROTOCOL",
            "SASL_MECHANISM",
            "SASL_USERNAME",
            "SASL_PASSWORD_FILE",
            "SSL_CAFILE",
            "SSL_CERTFILE",
            "SSL_KEYFILE",
        ):
            assert f"{ENV_PREFIX}{key}" in env, (name, key)
        assert "SASL_PASSWORD" not in {k.removeprefix(ENV_PREFIX) for k in env}, name  # files only
        mounts = [_interpolate(str(v), {}) for v in svc[name]["volumes"]]  # type: ignore[attr-defined]
        assert "./deploy/kafka-secrets:/run/gpuledger:ro" in mounts, name
        assert (ROOT / "deploy" / "kafka-secrets").is_dir()

        unset = {k: _interpolate(str(v), {}) for k, v in env.items()}
        assert KafkaSecurity.from_env(unset).security_protocol == "PLAINTEXT", name

        password = tmp_path / "password"
        password.write_text("s3cret\n")
        host = {
            f"{ENV_PREFIX}SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            f"{ENV_PREFIX}SASL_MECHANISM": "SCRAM-SHA-512",
            f"{ENV_PREFIX}SASL_USERNAME": "gpuledger",
            f"{ENV_PREFIX}SASL_PASSWORD_FILE": str(password),
        }
        given = KafkaSecurity.from_env({k: _interpolate(str(v), host) for k, v in env.items()})
        assert (given.security_protocol, given.sasl_mechanism, given.sasl_username) == (
            "SASL_PLAINTEXT",
            "SCRAM-SHA-512",
            "gpuledger",
        ), name
        assert given.sasl_password == "s3cret", name
