"""``bench.sweeps`` writes a Helios ``cluster_log.csv`` that the real importer reads, the
same on every run, with the features the bench needs: bursts of like jobs and multi-node
jobs that become gangs of pods asking for CPU."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from bench import sweeps
from replay.traces import Mapping, import_trace


def test_the_generated_trace_imports_as_helios_with_cpu_gangs_and_sweeps(tmp_path: Path) -> None:
    rows = sweeps.generate(jobs=400, gpus=64, seed=3)
    assert rows == sweeps.generate(jobs=400, gpus=64, seed=3)
    assert rows != sweeps.generate(jobs=400, gpus=64, seed=4)
    path = tmp_path / "cluster_log.csv"
    sweeps.write(path, rows)
    trace = import_trace("helios", path, Mapping(quota_from="demand"), None, 64)
    jobs = trace.workload.jobs
    assert len(jobs) == 400
    assert [j.at_s for j in jobs] == sorted(j.at_s for j in jobs)
    gangs = [j for j in jobs if j.pods > 1]
    assert gangs and all(j.gpus_per_pod == 8 and j.cpu_per_pod == 32 for j in gangs)
    # a sweep: consecutive like jobs of one tenant submitted within seconds
    alike = sum(
        1
        for a, b in pairwise(jobs)
        if a.queue == b.queue
        and a.pods * a.gpus_per_pod == b.pods * b.gpus_per_pod
        and b.at_s - a.at_s <= 5
    )
    assert alike >= 40
    assert {q.name for q in trace.queues().queues} == {j.queue for j in jobs}
