"""Trace import keeps its inputs exact (issue 15 E): quotas, hierarchy, submit columns,
run-time estimates, CPU-only rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.model import MILLI
from replay.config import (
    ConfigError,
    JobSpec,
    QueuesFile,
    QueueSpec,
    WorkloadFile,
    parse,
    queue_events,
)
from replay.traces import (
    Columns,
    Mapping,
    Tenancy,
    Units,
    encode,
    import_trace,
    load_mapping,
    queues_for,
)
from scheduler.cli import main
from scheduler.cli.trace import _held_for_good

DATA = Path(__file__).parent / "data" / "traces"
COLUMNS = Columns(submit="t", gpus="g", duration="d", tenant="who")


def _csv(tmp_path: Path, header: str, *rows: str) -> Path:
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join([header, *rows]) + "\n")
    return trace


def _quotas(queues: QueuesFile) -> list[tuple[str, str, float | None, float | None]]:
    return [(q.name, q.parent, q.deserved_percent, q.deserved_gpus) for q in queues.queues]


# --------------------------------------------------------------------------- submit column


def test_a_column_of_gaps_is_summed_into_submission_times(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who", "5,1,60,a", "10,1,60,a", "0,1,60,b", "2.5,1,60,a")
    mapping = Mapping(columns=COLUMNS, submit_mode="interval")
    result = import_trace("csv", trace, mapping)
    # the first gap counts from the trace's start, which the shift to 0 then removes
    assert [j.at_s for j in result.workload.jobs] == [0, 10, 10, 12.5]
    assert result.summary.span_s == 12.5
    assert result.summary.warnings == []


def test_gaps_read_as_absolute_times_warn_naming_the_column(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who", "5,1,60,a", "10,1,60,a", "0,1,60,b", "2.5,1,60,a")
    result = import_trace("csv", trace, Mapping(columns=COLUMNS))
    assert result.summary.warnings == [
        f"column 't' is not in order: 2 rows submit before an earlier row (first: {trace}:4); "
        "the jobs are sorted by it; if it holds gaps between submissions, set submit_mode: "
        "interval"
    ]


def test_interval_submits_in_milliseconds_add_up_exactly(tmp_path: Path) -> None:
    # 0.1 s a thousand times: a float running sum would drift off the millisecond
    rows = ["100,1,1000,a"] * 1000
    trace = _csv(tmp_path, "t,g,d,who", *rows)
    mapping = Mapping(columns=COLUMNS, submit_mode="interval", units=Units(time=1000))
    jobs = import_trace("csv", trace, mapping).workload.jobs
    assert jobs[-1].at_s == 99.9 and jobs[1].at_s == 0.1


def test_a_blank_gap_is_an_error_naming_line_and_column(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who", "0,1,60,a", ",1,60,a")
    with pytest.raises(ConfigError, match=rf"{trace}:3: column 't': blank"):
        import_trace("csv", trace, Mapping(columns=COLUMNS, submit_mode="interval"))


def test_submit_mode_is_refused_for_a_format_whose_times_are_times() -> None:
    with pytest.raises(ConfigError, match="helios: submit_mode interval is for csv traces only"):
        import_trace("helios", DATA / "helios.csv", Mapping(submit_mode="interval"))


def test_an_out_of_order_helios_log_warns_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.yaml"
    assert main(["trace", "import", "--format", "helios", str(DATA / "helios.csv"),
                 "--out", str(out)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "gpuledger: warning: column 'submit_time' is not in order: 1 rows" in err
    assert "helios.csv:6" in err and "submit_mode" not in err


# --------------------------------------------------------------------------- estimates, CPU


def test_a_runtime_estimate_column_becomes_expected_runtime(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who,est", "0,1,60000,a,90000", "1000,1,60000,a,")
    columns = Columns(submit="t", gpus="g", duration="d", tenant="who", runtime_estimate="est")
    mapping = Mapping(columns=columns, units=Units(time=1000), time_scale=0.5)
    jobs = import_trace("csv", trace, mapping).workload.jobs
    assert [(j.runtime_s, j.expected_runtime_s) for j in jobs] == [(30, 45), (30, None)]


@pytest.mark.parametrize("mode", ["keep", "drop", "error"])
def test_cpu_only_rows_follow_the_mapping(tmp_path: Path, mode: str) -> None:
    trace = _csv(tmp_path, "t,g,d,who", "0,1,60,a", "1,0,60,b", "2,0.5,60,a")
    mapping = Mapping(columns=COLUMNS, cpu_only=mode)  # type: ignore[arg-type]
    if mode == "error":
        with pytest.raises(ConfigError, match=rf"{trace}:3: the job asks for 0 GPUs"):
            import_trace("csv", trace, mapping)
        return
    result = import_trace("csv", trace, mapping)
    gpus = [j.gpus_per_pod for j in result.workload.jobs]
    if mode == "keep":
        assert gpus == [1, 0, 0.5] and result.summary.cpu_only == 1
        assert "kept 1 jobs with 0 GPUs as CPU-only pods (cpu_only: keep)" in result.summary.lines()
    else:
        assert gpus == [1, 0.5] and result.summary.skips.counts == {"0 GPUs (cpu_only: drop)": 1}
        assert "b" not in result.summary.per_queue


# --------------------------------------------------------------------------- quotas


def test_136_tenants_all_deserve_something_and_the_rounding_follows_the_work(
    tmp_path: Path,
) -> None:
    # tenant t000 submits the least work, t135 the most: name order and work order differ
    rows = [f"{i},1,{10 + i},t{i:03d}" for i in range(136)]
    result = import_trace("csv", _csv(tmp_path, "t,g,d,who", *rows), Mapping(columns=COLUMNS),
                          cluster_gpus=100)  # fmt: skip
    quotas = {q.name: round((q.deserved_gpus or 0) * MILLI) for q in result.queues().queues}
    assert len(quotas) == 136 and min(quotas.values()) == 735
    assert sum(quotas.values()) == 100 * MILLI  # 100,000 milli-GPUs, none lost to rounding
    # 100,000 - 136 x 735 = 40 milli-GPUs over: to the 40 tenants with the most work
    assert sorted(q for q, m in quotas.items() if m == 736) == [f"t{i:03d}" for i in range(96, 136)]


def test_whole_percents_stay_percents_and_scale_with_the_cluster(tmp_path: Path) -> None:
    rows = [f"{i},1,60,{w}" for i, w in enumerate("abcd")]
    result = import_trace("csv", _csv(tmp_path, "t,g,d,who", *rows), Mapping(columns=COLUMNS))
    assert _quotas(result.queues()) == [(w, "", 25, None) for w in "abcd"]


def test_fractional_mapping_percents_are_exact_gpus(tmp_path: Path) -> None:
    rows = ["0,1,60,a", "1,1,60,b"]
    mapping = Mapping(columns=COLUMNS, deserved_percent={"a": 12.5}, cluster_gpus=8)
    result = import_trace("csv", _csv(tmp_path, "t,g,d,who", *rows), mapping)
    assert _quotas(result.queues()) == [("a", "", None, 1), ("b", "", None, 7)]


def test_a_tenant_with_jobs_deserves_0_only_when_the_mapping_says_so(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who", "0,1,60,a", "1,1,60,b")
    starved = Mapping(columns=COLUMNS, deserved_percent={"a": 100})
    with pytest.raises(ConfigError, match=r"so 'b', which has jobs, would deserve 0"):
        import_trace("csv", trace, starved).queues()
    asked = Mapping(columns=COLUMNS, deserved_percent={"a": 100, "b": 0})
    assert _quotas(import_trace("csv", trace, asked).queues()) == [
        ("a", "", 100, None), ("b", "", 0, None),
    ]  # fmt: skip


def test_a_share_below_a_milli_gpu_is_an_error(tmp_path: Path) -> None:
    rows = [f"{i},1,60,t{i:04d}" for i in range(1001)]
    result = import_trace("csv", _csv(tmp_path, "t,g,d,who", *rows), Mapping(columns=COLUMNS),
                          cluster_gpus=1)  # fmt: skip
    with pytest.raises(ConfigError, match=r"share of 1 GPUs is below 1/1000 GPU"):
        result.queues()


@settings(max_examples=60, deadline=None)
@given(
    work=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=40),
    gpus=st.integers(min_value=1, max_value=5000),
)
def test_milli_gpu_quotas_add_up_exactly_and_differ_by_at_most_one(
    work: list[int], gpus: int
) -> None:
    tenancy = Tenancy()
    for index, amount in enumerate(work):
        tenancy.add(f"q{index:02d}", "", amount, "x")
    queues = queues_for(tenancy, Mapping(), gpus)
    amounts = [q.deserved_percent if q.deserved_percent is not None else
               round((q.deserved_gpus or 0) * MILLI) for q in queues.queues]  # fmt: skip
    if queues.queues[0].deserved_percent is not None:
        assert sum(amounts) == 100 and len(set(amounts)) == 1
    else:
        assert sum(amounts) == gpus * MILLI and max(amounts) - min(amounts) <= 1
        # the extra milli-GPUs go to the tenants with the most work
        extra = [w for w, a in zip(work, amounts, strict=True) if a == max(amounts)]
        rest = [w for w, a in zip(work, amounts, strict=True) if a < max(amounts)]
        assert not rest or min(extra) >= max(rest)
    queue_events(parse(encode(queues), QueuesFile))  # a valid tree


def test_quota_from_demand_divides_by_submitted_gpu_seconds() -> None:
    tenancy = Tenancy()
    tenancy.add("big", "", 600, "x")
    tenancy.add("mid", "", 300, "x")
    tenancy.add("small", "", 100, "x")
    demand = {
        q.name: q.deserved_gpus
        for q in queues_for(tenancy, Mapping(quota_from="demand"), 20).queues
    }
    assert demand == {"big": None, "mid": None, "small": None}  # whole percents: scale with nodes
    percent = {
        q.name: q.deserved_percent
        for q in queues_for(tenancy, Mapping(quota_from="demand"), 20).queues
    }
    assert percent == {"big": 60, "mid": 30, "small": 10}
    tenancy.add("small", "", 100, "x")  # 6:3:2 of 10 GPUs: exact milli-GPUs
    exact = {
        q.name: q.deserved_gpus
        for q in queues_for(tenancy, Mapping(quota_from="demand"), 10).queues
    }
    assert exact == {"big": 5.455, "mid": 2.727, "small": 1.818}
    equal = queues_for(tenancy, Mapping(), 30).queues
    assert {q.name: q.deserved_gpus for q in equal} == {"big": 10, "mid": 10, "small": 10}


def test_quota_from_demand_leaves_named_percents_and_splits_the_rest() -> None:
    tenancy = Tenancy()
    tenancy.add("svc", "", 10, "x")
    tenancy.add("a", "", 300, "x")
    tenancy.add("b", "", 100, "x")
    queues = queues_for(tenancy, Mapping(quota_from="demand", deserved_percent={"svc": 20}), 40)
    assert {q.name: q.deserved_percent for q in queues.queues} == {"a": 60, "b": 20, "svc": 20}


def test_quota_from_demand_refuses_a_cpu_only_tenant_it_would_give_nothing() -> None:
    tenancy = Tenancy()
    tenancy.add("gpu", "", 100, "x")
    tenancy.add("cpu", "", 0, "x")
    with pytest.raises(ConfigError, match="'cpu' has jobs"):
        queues_for(tenancy, Mapping(quota_from="demand"), 8)


# --------------------------------------------------------------------------- hierarchy


def test_helios_users_under_their_virtual_clusters(tmp_path: Path) -> None:
    mapping = Mapping(tenant="user", parent="vc", cluster_gpus=12)
    result = import_trace("helios", DATA / "helios.csv", mapping)
    assert sorted(result.summary.per_queue) == ["vca-alice", "vca-carol", "vcb-bob", "vcc-dave"]
    queues = result.queues()
    # parents a third of 12 GPUs each, their users an equal part of that
    assert _quotas(queues) == [
        ("vca", "", None, 4), ("vcb", "", None, 4), ("vcc", "", None, 4),
        ("vca-alice", "vca", None, 2), ("vca-carol", "vca", None, 2),
        ("vcb-bob", "vcb", None, 4), ("vcc-dave", "vcc", None, 4),
    ]  # fmt: skip
    events = queue_events(parse(encode(queues), QueuesFile))
    assert [(e.queue, e.parent, e.deserved.gpu_milli) for e in events][3:] == [
        ("vca-alice", "vca", 2000), ("vca-carol", "vca", 2000),
        ("vcb-bob", "vcb", 4000), ("vcc-dave", "vcc", 4000),
    ]  # fmt: skip


def test_philly_hierarchy_in_whole_percents(tmp_path: Path) -> None:
    mapping = Mapping(tenant="user", parent="vc")
    queues = import_trace("philly", DATA / "philly.json", mapping).queues()
    assert _quotas(queues) == [
        ("vc-nlp", "", 50, None), ("vc-speech", "", 50, None),
        ("vc-nlp-u1", "vc-nlp", 100, None), ("vc-speech-u2", "vc-speech", 100, None),
    ]  # fmt: skip


def test_csv_parent_column_and_mapping_percents_per_level(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who,dept", "0,1,60,ann,ml", "1,1,60,bo,ml", "2,1,60,cy,ops")
    path = tmp_path / "mapping.yaml"
    path.write_text(
        "columns: {submit: t, gpus: g, duration: d, tenant: who, parent: dept}\n"
        "deserved_percent: {ml: 80, ml-ann: 75}\n"  # per level: 155 in all is fine
    )
    mapping = load_mapping(path)
    assert _quotas(import_trace("csv", trace, mapping).queues()) == [
        ("ml", "", 80, None), ("ops", "", 20, None),
        ("ml-ann", "ml", 75, None), ("ml-bo", "ml", 25, None), ("ops-cy", "ops", 100, None),
    ]  # fmt: skip
    over = Mapping(columns=mapping.columns, deserved_percent={"ml-ann": 75, "ml-bo": 30})
    with pytest.raises(ConfigError, match=r"deserved_percent of the children of 'ml' adds up"):
        import_trace("csv", trace, over).queues()


def test_a_tenant_mapped_to_one_queue_under_two_parents_is_an_error(tmp_path: Path) -> None:
    trace = _csv(tmp_path, "t,g,d,who,dept", "0,1,60,ann,ml", "1,1,60,ann,ops")
    columns = Columns(submit="t", gpus="g", duration="d", tenant="who", parent="dept")
    with pytest.raises(ConfigError, match=rf"{trace}:3: queue 'team-ann' is under 'ops' here"):
        import_trace("csv", trace, Mapping(columns=columns, queues={"ann": "team-ann"}))


def test_mapping_refuses_a_parent_field_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text("tenant: user\nparent: team\n")
    with pytest.raises(ConfigError, match=rf"{path}: parent must be vc or user, not 'team'"):
        load_mapping(path)
    path.write_text("cpu_only: skip\n")
    with pytest.raises(ConfigError, match=rf"{path}: Invalid enum value 'skip'"):
        load_mapping(path)


@pytest.mark.parametrize("scale", ["inf", "nan", "1e300", "0", "-1"])
def test_a_time_scale_out_of_bounds_is_refused_naming_the_flag(
    tmp_path: Path, scale: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.yaml"
    code = main(["trace", "import", "--format", "helios", str(DATA / "helios.csv"),
                 "--out", str(out), "--time-scale", scale])  # fmt: skip
    assert code != 0 and not out.exists()
    assert f"--time-scale {float(scale):g}: must be above 0 and at most 1e+06" in (
        capsys.readouterr().err
    )


def test_an_import_whose_times_outgrow_the_workload_format_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files an import writes are valid by construction: what ``simulate`` would refuse
    (here a horizon past the format's bound once times are scaled) is refused instead,
    naming the file and the field, and nothing is written."""
    trace = _csv(tmp_path, "t,g,d,who", "0,1,60,a", "9000000,1,60,a")
    out = tmp_path / "w.yaml"
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("columns: {submit: t, gpus: g, duration: d, tenant: who}\n")
    code = main(["trace", "import", "--format", "csv", str(trace), "--mapping", str(mapping),
                 "--out", str(out), "--time-scale", "1000000"])  # fmt: skip
    assert code != 0 and not out.exists()
    err = capsys.readouterr().err
    assert f"{out} (as imported): Expected `float` <= 1000000000000.0 - at `$.horizon_s`" in err
    # the same import at a scale the format holds is written, and simulate reads it
    assert main(["trace", "import", "--format", "csv", str(trace), "--mapping", str(mapping),
                 "--out", str(out), "--time-scale", "1000"]) == 0  # fmt: skip
    assert parse(out.read_bytes(), WorkloadFile, str(out)).jobs


