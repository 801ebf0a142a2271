"""Trace importers: the real Alibaba 2023 trace end to end, small hand-made traces exactly."""

from __future__ import annotations

import csv
import textwrap
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from events.memlog import MemoryLedger
from replay.config import (
    ClusterFile,
    ConfigError,
    NodeGroup,
    QueuesFile,
    WorkloadFile,
    load,
    parse,
)
from replay.sim import Simulation, expand
from replay.traces import (
    Columns,
    Mapping,
    encode,
    import_nodes,
    import_trace,
    load_mapping,
    node_fraction,
    shared_alibaba_dir,
)
from scheduler.cli import main
from scheduler.fold.verify import run

DATA = Path(__file__).parent / "data" / "traces"


ALIBABA = shared_alibaba_dir()
PODS = ALIBABA / "openb_pod_list_default.csv"
NODES = ALIBABA / "openb_node_list_gpu_node.csv"
needs_alibaba = pytest.mark.prereq(
    ALIBABA.is_dir(), f"the shared Alibaba trace is not present at {ALIBABA}"
)


def _yaml(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _import_cli(tmp_path: Path, *args: str) -> tuple[int, Path, Path]:
    out, queues = tmp_path / "workload.yaml", tmp_path / "queues.yaml"
    code = main(["trace", "import", *args, "--out", str(out), "--queues-out", str(queues)])
    return code, out, queues


# --------------------------------------------------------------------------- Alibaba


@pytest.fixture(scope="module")
def alibaba() -> WorkloadFile:
    # through the encoded YAML: what the simulator reads is what we check
    return parse(encode(import_trace("alibaba-openb", PODS).workload), WorkloadFile)


@needs_alibaba
def test_alibaba_import_matches_the_traces_published_counts(alibaba: WorkloadFile) -> None:
    jobs = alibaba.jobs
    assert len(jobs) == 8_152
    assert all(j.pods == 1 for j in jobs)
    shapes = Counter("fractional" if 0 < j.gpus_per_pod < 1 else int(j.gpus_per_pod) for j in jobs)
    # README: num_gpu 0:1,088; 1:6,989 of which 3,078 fractional; 2:16; 4:15; 8:44
    assert shapes == {0: 1_088, "fractional": 3_078, 1: 6_989 - 3_078, 2: 16, 4: 15, 8: 44}
    assert Counter(j.queue for j in jobs) == {"ls": 4_647, "be": 3_398, "burstable": 100,
                                              "guaranteed": 7}  # fmt: skip
    assert Counter(j.priority_class for j in jobs) == {
        "inference": 4_647, "train": 3_398, "build-preemptible": 100, "build": 7,
    }  # fmt: skip
    # creation times span 0..12,901,761 s and the file is sorted by them
    assert jobs[0].at_s == 0 and jobs[-1].at_s == 12_901_761
    assert all(j.runtime_s >= 1 for j in jobs)


@needs_alibaba
def test_alibaba_resources_survive_the_yaml_exactly(alibaba: WorkloadFile) -> None:
    """Every pod's CPU, memory and GPU share in the ledger's units equals the CSV row."""
    with PODS.open(newline="") as handle:
        rows = {r["name"]: r for r in csv.DictReader(handle)}
    pods = {j.submitted.job: j.submitted.pods[0] for j in expand(alibaba)}
    assert len(pods) == len(rows)
    for name, row in rows.items():
        pod = pods[name]
        gpus = int(row["num_gpu"])
        expected_gpu = int(row["gpu_milli"]) if gpus == 1 else gpus * 1000
        got = (pod.cpu_milli, pod.memory_mib, pod.gpu_milli)
        assert got == (int(row["cpu_milli"]), int(row["memory_mib"]), expected_gpu), name
    runtimes = {j.submitted.job: j.runtime_ms for j in expand(alibaba)}
    row = rows["openb-pod-0001"]  # scheduled at creation, still running at the trace's end
    assert runtimes["openb-pod-0001"] == (int(row["deletion_time"]) - 427_061) * 1000


@needs_alibaba
def test_alibaba_node_list_becomes_the_cluster() -> None:
    cluster = parse(encode(import_nodes(NODES)), ClusterFile)
    assert sum(g.count for g in cluster.nodes) == 1_213
    assert sum(g.count * g.gpus for g in cluster.nodes) == 6_212
    models: Counter[str] = Counter()
    for group in cluster.nodes:
        models[group.gpu_model] += group.count
        assert group.labels == {"gpu-model": group.gpu_model}
    assert models == {"G2": 549, "T4": 404, "P100": 134, "V100M16": 55, "G3": 39,
                      "V100M32": 30, "A10": 2}  # fmt: skip
    g2 = next(g for g in cluster.nodes if g.gpu_model == "G2")
    assert (g2.name, g2.gpus, g2.cpu, g2.memory_gib) == ("g2-8gpu-96c-384gi", 8, 96, 384)


@needs_alibaba
def test_alibaba_end_to_end_simulates_and_replays_with_zero_mismatches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster_out = tmp_path / "cluster.yaml"
    code, out, queues_out = _import_cli(
        tmp_path, "--format", "alibaba-openb", str(PODS), "--nodes", str(NODES),
        "--cluster-out", str(cluster_out), "--limit", "2000",
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "2,000 jobs" in printed and "left out the last 6,152 jobs" in printed
    assert "1,213 nodes in 15 groups, 6,212 GPUs" in printed
    cluster = load(cluster_out, ClusterFile)
    queues = load(queues_out, QueuesFile)
    workload = load(out, WorkloadFile)
    assert [(q.name, q.deserved_percent) for q in queues.queues] == [
        ("be", 25), ("burstable", 25), ("guaranteed", 25), ("ls", 25),
    ]  # fmt: skip
    ledger = MemoryLedger()
    result = Simulation(cluster, queues, workload, "gpuledger", ledger).run()
    assert result.jobs == 2_000
    # 6,212 GPUs hold this slice at once: every pod was placed and ran to the end
    assert result.statuses == {"succeeded": 2_000}
    assert result.end_ms >= workload.jobs[-1].at_s * 1000
    replayed = run(ledger)
    assert replayed.mismatch is None
    assert replayed.records == len(ledger.records) and replayed.decisions > 2_000


# --------------------------------------------------------------------------- small traces


def test_helios_gangs_queues_and_shares_exactly(tmp_path: Path) -> None:
    code, out, queues = _import_cli(
        tmp_path, "--format", "helios", str(DATA / "helios.csv"),
        "--mapping", str(DATA / "helios-mapping.yaml"),
    )  # fmt: skip
    assert code == 0
    # j5 was submitted first, so time 0 is its submission; 16 GPUs on 2 nodes is a gang of
    # two 8-GPU pods; 3 GPUs on 2 nodes cannot split evenly and stays one pod; j4 is a
    # CPU-only job that ran 0 s (at least 1 s); j6 has no duration and is skipped.
    assert out.read_text() == _yaml("""
        horizon_s: 1860
        jobs:
        - name: j5
          queue: research
          at_s: 0
          runtime_s: 45
          cpu_per_pod: 2
        - name: j1
          queue: research
          at_s: 60
          runtime_s: 3600
          gpus_per_pod: 8
          cpu_per_pod: 32
        - name: j2
          queue: production
          at_s: 660
          runtime_s: 7200
          pods: 2
          gpus_per_pod: 8
          cpu_per_pod: 32
          priority_class: build
        - name: j3
          queue: research
          at_s: 1260
          runtime_s: 600
          gpus_per_pod: 3
          cpu_per_pod: 6
        - name: j4
          queue: vcc
          at_s: 1860
          runtime_s: 1
          gpus_per_pod: 0
          cpu_per_pod: 4
        """)
    assert queues.read_text() == _yaml("""
        queues:
        - name: production
          deserved_percent: 50
        - name: research
          deserved_percent: 25
        - name: vcc
          deserved_percent: 25
        """)


def test_helios_skips_are_counted_with_where(capsys: pytest.CaptureFixture[str]) -> None:
    result = import_trace("helios", DATA / "helios.csv", load_mapping(DATA / "helios-mapping.yaml"))
    skips = result.summary.skips
    assert skips.counts == {"no duration and no start/end time": 1}
    assert skips.first["no duration and no start/end time"].endswith("helios.csv:7")


def test_helios_tenant_can_be_the_user() -> None:
    result = import_trace("helios", DATA / "helios.csv", Mapping(tenant="user"))
    assert result.summary.per_queue == {"alice": 2, "bob": 1, "carol": 1, "dave": 1}


def test_philly_last_attempt_and_skipped_jobs(tmp_path: Path) -> None:
    code, out, _ = _import_cli(tmp_path, "--format", "philly", str(DATA / "philly.json"))
    assert code == 0
    # the first job's last attempt ran on two 4-GPU machines for 2 h; the third ran on
    # 8 + 4 GPUs, which identical pods cannot express, so it is one 12-GPU pod
    assert out.read_text() == _yaml("""
        horizon_s: 3600
        jobs:
        - name: application_1_0001
          queue: vc-nlp
          at_s: 0
          runtime_s: 7200
          pods: 2
          gpus_per_pod: 4
        - name: application_1_0002
          queue: vc-speech
          at_s: 1800
          runtime_s: 30
        - name: application_1_0003
          queue: vc-nlp
          at_s: 3600
          runtime_s: 1800
          gpus_per_pod: 12
        """)
    summary = import_trace("philly", DATA / "philly.json").summary
    assert summary.skips.counts == {
        "a time is None (submitted, or last attempt's start or end)": 2,
        "no attempts (never started)": 1,
    }


def test_generic_csv_with_a_mapping_file(tmp_path: Path) -> None:
    out = tmp_path / "workload.yaml"
    code = main(["trace", "import", "--format", "csv", str(DATA / "generic.csv"),
                 "--mapping", str(DATA / "generic-mapping.yaml"), "--out", str(out)])  # fmt: skip
    assert code == 0
    # milliseconds -> seconds, MiB -> GiB, job totals split over workers; row c has no
    # duration (skipped), e is excluded by state, d has no team (default queue shared)
    assert out.read_text() == _yaml("""
        horizon_s: 90
        jobs:
        - name: a
          queue: language
          at_s: 0
          runtime_s: 60
          pods: 2
          gpus_per_pod: 2
          cpu_per_pod: 4
          memory_gib_per_pod: 8
          priority_class: build
        - name: b
          queue: vision
          at_s: 30
          runtime_s: 1.5
          gpus_per_pod: 0.5
          cpu_per_pod: 2
          memory_gib_per_pod: 4
        - name: d
          queue: shared
          at_s: 90
          runtime_s: 90
          gpus_per_pod: 3
        """)


def test_quotas_that_are_not_whole_percents_need_the_cluster_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails(
        tmp_path, capsys, "--format", "csv", str(DATA / "generic.csv"),
        "--mapping", str(DATA / "generic-mapping.yaml"), "--queues-out", str(tmp_path / "q.yaml"),
    )  # fmt: skip
    assert "the share of 'language' is 33.33 % of the cluster, not a whole percent" in err
    assert "--nodes, or cluster_gpus:" in err


def test_thirds_of_a_cluster_are_exact_milli_gpus_and_the_odd_one_follows_the_work(
    tmp_path: Path,
) -> None:
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text((DATA / "generic-mapping.yaml").read_text() + "cluster_gpus: 64\n")
    code, _, queues = _import_cli(
        tmp_path, "--format", "csv", str(DATA / "generic.csv"), "--mapping", str(mapping)
    )
    assert code == 0
    # 64,000 milli-GPUs / 3 leaves one over; it goes to the queue that submitted the most
    # GPU-seconds (shared: 3 GPUs x 90 s), not to the name that sorts first (language)
    assert [(q.name, q.deserved_gpus) for q in load(queues, QueuesFile).queues] == [
        ("language", 21.333), ("shared", 21.334), ("vision", 21.333),
    ]  # fmt: skip


def test_generic_csv_columns_from_flags_and_end_times(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "user,submit,start,end,gpus\n"
        "ann,2024-05-01T08:00:00,2024-05-01T08:00:30,2024-05-01T09:00:30,8\n"
        "ben,2024-05-01T08:10:00,,2024-05-01T08:20:00,0.25\n"
    )
    code, out, _ = _import_cli(
        tmp_path, "--format", "csv", str(trace), "--column", "submit=submit",
        "--column", "start=start", "--column", "end=end", "--column", "gpus=gpus",
        "--column", "tenant=user", "--time-scale", "0.5",
    )  # fmt: skip
    assert code == 0
    workload = load(out, WorkloadFile)
    # ann ran end - start = 3600 s; ben has no start, so end - submit = 600 s; both halved
    assert [(j.name, j.queue, j.at_s, j.runtime_s, j.gpus_per_pod) for j in workload.jobs] == [
        ("job-000001", "ann", 0, 1800, 8), ("job-000002", "ben", 300, 300, 0.25),
    ]  # fmt: skip


def test_limit_keeps_the_earliest_jobs() -> None:
    result = import_trace("helios", DATA / "helios.csv", Mapping(limit=2))
    assert [j.name for j in result.workload.jobs] == ["j5", "j1"]
    assert result.summary.limited == 3


def test_repeated_ids_are_renamed() -> None:
    result = import_trace("csv", DATA / "generic.csv", Mapping(
        columns=Columns(submit="submitted_ms", gpus="gpus", duration="duration_ms", name="team"),
    ))  # fmt: skip
    assert [j.name for j in result.workload.jobs] == ["nlp", "vision", "job-000004", "vision-2"]
    assert result.summary.renamed == 1


# --------------------------------------------------------------------------- errors


def _fails(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    out = tmp_path / "workload.yaml"
    out.write_text("previous\n")
    code = main(["trace", "import", *args, "--out", str(out)])
    assert code == 2
    assert out.read_text() == "previous\n"  # nothing half-written, nothing replaced
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    return capsys.readouterr().err


def test_bad_number_names_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "helios.csv"
    lines = (DATA / "helios.csv").read_text().splitlines()
    lines[2] = lines[2].replace(",16,", ",sixteen,")
    trace.write_text("\n".join(lines) + "\n")
    err = _fails(tmp_path, capsys, "--format", "helios", str(trace))
    assert f"{trace}:3: column 'gpu_num': not a number: 'sixteen'" in err


def test_missing_column_names_the_header_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "pods.csv"
    trace.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "scheduled_time\np0,1000,1024,1,500,,LS,Running,0,0\n"
    )
    err = _fails(tmp_path, capsys, "--format", "alibaba-openb", str(trace))
    assert f"{trace}:1: missing column 'deletion_time'" in err


def test_bad_time_names_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "helios.csv"
    lines = (DATA / "helios.csv").read_text().splitlines()
    lines[3] = lines[3].replace("2020-04-01 00:20:00", "yesterday", 1)
    trace.write_text("\n".join(lines) + "\n")
    err = _fails(tmp_path, capsys, "--format", "helios", str(trace))
    assert f"{trace}:4: column 'submit_time': not a time" in err and "'yesterday'" in err


def test_bad_philly_time_names_the_job_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "philly.json"
    trace.write_text((DATA / "philly.json").read_text().replace("2017-10-03 10:31:30", "soon"))
    with pytest.raises(ConfigError, match=r"job \[1\] \(application_1_0002\): "
                       r"attempts\[-1\]\.end_time: not a time"):  # fmt: skip
        import_trace("philly", trace)


def test_uneven_fractional_gpus_are_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("t,g,d\n0,1.5,60\n")
    mapping = Mapping(columns=Columns(submit="t", gpus="g", duration="d"))
    with pytest.raises(ConfigError, match=r"t\.csv:2: column 'g': 1\.5 GPUs"):
        import_trace("csv", trace, mapping)


def test_mapping_errors(tmp_path: Path) -> None:
    bad = tmp_path / "mapping.yaml"
    bad.write_text("priority_classes: {LS: urgent}\n")
    with pytest.raises(ConfigError, match="priority class 'urgent'"):
        load_mapping(bad)
    bad.write_text("deserved_percent: {a: 60, b: 50}\n")
    with pytest.raises(ConfigError, match="more than 100"):
        load_mapping(bad)
    bad.write_text("queue: {a: b}\n")
    with pytest.raises(ConfigError, match="unknown field `queue`"):
        load_mapping(bad)
    with pytest.raises(ConfigError, match=r"exactly one of columns\.gpus"):
        import_trace("csv", DATA / "generic.csv", Mapping())


def test_encoded_files_decode_to_the_same_structs() -> None:
    result = import_trace(
        "csv", DATA / "generic.csv", load_mapping(DATA / "generic-mapping.yaml"), cluster_gpus=10
    )
    assert parse(encode(result.workload), WorkloadFile) == result.workload
    assert parse(encode(result.queues()), QueuesFile) == result.queues()
    assert msgspec.structs.asdict(result.workload)["seed"] == 0


@needs_alibaba
def test_import_straight_into_a_simulation_that_replays(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    code = main(["trace", "import", "--format", "alibaba-openb", str(PODS), "--nodes", str(NODES),
                 "--out", str(tmp_path / "w.yaml"), "--cluster-out", str(tmp_path / "c.yaml"),
                 "--queues-out", str(tmp_path / "q.yaml"), "--limit", "300",
                 "--simulate", str(ledger)])  # fmt: skip
    assert code == 0
    assert main(["replay", "--ledger", str(ledger), "--verify"]) == 0


def test_simulate_needs_the_cluster_and_queues(tmp_path: Path) -> None:
    code = main(["trace", "import", "--format", "csv", str(tmp_path / "x.csv"), "--out",
                 str(tmp_path / "w.yaml"), "--simulate", str(tmp_path / "l")])  # fmt: skip
    assert code == 2


# --------------------------------------------------------------------------- node fraction


def _groups(*counts: int) -> ClusterFile:
    return ClusterFile(
        nodes=[NodeGroup(name=f"g{i}", count=c, gpus=8) for i, c in enumerate(counts)]
    )


def test_node_fraction_keeps_each_shape_its_share_by_largest_remainder() -> None:
    # 25 nodes x 0.2 = 5: whole nodes first (10 -> 2, 9 -> 1.8 -> 1, 6 -> 1.2 -> 1), then
    # the largest remainder (0.8 of g1).
    kept = node_fraction(_groups(10, 9, 6), 0.2)
    assert [(g.name, g.count) for g in kept.nodes] == [("g0", 2), ("g1", 2), ("g2", 1)]
    # Equal remainders go to the earlier group; a group left with no node is dropped.
    kept = node_fraction(_groups(1, 1, 1, 1), 0.5)
    assert [(g.name, g.count) for g in kept.nodes] == [("g0", 1), ("g1", 1)]
    assert node_fraction(_groups(3, 4), 1.0) == _groups(3, 4)


def test_node_fraction_refuses_a_share_that_keeps_nothing_or_is_no_share() -> None:
    with pytest.raises(ConfigError, match="keeps none of the 7 nodes"):
        node_fraction(_groups(3, 4), 0.05)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="expected a share above 0 and at most 1"):
            node_fraction(_groups(3, 4), bad)


def test_node_fraction_and_quota_from_on_the_command_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    rows = [f"n{i},96000,786432,8,A100" for i in range(8)] + [
        f"m{i},64000,262144,2,T4" for i in range(12)
    ]
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(rows) + "\n")
    cluster_out = tmp_path / "cluster.yaml"
    code, _, queues = _import_cli(
        tmp_path, "--format", "csv", str(DATA / "generic.csv"),
        "--mapping", str(DATA / "generic-mapping.yaml"),
        "--nodes", str(nodes), "--cluster-out", str(cluster_out),
        "--node-fraction", "0.25", "--quota-from", "demand",
    )  # fmt: skip
    assert code == 0
    cluster = load(cluster_out, ClusterFile)
    assert [(g.gpu_model, g.count) for g in cluster.nodes] == [("A100", 2), ("T4", 3)]
    # Quotas from demand, in GPUs of the cut cluster (22): by GPU-seconds submitted, so
    # vision's one short half-GPU job earns it almost nothing, where equal shares give
    # every queue a third.
    deserved = {q.name: q.deserved_gpus for q in load(queues, QueuesFile).queues}
    assert sum(deserved.values()) == pytest.approx(22, abs=0.01)  # type: ignore[arg-type]
    assert deserved["vision"] is not None and deserved["vision"] < 0.1
    code, _, queues = _import_cli(
        tmp_path, "--format", "csv", str(DATA / "generic.csv"),
        "--mapping", str(DATA / "generic-mapping.yaml"),
        "--nodes", str(nodes), "--cluster-out", str(cluster_out), "--node-fraction", "0.25",
    )  # fmt: skip
    equal = [q.deserved_gpus for q in load(queues, QueuesFile).queues]
    assert equal == [pytest.approx(22 / 3, abs=0.01)] * 3


def test_node_fraction_needs_a_node_list(tmp_path: Path) -> None:
    code, _, _ = _import_cli(
        tmp_path, "--format", "csv", str(DATA / "generic.csv"),
        "--mapping", str(DATA / "generic-mapping.yaml"), "--node-fraction", "0.5",
    )  # fmt: skip
    assert code == 2


@needs_alibaba
def test_the_congested_alibaba_cut_is_the_benchmarks(tmp_path: Path) -> None:
    cluster = node_fraction(import_nodes(NODES), 0.004)
    assert [(g.gpu_model, g.gpus, g.count) for g in cluster.nodes] == [
        ("G2", 8, 2),
        ("T4", 2, 2),
        ("P100", 2, 1),
    ]
