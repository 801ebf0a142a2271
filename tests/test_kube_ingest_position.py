"""The ingestor's resume position and restarts, without an API server: watch messages are
handed to ``Ingestor.handle`` directly (Events, a courtesy, are recorded instead of sent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from events.codec import decode_event
from events.filelog import LedgerDirReader
from events.model import Event, JobRejected, JobSubmitted, PodDeleted, PodStarted
from scheduler.kube import ingest
from scheduler.kube.ingest import Ingestor

NS = "team-ns"


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    monkeypatch.setattr(
        ingest, "emit_event", lambda _core, _obj, reason, *a, **k: sent.append(reason)
    )
    return sent


def _api() -> client.ApiClient:
    return client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # never called


def _queue() -> dict[str, Any]:
    return {"metadata": {"name": "team"}, "spec": {"namespaces": [NS]}}


def _pod(
    name: str, uid: str, *, phase: str = "Pending", group: str = "", **annotations: str
) -> dict[str, Any]:
    labels = {"gpuledger.io/queue": "team"}
    if group:
        labels["gpuledger.io/pod-group"] = group
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": "1",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "gpuledger",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": phase},
    }


def _intake(path: Path) -> list[Event]:
    return [decode_event(env, off) for off, env in LedgerDirReader(path / "ingest").read()]


def _start(intake: Path) -> Ingestor:
    ing = Ingestor(_api(), intake)
    ing.handle("queue", "SYNC", ([_queue()], "1"))
    ing.flush()
    return ing


def test_the_position_holds_no_uid_of_a_submitted_pod_and_a_restart_repeats_nothing(
    tmp_path: Path,
) -> None:
    intake = tmp_path / "intake"
    good = [_pod(f"p-{i}", f"uid-{i}") for i in range(50)]
    bad = _pod("bad", "uid-bad", **{"gpuledger.io/priority-class": "nonsense"})
    unread = _pod("unread", "uid-unread", group="g", **{"gpuledger.io/min-member": "many"})
    ing = _start(intake)
    ing.handle("pod", "SYNC", ([*good, bad, unread], "10"))
    ing.flush()
    saved = ing.sink.saved()
    # Only the rejected pods' uids: no intake record names them.
    assert saved["uids"] == {
        "uid-bad": [f"{NS}/bad", "bad"],
        "uid-unread": [f"{NS}/unread", "unread"],
    }, saved
    ing.close()
    said = _intake(intake)
    assert sum(isinstance(e, JobSubmitted) for e in said) == 50
    assert [e.job for e in said if isinstance(e, JobRejected)] == [f"{NS}/bad", f"{NS}/unread"]

    # Restarted: the same pods, one of them now running, one deleted meanwhile.
    ing = _start(intake)
    assert ing.uids["uid-7"] == (f"{NS}/p-7", "p-7")  # from its JobSubmitted
    now = [p for p in good if p["metadata"]["name"] != "p-3"]
    now[0] = _pod("p-0", "uid-0", phase="Running")
    ing.handle("pod", "SYNC", ([*now, bad, unread], "20"))
    ing.flush()
    ing.close()
    new = _intake(intake)[len(said) :]
    assert [type(e).__name__ for e in new] == ["PodStarted", "PodDeleted"] or [
        type(e).__name__ for e in new
    ] == ["PodDeleted", "PodStarted"], new
    assert {(e.job, e.pod) for e in new if isinstance(e, PodStarted | PodDeleted)} == {
        (f"{NS}/p-0", "p-0"),
        (f"{NS}/p-3", "p-3"),
    }


def test_a_pod_deleted_while_down_is_forgotten_with_its_uid(tmp_path: Path) -> None:
    intake = tmp_path / "intake"
    bad = _pod("bad", "uid-bad", **{"gpuledger.io/priority-class": "nonsense"})
    ing = _start(intake)
    ing.handle("pod", "SYNC", ([_pod("a", "uid-a"), bad], "10"))
    ing.flush()
    ing.close()
    ing = _start(intake)
    ing.handle("pod", "SYNC", ([], "20"))  # both gone
    ing.flush()
    assert ing.sink.saved()["uids"] == {}
    assert ing.uids == {}
    ing.close()
    deleted = [e for e in _intake(intake) if isinstance(e, PodDeleted)]
    assert [(e.job, e.pod) for e in deleted] == [(f"{NS}/a", "a")]
    # Re-created under the same names: new jobs, not the old ones again.
    ing = _start(intake)
    ing.handle("pod", "SYNC", ([_pod("a", "uid-a2")], "30"))
    ing.flush()
    ing.close()
    jobs = [e.job for e in _intake(intake) if isinstance(e, JobSubmitted)]
    assert jobs == [f"{NS}/a", f"{NS}/a#2"]
