"""Forecasts (``replay.forecast``, ``gpuledger forecast``): the policy run forward from the
state at a moment, read off against what the ledger itself says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from events.filelog import LedgerDirReader
from events.model import JobSubmitted, PodFinished, PodSpec
from replay.forecast import (
    TAIL_U,
    UNKNOWN,
    Estimate,
    Moment,
    Recent,
    RuntimeModel,
    _copy,
    _forecast_of,
    _repeated,
    draw_at,
    forecast,
    kaplan_meier,
    learn,
    moment_of,
    submit,
)
from replay.sim import Simulation
from scheduler.cli import main
from scheduler.fold.outcomes import OutcomeFold
from scheduler.fold.validate import validate

CLUSTER = "nodes:\n  - {name: n, count: 1, gpus: 8}\ntiming: {bind_latency_s: 0.5, startup_s: 5}\n"
QUEUES = "queues:\n  - {name: a, deserved_percent: 50}\n  - {name: b, deserved_percent: 50}\n"
# b-whole waits in the same queue as the job it waits for: for capacity, not for its share.
# A holds the node for an hour; B (the whole node too) waits for it with a reservation;
# C, a 1-GPU job, comes later and also waits. Every job states its runtime exactly.
WORKLOAD = """jobs:
  - {name: a-long, queue: a, at_s: 0, runtime_s: 3600, expected_runtime_s: 3600, pods: 1, gpus_per_pod: 8}
  - {name: b-whole, queue: a, at_s: 60, runtime_s: 600, expected_runtime_s: 600, pods: 1, gpus_per_pod: 8}
  - {name: b-small, queue: a, at_s: 120, runtime_s: 300, expected_runtime_s: 300, pods: 1, gpus_per_pod: 1}
