"""How close each queue stays to its fair share while it has to compete for GPUs.

A ``FairnessMonitor`` observes the simulation after every cycle. While a queue has work
waiting and the cluster has less free GPU than that work needs (contention), it charges
the time to the queue and checks whether the queue's allocation is within one gang (its
largest job) of its fair share. The claim it measures: under contention every queue
converges to within one gang of its fair share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core import State, fair_shares


@dataclass(slots=True)
class QueueFairness:
    """One queue's record."""

    contended_ms: int = 0
    within_ms: int = 0
    deviation_gpu_ms: int = 0
    """Integral of |allocated - fair share| over contended time, milli-GPU x ms."""

    @property
    def within_share(self) -> float:
        """Fraction of contended time spent within one gang of the fair share."""
        return self.within_ms / self.contended_ms if self.contended_ms else 1.0


@dataclass(slots=True)
class FairnessMonitor:
    """Call ``observe(state, now)`` after each cycle; read ``queues`` at the end."""

    queues: dict[str, QueueFairness] = field(default_factory=dict)
    _at: int = 0
    _last: dict[str, tuple[int, bool, bool]] = field(default_factory=dict)

    def observe(self, state: State, now: int) -> None:
        """Charge the interval since the last cycle, then sample the state as it is now."""
        elapsed = now - self._at
        if elapsed > 0:
            for name, (deviation, contended, within) in self._last.items():
                if not contended:
                    continue
                record = self.queues.setdefault(name, QueueFairness())
                record.contended_ms += elapsed
                record.deviation_gpu_ms += deviation * elapsed
                if within:
                    record.within_ms += elapsed
        self._at = now
        free = sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned)
        shares = fair_shares(state)
        sample: dict[str, tuple[int, bool, bool]] = {}
        for leaf in state.leaf_queues():
            waiting = [state.jobs[j].request[0] for _, _, j in leaf.pending]
            if not waiting:
                sample[leaf.name] = (0, False, True)
                continue
            gang = max(waiting + [state.jobs[j].request[0] for j in leaf.active])
            deviation = abs(leaf.allocated[0] - shares.fair[leaf.name][0])
            contended = free < min(waiting)
            sample[leaf.name] = (deviation, contended, deviation <= gang)
        self._last = sample

    def rows(self) -> list[dict[str, object]]:
        """Per queue: contended hours, % of it within one gang, mean deviation in GPUs."""
        out: list[dict[str, object]] = []
        for name in sorted(self.queues):
            record = self.queues[name]
            hours = record.contended_ms / 3_600_000
            mean = (
                record.deviation_gpu_ms / record.contended_ms / 1000 if record.contended_ms else 0.0
            )
            out.append(
                {
                    "queue": name,
                    "contended_h": round(hours, 2),
                    "within_one_gang": f"{100 * record.within_share:.0f}%",
                    "mean_gap_gpus": round(mean, 2),
                }
            )
        return out
