"""Kafka client TLS and SASL: configuration, redaction, and the live path on the real broker.

The unit tests need no broker: validation names the option (flag and environment variable)
and fails before anything connects; the password never appears in a repr, ``--help``, an
error message or a log record. The integration tests use the listeners ``scripts/kafka.sh``
adds to the test broker (SASL_PLAINTEXT and SASL_SSL with PLAIN and SCRAM users, SSL with a
required client certificate): the whole live path over SASL (CLI producers, the scheduler
service, ``kafka://`` readers), and the clear, non-zero, secret-free failure of a wrong
password or a wrong protocol.
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from events import kafka_security
from events.kafka_admin import KafkaSettings, create_topics, run_sync
from events.kafka_security import KafkaAuthError, KafkaConfigError, KafkaLogError, KafkaSecurity
from events.kafkalog import KafkaLedger, KafkaReader, open_kafka_reader
from scheduler import cli
from scheduler.fold.verify import run as replay
from tests.kafkakit import SASL_PASSWORD, SASL_USER, Listeners, fresh_settings, kafka, listeners
from tests.test_live_kafka import (
    Service,
    caught_up,
    ledger_envelopes,
    read_all,
    services,
    start,
    wait_for,
)

__all__ = ["kafka", "listeners", "services"]

ROOT = Path(__file__).resolve().parent.parent
ENV_VARS = [
    f"GPULEDGER_KAFKA_{name}"
    for name in (
        "SECURITY_PROTOCOL",
        "SASL_MECHANISM",
        "SASL_USERNAME",
        "SASL_PASSWORD",
        "SASL_PASSWORD_FILE",
        "SSL_CAFILE",
        "SSL_CERTFILE",
        "SSL_KEYFILE",
    )
]
WRONG = "Wr0ng-" + uuid.uuid4().hex[:12]
"""A wrong password nobody could mistake for anything else in an output."""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No security settings leak in from the environment of whoever runs the tests."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def secret_file(tmp_path: Path, password: str, name: str = "password") -> str:
    path = tmp_path / name
    path.write_text(password + "\n")
    path.chmod(0o600)
    return str(path)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(extra)
    return env


def gpuledger(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env if env is not None else child_env(),
        timeout=120,
        check=False,
    )


def sasl_flags(password_file: str, mechanism: str = "PLAIN") -> list[str]:
    return [
        "--security-protocol",
        "SASL_PLAINTEXT",
        "--sasl-mechanism",
        mechanism,
        "--sasl-username",
        SASL_USER,
        "--sasl-password-file",
        password_file,
    ]


# --------------------------------------------------------------------------- configuration


def test_default_is_plaintext_with_no_extra_client_arguments() -> None:
    assert KafkaSecurity().client_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert KafkaSettings().security == KafkaSecurity()


def test_sasl_and_tls_client_arguments(tmp_path: Path) -> None:
    sasl = KafkaSecurity("sasl_plaintext", "scram-sha-256", sasl_username="u", sasl_password="pw")
    assert sasl.security_protocol == "SASL_PLAINTEXT" and sasl.sasl_mechanism == "SCRAM-SHA-256"
    assert sasl.client_kwargs() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "u",
        "sasl_plain_password": "pw",
    }
    tls = KafkaSecurity("SASL_SSL", sasl_username="u", sasl_password="pw")
    kwargs = tls.client_kwargs()
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].check_hostname
    assert kwargs["security_protocol"] == "SASL_SSL"


def _pem_pair(tmp_path: Path, encrypted: bool = False) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-keyout", str(key)]
    cmd += ["-out", str(cert), "-days", "1", "-subj", "/CN=t"]
    cmd += ["-passout", "pass:keypass"] if encrypted else ["-nodes"]
    subprocess.run(cmd, check=True, capture_output=True)
    return str(cert), str(key)


BAD_CONFIGS = [
    ({"security_protocol": "SASL_TLS"}, "security_protocol", "--security-protocol"),
    (
        {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI"},
        "sasl_mechanism",
        "GPULEDGER_KAFKA_SASL_MECHANISM",
    ),
    ({"security_protocol": "SASL_PLAINTEXT"}, "sasl_username", "--sasl-username"),
    (
        {"security_protocol": "SASL_SSL", "sasl_username": "u"},
        "sasl_password",
        "GPULEDGER_KAFKA_SASL_PASSWORD_FILE",
    ),
    ({"sasl_username": "u"}, "sasl_username", "has no SASL"),
    ({"ssl_cafile": "/etc/hostname"}, "ssl_cafile", "does not use TLS"),
    ({"security_protocol": "SSL", "ssl_cafile": "/no/such/ca.pem"}, "ssl_cafile", "no such file"),
    ({"security_protocol": "SSL", "ssl_cafile": "/etc"}, "ssl_cafile", "no such file"),
    ({"security_protocol": "SSL", "ssl_keyfile": "/etc/hostname"}, "ssl_certfile", "required"),
]


@pytest.mark.parametrize(("options", "option", "says"), BAD_CONFIGS)
def test_bad_configuration_names_the_option(
    options: dict[str, str], option: str, says: str
) -> None:
    with pytest.raises(KafkaConfigError) as err:
        KafkaSecurity(**options)
    assert option in str(err.value) and says in str(err.value)


def test_unusable_tls_files_name_the_option(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(KafkaConfigError, match=r"ssl_cafile: .*not a PEM CA bundle"):
        KafkaSecurity("SSL", ssl_cafile=str(garbage))
    cert, key = _pem_pair(tmp_path)
    ok = KafkaSecurity("SSL", ssl_cafile=cert, ssl_certfile=cert, ssl_keyfile=key)
    assert ok.client_kwargs()["ssl_context"] is not None
    with pytest.raises(KafkaConfigError, match=r"ssl_certfile: .*cannot load"):
        KafkaSecurity("SSL", ssl_certfile=str(garbage))
    enc_cert, enc_key = _pem_pair(tmp_path / "..", encrypted=True)
    # No prompt on the terminal: an encrypted key is refused with the option's name.
    with pytest.raises(KafkaConfigError, match=r"ssl_keyfile: .*encrypted"):
        KafkaSecurity("SSL", ssl_certfile=enc_cert, ssl_keyfile=enc_key)


def test_password_is_redacted_in_repr_and_str() -> None:
    password = "s3cret-" + uuid.uuid4().hex
    sec = KafkaSecurity("SASL_SSL", sasl_username="alice", sasl_password=password)
    settings = KafkaSettings(security=sec)
    for text in (repr(sec), str(sec), repr(settings), str(settings), f"{settings}"):
        assert password not in text
        assert "alice" in text and "sasl_password='***'" in text
    assert "sasl_password=None" in repr(KafkaSecurity())
    assert sec.describe() == "SASL_SSL, PLAIN as 'alice'"


def test_from_env(tmp_path: Path) -> None:
    pw_file = secret_file(tmp_path, "from-file")
    env = {
        "GPULEDGER_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
        "GPULEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "GPULEDGER_KAFKA_SASL_USERNAME": "bob",
        "GPULEDGER_KAFKA_SASL_PASSWORD": "from-env",
    }
    sec = KafkaSecurity.from_env(env)
    assert (sec.security_protocol, sec.sasl_mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert (sec.sasl_username, sec.sasl_password) == ("bob", "from-env")
    # A flag (keyword) wins over the environment; a password file's newline is dropped.
    sec = KafkaSecurity.from_env(env, sasl_username="carol", sasl_password_file=pw_file)
    assert (sec.sasl_username, sec.sasl_password) == ("carol", "from-file")
    file_env = {**env, "GPULEDGER_KAFKA_SASL_PASSWORD_FILE": pw_file}
    with pytest.raises(KafkaConfigError, match="both the password and a password file"):
        KafkaSecurity.from_env(file_env)
    del file_env["GPULEDGER_KAFKA_SASL_PASSWORD"]
    assert KafkaSecurity.from_env(file_env).sasl_password == "from-file"
    with pytest.raises(KafkaConfigError) as err:
        KafkaSecurity.from_env(env, sasl_password_file=str(tmp_path / "missing"))
    assert "no such file" in str(err.value) and "--sasl-password-file" in str(err.value)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(KafkaConfigError, match="empty"):
        KafkaSecurity.from_env(env, sasl_password_file=str(empty))
    assert KafkaSecurity.from_env({}) == KafkaSecurity()


def test_settings_take_security_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULEDGER_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("GPULEDGER_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("GPULEDGER_KAFKA_SASL_PASSWORD", "env-password")
    assert KafkaSettings().security.sasl_username == "env-user"
    monkeypatch.delenv("GPULEDGER_KAFKA_SASL_PASSWORD")
    with pytest.raises(KafkaConfigError, match="sasl_password"):
        KafkaSettings()


def test_log_filter_redacts_the_authentication_request() -> None:
    """aiokafka logs every request at DEBUG, the SASL one with its credentials."""

    class SaslAuthenticateRequest_v1:  # noqa: N801  # aiokafka's class name
        def __repr__(self) -> str:
            return "SaslAuthenticateRequest_v1(sasl_auth_bytes=b'u\\x00u\\x00unregistered')"

    record = logging.LogRecord(
        "aiokafka.conn",
        logging.DEBUG,
        __file__,
        1,
        "Request %d: %s",
        (3, SaslAuthenticateRequest_v1()),
        None,
    )
    assert logging.getLogger("aiokafka.conn").filter(record)
    assert "unregistered" not in record.getMessage()
    assert "SaslAuthenticateRequest_v1(<credentials ***>)" in record.getMessage()
    # Any password this process was given is blanked out of aiokafka's messages too.
    KafkaSecurity("SASL_PLAINTEXT", sasl_username="u", sasl_password="registered-pw")
    record = logging.LogRecord(
        "aiokafka", logging.ERROR, __file__, 1, "oops %s", ("registered-pw",), None
    )
    kafka_security._install_log_redaction()
    assert logging.getLogger("aiokafka").filter(record)  # aiokafka.client logs there
    assert record.getMessage() == "oops ***"


# --------------------------------------------------------------------------- the CLI, no broker


def test_help_shows_the_options_and_no_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEDGER_KAFKA_SASL_PASSWORD", "env-password-xyz")
    for command in (["submit"], ["scheduler", "run"], ["dlq", "list"], ["clock"]):
        with pytest.raises(SystemExit) as done:
            cli.main([*command, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "env-password-xyz" not in out
        for flag in (
            "--security-protocol",
            "--sasl-mechanism",
            "--sasl-username",
            "--sasl-password-file",
            "--ssl-cafile",
            "--ssl-certfile",
            "--ssl-keyfile",
        ):
            assert flag in out
        assert "--sasl-password " not in out and "--sasl-password\n" not in out


def test_password_on_the_command_line_is_refused_without_echo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for form in (["--sasl-password", "hunter2-xyz"], ["--sasl-password=hunter2-xyz"]):
        with pytest.raises(SystemExit) as done:
            cli.main(["dlq", "list", *form])
        assert done.value.code == 2
        captured = capsys.readouterr()
        assert "--sasl-password-file" in captured.err
        assert "hunter2" not in captured.err + captured.out


BAD_FLAGS = [
    (["--security-protocol", "TLS"], "--security-protocol"),
    (["--security-protocol", "SASL_PLAINTEXT"], "--sasl-username"),
    (
        [
            "--security-protocol",
            "SASL_SSL",
            "--sasl-username",
            "u",
            "--sasl-password-file",
            "/no/pw",
        ],
        "--sasl-password-file",
    ),
    (["--security-protocol", "SSL", "--ssl-cafile", "/no/such/ca.pem"], "--ssl-cafile"),
    (["--ssl-cafile", "/etc/hostname"], "--ssl-cafile"),
    (["--sasl-mechanism", "MD5"], "--sasl-mechanism"),
]


@pytest.mark.parametrize(("flags", "option"), BAD_FLAGS)
@pytest.mark.parametrize(
    "command", [["submit", "-f", "JOB"], ["scheduler", "run"], ["dlq", "list"]]
)
def test_bad_flags_fail_before_connecting(
    flags: list[str],
    option: str,
    command: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import scheduler.runtime.intake
    import scheduler.runtime.service

    def no_connection(*args: object, **kwargs: object) -> None:
        raise AssertionError("a connection was tried")

    monkeypatch.setattr(scheduler.runtime.intake, "run_sync", no_connection)
    monkeypatch.setattr(scheduler.runtime.service, "run_service", no_connection)
    job = tmp_path / "job.yaml"
    job.write_text("job: j\nqueue: q\npods: [{name: p}]\n")
    argv = [str(job) if a == "JOB" else a for a in command]
    assert cli.main([*argv, "--bootstrap", "127.0.0.1:1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuledger: Kafka ") and option in err


def test_bad_environment_fails_before_connecting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEDGER_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("GPULEDGER_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("GPULEDGER_KAFKA_SASL_PASSWORD_FILE", "/no/such/password")
    assert cli.main(["dlq", "list", "--bootstrap", "127.0.0.1:1"]) == 2
    assert "GPULEDGER_KAFKA_SASL_PASSWORD_FILE" in capsys.readouterr().err
    # Commands that read a kafka:// URL take their security from the environment alone.
    assert cli.main(["log", "cat", "kafka://127.0.0.1:1/gpuledger"]) == 2
    assert "/no/such/password: no such file" in capsys.readouterr().err


# --------------------------------------------------------------------------- the real broker


@pytest.fixture
def password_file(tmp_path: Path) -> str:
    return secret_file(tmp_path, SASL_PASSWORD)


@pytest.fixture
def wrong_password_file(tmp_path: Path) -> str:
    return secret_file(tmp_path, WRONG, "wrong")


def _assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SASL_PASSWORD not in text
        assert WRONG not in text


@pytest.mark.integration
def test_live_path_end_to_end_over_sasl(
    listeners: Listeners,
    services: list[Service],
    tmp_path: Path,
    password_file: str,
) -> None:
    """CLI producers (flags and environment), the scheduler service and readers, all over
    SASL_PLAINTEXT: jobs submitted are allocated and the ledger replays."""
    s = fresh_settings(listeners.sasl_plaintext, security=listeners.sasl())
    svc = start(services, s, tmp_path, *sasl_flags(password_file))
    env = child_env(
        GPULEDGER_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        GPULEDGER_KAFKA_SASL_MECHANISM="SCRAM-SHA-256",  # the same user, another mechanism
        GPULEDGER_KAFKA_SASL_USERNAME=SASL_USER,
        GPULEDGER_KAFKA_SASL_PASSWORD_FILE=password_file,
    )
    common = ["--bootstrap", s.bootstrap, "--prefix", s.prefix]
    queues = ROOT / "replay" / "examples" / "demo-queues.yaml"
    nodes = ROOT / "replay" / "examples" / "demo-cluster.yaml"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        "  - {job: sasl-a, queue: training, pods: [{name: p0, gpu_milli: 4000}]}\n"
        "  - {job: sasl-b, queue: training, pods: [{name: p0, gpu_milli: 8000}]}\n"
    )
    outputs = []
    for argv in (
        ["queues", "apply", "-f", str(queues), *common],
        ["nodes", "apply", "-f", str(nodes), *common],
    ):
        done = gpuledger(*argv, env=env)  # security from the environment
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    done = gpuledger("submit", "-f", str(jobs), *common, *sasl_flags(password_file))  # flags
    assert done.returncode == 0, done.stderr
    assert "submitted sasl-b" in done.stdout
    outputs += [done.stdout, done.stderr]
    wait_for(lambda: caught_up(s), 60, "the scheduler to take in intake over SASL")
    allocated = {e.key for e in ledger_envelopes(s) if e.type == "pods_allocated"}
    assert allocated == {"sasl-a", "sasl-b"}
    assert svc.proc.poll() is None
    # A kafka:// URL carries no credentials: the environment supplies them.
    done = gpuledger(
        "log", "cat", f"kafka://{s.bootstrap}/{s.prefix}", "--type", "pods_allocated", env=env
    )
    assert done.returncode == 0, done.stderr
    assert "Unclosed" not in done.stderr  # the reader's consumer is closed, not collected
    assert {line.split('"key":"')[1].split('"')[0] for line in done.stdout.splitlines()} == {
        "sasl-a",
        "sasl-b",
    }
    outputs += [done.stdout, done.stderr]
    with KafkaReader(s.bootstrap, s.ledger, security=s.security) as reader:
        result = replay(reader)
    # Every intake record, and the live policy the service records first on a new ledger.
    assert result.ok and result.inputs == len(read_all(s, s.intake)) + 1
    svc.stop()
    _assert_no_secret(*outputs, svc.log.read_text())


@pytest.mark.integration
def test_tls_listeners(listeners: Listeners, monkeypatch: pytest.MonkeyPatch) -> None:
    """SASL_SSL (PLAIN and SCRAM-SHA-512) and SSL with a client certificate: the log port
    writes and reads over each; ``open_kafka_reader`` takes the environment's options."""
    pki = listeners.pki
    cases = [
        (
            listeners.sasl_ssl,
            KafkaSecurity(
                "SASL_SSL",
                sasl_username=SASL_USER,
                sasl_password=SASL_PASSWORD,
                ssl_cafile=listeners.cafile,
            ),
        ),
        (
            listeners.sasl_ssl,
            KafkaSecurity(
                "SASL_SSL",
                "SCRAM-SHA-512",
                sasl_username=SASL_USER,
                sasl_password=SASL_PASSWORD,
                ssl_cafile=listeners.cafile,
            ),
        ),
        (
            listeners.ssl,
            KafkaSecurity(
                "SSL",
                ssl_cafile=listeners.cafile,
                ssl_certfile=str(pki / "client.pem"),
                ssl_keyfile=str(pki / "client.key"),
            ),
        ),
    ]
    from events.codec import wrap
    from events.model import Tick

    for bootstrap, security in cases:
        topic = f"tls.{uuid.uuid4().hex[:10]}"
        run_sync(create_topics(bootstrap, [(topic, 1, {})], security=security))
        with KafkaLedger(bootstrap, topic, security=security) as ledger:
            first = ledger.append([wrap(Tick(), 1), wrap(Tick(), 2)])
            assert [env.at for _, env in ledger.read(first)] == [1, 2]
        monkeypatch.setenv("GPULEDGER_KAFKA_SECURITY_PROTOCOL", security.security_protocol)
        monkeypatch.setenv("GPULEDGER_KAFKA_SSL_CAFILE", listeners.cafile)
        if security.sasl:
            monkeypatch.setenv("GPULEDGER_KAFKA_SASL_MECHANISM", security.sasl_mechanism)
            monkeypatch.setenv("GPULEDGER_KAFKA_SASL_USERNAME", SASL_USER)
            monkeypatch.setenv("GPULEDGER_KAFKA_SASL_PASSWORD", SASL_PASSWORD)
        else:
            for name in ("MECHANISM", "USERNAME", "PASSWORD"):
                monkeypatch.delenv(f"GPULEDGER_KAFKA_SASL_{name}", raising=False)
            monkeypatch.setenv("GPULEDGER_KAFKA_SSL_CERTFILE", str(pki / "client.pem"))
            monkeypatch.setenv("GPULEDGER_KAFKA_SSL_KEYFILE", str(pki / "client.key"))
        with open_kafka_reader(f"kafka://{bootstrap}/{topic}?partition=0") as reader:
            assert len(list(reader.read())) == 2
    # Without the client certificate the mutual-TLS listener refuses the connection, and
    # without the CA the broker's certificate is not trusted.
    with pytest.raises(KafkaLogError, match="client certificate"):
        KafkaReader(
            listeners.ssl, topic, security=KafkaSecurity("SSL", ssl_cafile=listeners.cafile)
        )
    no_ca = KafkaSecurity("SASL_SSL", sasl_username=SASL_USER, sasl_password=SASL_PASSWORD)
    with pytest.raises(KafkaLogError, match="not trusted"):
        KafkaReader(listeners.sasl_ssl, topic, security=no_ca)