"""


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("forecast")
    for name, text in (("c", CLUSTER), ("q", QUEUES), ("w", WORKLOAD)):
        (root / f"{name}.yaml").write_text(text)
    argv = ["simulate", "--cluster", str(root / "c.yaml"), "--queues", str(root / "q.yaml"),
            "--workload", str(root / "w.yaml"), "--ledger", str(root / "ledger"), "--no-fairness"]  # fmt: skip
    assert main(argv) == 0
    return root / "ledger"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    assert main(["forecast", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _placed(ledger: Path) -> dict[str, int]:
    placed: dict[str, int] = {}
    for _, env in LedgerDirReader(ledger).read(0):
        if env.type == "pods_allocated":
            placed.setdefault(env.key, env.at)
    return placed


def test_a_reservation_is_forecast_at_its_promised_time(ledger: Path) -> None:
    """At 2 min, b-whole holds a reservation for when a-long ends: the forecast (no new
    work, exact estimates) is that promised moment, and it is what the ledger recorded."""
    moment = moment_of(LedgerDirReader(ledger).read(0), 120_000)
    job = moment.fold.state.jobs["b-whole"]
    assert job.promise > moment.fold.state.now  # a reservation stands
    (f,) = forecast(moment, jobs=["b-whole"], coarse=0)  # exact: every end at its time
    assert f.earliest_ms == f.latest_ms == job.promise == _placed(ledger)["b-whole"]
    assert f.estimate.source == "given" and "reservation" in f.reason


def test_every_pending_job_in_queue_order_and_what_the_ledger_did(ledger: Path) -> None:
    """With exact estimates and nothing arriving after it, each forecast is the start the
    ledger records (the world here is the simulator's: binds and starts as timed)."""
    moment = moment_of(LedgerDirReader(ledger).read(0), 150_000)
    result = forecast(moment, coarse=0)
    assert [(f.queue, f.position, f.job) for f in result] == [
        ("a", 1, "b-whole"),
        ("a", 2, "b-small"),
    ]
    placed = _placed(ledger)
    for f in result:
        assert f.earliest_ms == placed[f.job], f


def test_a_job_in_a_quiet_cluster_starts_now(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("jobs:\n  - {name: new, queue: a, at_s: 0, runtime_s: 60, gpus_per_pod: 2}\n")
    out = _json(capsys, "--ledger", str(ledger), "--job", str(job))  # at the end: all done
    (row,) = out["jobs"]
    assert row["job"] == "new" and row["start"] == "now"
    assert row["earliest_ms"] - out["at_ms"] < 1000


def test_a_forecast_at_a_past_moment_equals_one_from_the_truncated_ledger(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = list(LedgerDirReader(ledger).read(0))
    cut = next(o for o, env in records if env.at > 150_000)
    export = tmp_path / "prefix.jsonl"
    assert main(["log", "export", str(ledger), "--until", str(cut), "--out", str(export)]) == 0
    assert main(["log", "import", str(export), "--ledger", str(tmp_path / "prefix")]) == 0
    then = _json(capsys, "--ledger", str(ledger), "--at", str(cut))
    truncated = _json(capsys, "--ledger", str(tmp_path / "prefix"))
    assert then["jobs"] and then == truncated


def test_a_job_the_scheduler_would_refuse_is_refused_with_its_reason(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("jobs:\n  - {name: a-long, queue: a, at_s: 0, runtime_s: 60}\n")
    moment = moment_of(LedgerDirReader(ledger).read(0), 120_000)
    duplicate = JobSubmitted(job="a-long", queue="a", pods=(PodSpec(name="a-long-0"),))
    why = validate(moment.fold.state, duplicate)
    assert why is not None and submit(moment, duplicate) == why
    capsys.readouterr()
    assert main(["forecast", "--ledger", str(ledger), "--at", "2m", "--job", str(job)]) == 2
    err = capsys.readouterr().err
    assert err == f"gpuledger: {job}: {why}\n"


def test_the_history_estimates_jobs_like_it_that_ran_as_long() -> None:
    model = RuntimeModel()
    for minutes in (10, 20, 30, 40, 50, 60, 70, 80, 90, 100):
        model.add("q", 1, 1000, "train", minutes * 60_000)
    fresh = model.estimate("q", 1, 1000, "train")
    assert (fresh.p50_ms, fresh.p90_ms) == (50 * 60_000, 90 * 60_000)
    ran = model.estimate("q", 1, 1000, "train", elapsed_ms=65 * 60_000)  # 70..100 ran this long
    assert (ran.p50_ms, ran.p90_ms) == (80 * 60_000, 100 * 60_000)
    beyond = model.estimate("q", 1, 1000, "train", elapsed_ms=120 * 60_000)
    assert beyond.p50_ms == 240 * 60_000 and "longer than any" in beyond.source
    assert model.estimate("other", 4, 1000, "train").source.startswith("history: every queue")
    assert RuntimeModel().estimate("q", 1, 1000, "train").p50_ms is None


def test_jobs_still_running_count_as_longer_than_they_have_run() -> None:
    """A history of completed jobs alone leaves out the long ones still running: each
    counts as a runtime longer than what it has run (Kaplan–Meier), so the estimate
    lengthens, and the share of the group still running past the longest completed is
    drawn from the tail beyond it."""
    model = RuntimeModel()
    for minutes in (10, 20, 30, 40, 50, 60, 70, 80, 90, 100):
        model.add("q", 1, 1000, "train", minutes * 60_000)
    before = model.estimate("q", 1, 1000, "train")
    for minutes in (15, 300, 400, 500):  # one started lately, three past every completed
        model.add("q", 1, 1000, "train", minutes * 60_000, still_running=True)
    after = model.estimate("q", 1, 1000, "train")
    assert "10 completed, 4 running" in after.source
    assert after.p50_ms is not None and before.p50_ms is not None
    assert after.p50_ms > before.p50_ms and after.p90_ms == after.draw(0.9)
    # P(T > 100 min) = 13/14 · 11/12 · 10/11 · … · 3/4 = 13/56 (the one running for 15
    # min is at risk at 10 min only): 23 of 100 evenly spread draws are beyond the
    # longest completed, rising with the quantile
    draws = [after.draw(k / 100) for k in range(100)]
    assert [d > 100 * 60_000 for d in draws] == [False] * 77 + [True] * 23
    assert draws[77:] == sorted(set(draws[77:]))
    dist = kaplan_meier([10, 20, 30], [15, 40])
    assert dist.cdf == pytest.approx((1 / 5, 1 / 5 + 4 / 5 * 1 / 3, 1 / 5 + 4 / 5 * 2 / 3))
    assert learn([]).groups == {}


def test_a_coarse_forecast_is_within_its_step(ledger: Path) -> None:
    """By default ends are rounded up to about 1/32 of their distance: the reservation an
    hour ahead is forecast within two minutes after its promised time, never before it."""
    moment = moment_of(LedgerDirReader(ledger).read(0), 120_000)
    promise = moment.fold.state.jobs["b-whole"].promise
    (f,) = forecast(moment, jobs=["b-whole"])
    assert f.earliest_ms is not None
    assert promise <= f.earliest_ms <= promise + (promise - moment.fold.state.now) // 32


def test_a_coarse_forecast_keeps_the_throughput_of_short_jobs_far_ahead(
    tmp_path: Path,
) -> None:
    """Forty 5-minute jobs run one after another on one GPU. On the coarse grid each end
    is rounded up by about 1/32 of the run it has left, not of its distance from the
    moment: the last job's forecast start stays within 1/32 of the exact one, where
    rounding by distance would stretch every job far ahead to many times its runtime."""
    jobs = "\n".join(
        f"  - {{name: j{i:02}, queue: a, at_s: 0, runtime_s: 300, expected_runtime_s: 300,"
        " pods: 1, gpus_per_pod: 1}"
        for i in range(40)
    )
    files = {
        "c": "nodes:\n  - {name: n, count: 1, gpus: 1}\n"
        "timing: {bind_latency_s: 0.5, startup_s: 5}\n",
        "q": "queues:\n  - {name: a, deserved_percent: 100}\n",
        "w": f"jobs:\n{jobs}\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    argv = ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--queues", str(tmp_path / "q.yaml"),
            "--workload", str(tmp_path / "w.yaml"), "--ledger", str(tmp_path / "l"), "--no-fairness"]  # fmt: skip
    assert main(argv) == 0
    moment = moment_of(LedgerDirReader(tmp_path / "l").read(0), 10_000)  # j00 has started
    now = moment.fold.state.now
    (exact,) = forecast(moment, jobs=["j39"], coarse=0)
    (coarse,) = forecast(moment, jobs=["j39"])
    assert exact.earliest_ms is not None and coarse.earliest_ms is not None
    assert exact.earliest_ms == _placed(tmp_path / "l")["j39"]  # exact: what the ledger did
    assert exact.earliest_ms - now > 39 * 300_000
    assert (
        exact.earliest_ms
        <= coarse.earliest_ms
        <= exact.earliest_ms + (exact.earliest_ms - now) // 32
    )


def test_recent_arrivals_repeat_at_the_rate_a_young_ledger_saw() -> None:
    """A ledger two hours old repeats its two hours of submissions every two hours, not
    once a day: the rate they came at goes on."""
    recent = Recent()
    for minute in range(0, 120, 10):
        pods = (PodSpec(name="p", gpu_milli=1000),)
        recent.note(minute * 60_000, JobSubmitted(job=f"s{minute}", queue="a", pods=pods))
    fold = OutcomeFold()
    fold.state.now = 120 * 60_000
    moment = Moment(fold, 0, 0, -1, recent)
    again = _repeated(moment, fold.state.now + 6 * 3_600_000)
    per_hour = len(again) / 6
    assert per_hour == pytest.approx(6, abs=1)  # 12 submissions in 2 h, as they came
    assert again[0][1] == "s10" and again[0][0] == 130 * 60_000


def test_a_forecast_is_the_middle_run_and_the_range_all_runs() -> None:
    """Longer runtimes can start a job sooner (another queue falls behind it in the
    fair-share order), so the starts are sorted, beyond the horizon (None) last: the
    forecast is the middle one, the range the first to the last."""
    f = _forecast_of("j", "q", 1, [900, None, 500], 10_000, "why", UNKNOWN)
    assert (f.earliest_ms, f.median_ms, f.latest_ms) == (500, 900, None)
    f = _forecast_of("j", "q", 1, [None, None, 500], 10_000, "why", UNKNOWN)
    assert (f.earliest_ms, f.median_ms, f.latest_ms) == (500, None, None)
    f = _forecast_of("j", "q", 1, [700], 10_000, "why", UNKNOWN)
    assert (f.earliest_ms, f.median_ms, f.latest_ms) == (700, 700, 700)
    assert f.row(0)["start"] == f.row(0)["start"].split(" (")[0]  # one run: no range


def test_each_job_draws_its_runtimes_spread_over_its_distribution() -> None:
    """A job's draws over the runs fall one in each 1/runs of its distribution, the same
    in every process; different jobs draw at different quantiles; a job that outran its
    whole group draws from a tail with median twice what it ran; a given runtime is
    every draw."""
    runs = 7
    for name in ("a", "train-00042", "j@3"):
        quantiles = sorted(draw_at(name, run, runs) for run in range(runs))
        assert all(0 <= u < 1 for u in quantiles)
        assert [int((u - quantiles[0]) * runs + 1e-9) for u in quantiles] == list(range(runs))
    assert draw_at("a", 0, runs) != draw_at("b", 0, runs)
    assert draw_at("a", 3, runs) == (draw_at("a", 0, runs) + 3 / runs) % 1.0
    history = list(range(1, 101))
    learned = Estimate(50, 90, "history", kaplan_meier(history, []), 0.6)  # ran as long as 60
    draws = [learned.draw(k / 10) for k in range(10)]
    assert draws == [61, 65, 69, 73, 77, 81, 85, 89, 93, 97]
    beyond = Estimate(200, 1000, "history: ran longer", ran_ms=100)
    assert beyond.draw(0.5) == 200 and beyond.draw(0.9) == 1000
    assert beyond.draw(0.999) == beyond.draw(TAIL_U) == 2000
    assert Estimate(300, 300, "given").draw(0.99) == 300
    assert UNKNOWN.draw(0.5) is None


def test_the_first_of_many_ends_is_forecast_sooner_than_any_ones_median(
    tmp_path: Path,
) -> None:
    """Eight 1-GPU jobs hold the node; the history says jobs like them run 10 to 100
    minutes. With every job at its median the ninth would wait for the first of eight ends
    at 55 minutes; the runs draw each job's runtime across the history, so the ninth is
    forecast to start at about the first of eight such draws (near 20 minutes), and the
    range spans the runs. Forecasting again gives the same, byte for byte."""
    history = "\n".join(
        f"  - {{name: h{i:02}, queue: a, at_s: 0, runtime_s: {600 + 180 * i}, pods: 1,"
        " gpus_per_pod: 1}"
        for i in range(31)
    )
    held = "\n".join(
        f"  - {{name: r{i}, queue: a, at_s: 43200, runtime_s: 7200, pods: 1, gpus_per_pod: 1}}"
        for i in range(8)
    )
    files = {
        "c": "nodes:\n  - {name: n, count: 1, gpus: 8}\n"
        "timing: {bind_latency_s: 0.5, startup_s: 5}\n",
        "q": "queues:\n  - {name: a, deserved_percent: 100}\n",
        "w": f"jobs:\n{history}\n{held}\n"
        "  - {name: w, queue: a, at_s: 43260, runtime_s: 60, pods: 1, gpus_per_pod: 1}\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    argv = ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--queues", str(tmp_path / "q.yaml"),
            "--workload", str(tmp_path / "w.yaml"), "--ledger", str(tmp_path / "l"), "--no-fairness"]  # fmt: skip
    assert main(argv) == 0
    moment = moment_of(LedgerDirReader(tmp_path / "l").read(0), 43_320_000)
    now = moment.fold.state.now
    (f,) = forecast(moment, jobs=["w"])
    assert f.estimate.source.startswith("history: queue a, 1 pods, 1 GPUs")
    assert f.median_ms is not None and f.earliest_ms is not None and f.latest_ms is not None
    assert f.earliest_ms < f.median_ms < f.latest_ms
    assert 10 * 60_000 < f.median_ms - now < 35 * 60_000  # the median run: 55 minutes
    (one,) = forecast(moment, jobs=["w"], samples=1)
    assert one.earliest_ms == one.median_ms == one.latest_ms
    assert forecast(moment, jobs=["w"]) == [f]


def _a_long_overruns(ledger: Path, by_ms: int) -> tuple[Moment, dict[str, int]]:
    """The moment 2 minutes into the ledger, and each unfinished job's runtime as stated
    but a-long's, ``by_ms`` longer: b-whole's reservation falls due while a-long runs."""
    moment = moment_of(LedgerDirReader(ledger).read(0), 120_000)
    runtimes = {
        name: job.expected_runtime_ms or 0
        for name, job in moment.fold.state.jobs.items()
        if job.status != "succeeded"
    }
    runtimes["a-long"] += by_ms
    return moment, runtimes


def _cycle_moments(sim: Simulation) -> list[int]:
    """The moments the simulation runs a cycle at from now on, as it runs them."""
    moments: list[int] = []
    step = sim._step

    def counted(batch: list[Any], now: int) -> Any:
        moments.append(now)
        return step(batch, now)

    sim._step = counted  # type: ignore[method-assign]
    return moments


def test_a_coarse_run_serves_a_due_reservation_in_the_next_event_s_cycle(ledger: Path) -> None:
    """a-long states an hour but runs 20 s longer: b-whole's reservation falls due at the
    hour while a-long still runs. Exact, that moment takes a cycle of its own; on the
    coarse grid it takes none, as a-long's end comes within the grid step and its cycle
    serves the due reservation. Both runs start b-whole at a-long's end."""
    moment, runtimes = _a_long_overruns(ledger, 20_000)
    state = moment.fold.state
    promise = state.jobs["b-whole"].promise
    ran: dict[int, list[int]] = {}
    placed: dict[int, int] = {}
    for coarse in (0, 32):
        sim = Simulation.resume(
            _copy(state), runtimes, bind_ms=moment.bind_ms, startup_ms=moment.startup_ms,
            coarse=coarse,
        )  # fmt: skip
        ran[coarse] = _cycle_moments(sim)
        sim.carry_on(state.now + 86_400_000)
        placed[coarse] = sim.placed["b-whole"]
    a_end = state.jobs["a-long"].started_at + runtimes["a-long"]  # type: ignore[operator]
    assert promise in ran[0] and promise not in ran[32]
    assert placed[0] == a_end
    assert a_end < placed[32] <= promise + (promise - state.now) // 32  # within the step


def test_a_wake_up_served_on_the_grid_gets_its_cycle_when_the_next_event_is_stale(
    ledger: Path,
) -> None:
    """The event a due wake-up waits for on the coarse grid may be about an attempt that
    has ended (it is dropped, no cycle): the wake-up goes along to that moment and still
    gets a cycle there, instead of none at all."""
    moment, runtimes = _a_long_overruns(ledger, 3_600_000)  # far past the grid step
    state = moment.fold.state
    promise = state.jobs["b-whole"].promise
    sim = Simulation.resume(
        _copy(state), runtimes, bind_ms=moment.bind_ms, startup_ms=moment.startup_ms,
        coarse=32,
    )  # fmt: skip
    stale = state.jobs["a-long"].attempt + 1  # an attempt the job never had
    sim._push(promise + 1_000, PodFinished(job="a-long", pod="a-long"), stale)
    moments = _cycle_moments(sim)
    sim.carry_on(promise + 10_000)
    assert promise not in moments and promise + 1_000 in moments


def test_samples_is_checked_and_one_run_has_no_range(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--samples 0`` is refused by name; one run gives each job one start."""
    capsys.readouterr()
    assert main(["forecast", "--ledger", str(ledger), "--samples", "0"]) == 2
    assert "--samples: 0: expected at least 1" in capsys.readouterr().err
    out = _json(capsys, "--ledger", str(ledger), "--at", "2m", "--samples", "1")
    assert out["jobs"] and all(
        row["earliest_ms"] == row["median_ms"] == row["latest_ms"] for row in out["jobs"]
    )