def test_a_queue_deserving_less_than_its_non_preemptible_jobs_ask_is_warned_of() -> None:
    """What the policy will reject as never fitting is said on import, per queue."""
    jobs = [
        JobSpec(name="a", queue="small", at_s=0, runtime_s=1, gpus_per_pod=1, priority_class="build"),
        JobSpec(name="b", queue="small", at_s=0, runtime_s=1, pods=2, priority_class="build"),
        JobSpec(name="c", queue="small", at_s=0, runtime_s=1, gpus_per_pod=4),  # train
        JobSpec(
            name="d", queue="small", at_s=0, runtime_s=1, gpus_per_pod=4,
            priority_class="build", preemptible=True,
        ),
        JobSpec(name="e", queue="big", at_s=0, runtime_s=1, gpus_per_pod=2, priority_class="build"),
    ]  # fmt: skip
    workload = WorkloadFile(jobs=jobs)
    queues = QueuesFile(
        queues=[QueueSpec(name="small", deserved_gpus=0.5), QueueSpec(name="big", deserved_gpus=8)]
    )
    assert _held_for_good(workload, queues, None) == [
        "queue 'small' deserves 0.5 GPUs, but 2 of its non-preemptible jobs ask for more (up "
        "to 2): the policy rejects each as never fitting, as non-preemptible work runs only "
        "within its queue's deserved quota; give the queue more (deserved_percent: in the "
        "mapping)"
    ]
    in_percent = QueuesFile(
        queues=[
            QueueSpec(name="small", deserved_percent=5),
            QueueSpec(name="big", deserved_percent=95),
        ]
    )
    assert _held_for_good(workload, in_percent, None) == []  # (no cluster size: not judged)
    assert len(_held_for_good(workload, in_percent, 20)) == 1  # 5 % of 20 GPUs: 1 GPU