@pytest.mark.integration
def test_wrong_password_fails_clearly_without_leaking(
    listeners: Listeners, tmp_path: Path, wrong_password_file: str
) -> None:
    """Each kind of client (producer via submit, consumer via dlq list, the service, a
    kafka:// reader) stops with an authentication error, non-zero, password-free."""
    bootstrap = listeners.sasl_plaintext
    job = tmp_path / "job.yaml"
    job.write_text("job: j\nqueue: q\npods: [{name: p}]\n")
    flags = ["--bootstrap", bootstrap, "--prefix", f"t{uuid.uuid4().hex[:10]}"]
    runs = [
        gpuledger("submit", "-f", str(job), *flags, *sasl_flags(wrong_password_file)),
        gpuledger("dlq", "list", *flags, *sasl_flags(wrong_password_file, "SCRAM-SHA-512")),
        gpuledger("scheduler", "run", *flags, *sasl_flags(wrong_password_file)),
        gpuledger(
            "log",
            "cat",
            f"kafka://{bootstrap}/gpuledger",
            env=child_env(
                GPULEDGER_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
                GPULEDGER_KAFKA_SASL_USERNAME=SASL_USER,
                GPULEDGER_KAFKA_SASL_PASSWORD=WRONG,
            ),
        ),
    ]
    for done in runs:
        assert done.returncode == 2, (done.args, done.stderr)
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("gpuledger: Kafka at "), done.stderr
        assert f"as '{SASL_USER}'): SASL authentication refused by the broker" in last, last
        assert "Traceback" not in done.stderr
        _assert_no_secret(done.stdout, done.stderr)
    with pytest.raises(KafkaAuthError, match="Invalid username or password"):
        KafkaReader(bootstrap, "gpuledger.ledger", security=listeners.sasl(WRONG))


