"""``bench.forecast``'s accuracy figures, on cases whose errors are known."""

from __future__ import annotations

import math

import pytest

from bench.forecast import (
    DIAGNOSTICS,
    ESTIMATES,
    KINDS,
    TARGETS,
    Case,
    _row,
    figures,
    given_for,
    interval,
    report,
    sampled,
)
from events.model import PodSpec
from scheduler.core.state import ALLOCATED, PENDING, RUNNING, SUCCEEDED, Job, State

MIN = 60_000
HORIZON = 7 * 24 * 60 * MIN


def _case(job: str, waited: int, forecast: int, earliest: int, latest: int | None) -> Case:
    """A job submitted at 0 that started after ``waited`` minutes, forecast at ``forecast``
    minutes (range ``earliest`` to ``latest``; None: later than the horizon)."""
    return Case(job, 0, waited * MIN, forecast * MIN, earliest * MIN, latest, HORIZON)


def test_the_figures_count_only_long_waits_and_set_apart_the_rightly_beyond() -> None:
    horizon_min = HORIZON // MIN
    cases = [
        _case("quick", 5, 50, 0, 100 * MIN),  # waited < 10 min: not in the figures
        _case("early", 100, 50, 40, 90 * MIN),  # -50 %, actual after the range
        _case("exact", 60, 60, 30, 90 * MIN),  # 0 %, in range
        _case("late", 20, 30, 15, 40 * MIN),  # +50 %, in range
        _case("beyond", horizon_min + 600, horizon_min, horizon_min, None),  # right: apart
        _case("missed", 100, horizon_min, horizon_min, None),  # forecast beyond, started
    ]
    f = figures(cases)
    assert (f["forecasts"], f["waited_10min"], f["beyond_horizon"]) == (6, 5, 1)
    # errors of early, exact, late and missed: -50, 0, +10 and horizon - 100 minutes
    assert f["median_relative_error"] == pytest.approx(0.5)
    assert f["median_abs_error_min"] == pytest.approx(50)
    assert f["bias_min"] == pytest.approx(10)
    assert f["within_25pct"] == pytest.approx(1 / 4)
    # in range: exact, late and the rightly beyond one (no latest: open-ended) of five
    assert f["range_holds"] == pytest.approx(3 / 5)


def test_the_report_marks_each_kind_against_its_target() -> None:
    good = figures([_case("a", 100, 110, 90, 120 * MIN)])  # 10 %
    poor = figures([_case("b", 100, 140, 90, 150 * MIN)])  # 40 %
    table = report({"run": {"given / none": poor, "learned / none": poor, "x": 1.0}})
    assert "run / given / none" in table and "(<= 20 %: MISSED)" in table
    assert "(<= 50 %: ok)" in table and "run / x" not in table
    assert "(<= 20 %: ok)" in report({"run": {"given / none": good}})
    assert KINDS == ("given / none", "given / recent", "learned / none", "learned / recent")


def test_the_diagnostics_give_one_side_of_the_moment_its_true_runtimes() -> None:
    state = State()
    statuses = {"run": RUNNING, "bind": ALLOCATED, "wait": PENDING, "done": SUCCEEDED}
    for seq, (name, status) in enumerate(statuses.items()):
        job = Job(name, "q", (PodSpec(name="p0"),), 1, 0, "train", True, 0, seq)
        job.status = status
        state.jobs[name] = job
    truth = {"run": 10, "bind": 20, "wait": 30, "done": 40}
    assert given_for("given", truth, state) is truth
    assert given_for("learned", truth, state) is None
    assert given_for("running-given", truth, state) == {"run": 10, "bind": 20}
    assert given_for("pending-given", truth, state) == {"wait": 30}


def test_the_report_marks_a_diagnostic_without_a_target() -> None:
    poor = figures([_case("b", 100, 140, 90, 150 * MIN)])  # 40 %
    table = report({"run": {"running-given / none": poor, "pending-given / none": poor}})
    assert table.count("(diagnostic)") == 2 and "MISSED" not in table and "ok)" not in table
    assert set(TARGETS) == set(ESTIMATES) and not set(DIAGNOSTICS) & set(TARGETS)


def test_the_sample_is_every_nth_submission_thinned_evenly_unless_the_limit_is_0() -> None:
    submissions = list(range(1000))
    assert sampled(submissions, 10, 0) == list(range(0, 1000, 10))
    assert sampled(submissions, 10, 200) == list(range(0, 1000, 10))  # 100: under the limit
    thinned = sampled(submissions, 10, 25)
    assert thinned == list(range(0, 1000, 40))


def test_the_median_relative_errors_interval_holds_it_and_narrows_with_more_jobs() -> None:
    few = [0.1, 0.3, 0.5, 0.7, 0.9] * 4
    many = few * 25
    low, high = interval(few)
    assert low <= 0.5 <= high and low < high
    assert interval(few) == (low, high)  # a fixed seed: the same interval every run
    narrow_low, narrow_high = interval(many)
    assert low <= narrow_low <= 0.5 <= narrow_high <= high
    assert narrow_high - narrow_low < high - low
    assert all(math.isnan(x) for x in interval([]))  # nothing to say
    row = _row("run / learned / none", figures([_case("a", 100, 140, 90, 150 * MIN)]))
    assert " 40 % (40–40) " in row