@pytest.mark.integration
def test_no_password_in_debug_logs(
    listeners: Listeners,
    tmp_path: Path,
    password_file: str,
    wrong_password_file: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In process, with every logger at DEBUG (aiokafka logs each request it sends, the SASL
    authentication included): a successful and a refused login leave no password in any
    record, nor in stdout/stderr."""
    caplog.set_level(logging.DEBUG)
    for name in ("aiokafka", "aiokafka.conn", "events", "scheduler"):
        caplog.set_level(logging.DEBUG, logger=name)
    bootstrap = listeners.sasl_plaintext
    job = tmp_path / "job.yaml"
    job.write_text("job: j\nqueue: q\npods: [{name: p}]\n")
    flags = ["--bootstrap", bootstrap, "--prefix", f"t{uuid.uuid4().hex[:10]}"]
    assert cli.main(["submit", "-f", str(job), *flags, *sasl_flags(password_file)]) == 0
    assert cli.main(["dlq", "list", *flags, *sasl_flags(password_file, "SCRAM-SHA-256")]) == 0
    assert cli.main(["submit", "-f", str(job), *flags, *sasl_flags(wrong_password_file)]) == 2
    captured = capsys.readouterr()
    assert "SASL authentication refused" in captured.err
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts = [formatter.format(r) for r in caplog.records]
    # The DEBUG records really were there, the authentication requests among them.
    assert any("SaslAuthenticateRequest" in t and "<credentials ***>" in t for t in texts)
    assert any("Authenticated as gpuledger" in t for t in texts)
    _assert_no_secret(captured.out, captured.err, *texts)


@pytest.mark.integration
def test_wrong_protocol_fails_clearly(
    listeners: Listeners, tmp_path: Path, password_file: str
) -> None:
    """A plaintext client at the SASL port, and a SASL client at the plaintext port."""
    flags = ["--prefix", f"t{uuid.uuid4().hex[:10]}"]
    done = gpuledger("dlq", "list", "--bootstrap", listeners.sasl_plaintext, *flags)
    assert done.returncode == 2
    assert "listener probably expects SASL or TLS, not PLAINTEXT" in done.stderr
    assert "Traceback" not in done.stderr
    with pytest.raises(KafkaLogError, match="expects SASL or TLS"):
        KafkaReader(listeners.sasl_plaintext, "gpuledger.ledger", security=KafkaSecurity())
    done = gpuledger(
        "dlq", "list", "--bootstrap", listeners.plaintext, *flags, *sasl_flags(password_file)
    )
    assert done.returncode == 2
    assert "refused the SASL handshake" in done.stderr
    _assert_no_secret(done.stdout, done.stderr)
