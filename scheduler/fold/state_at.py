"""``gpuledger state``: the cluster as it was at a moment of a ledger.

The ledger's events up to that moment — inputs and the decisions actually recorded — are
folded with the core's ``apply``; nothing is re-decided. Fair shares are divided as the
scheduler would have divided them then. Jobs that have ended are counted by how they ended
(the core keeps nothing else of them; the ledger and the projections have their details).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from events.codec import DecodeError, decode_event
from events.ledgertime import format_at, format_duration, is_wall_clock
from scheduler.core import State, apply, fair_shares, gpus
from scheduler.core.state import ACTIVE, PENDING, TERMINAL

NO_REASON = "none recorded: not tried yet (the jobs ahead of it in its queue are tried first)"
"""What a pending job without a reason shows: the policy records why a job waits when it
tries the job (a queue's head, a job tried in the gap behind it); one it passes over
without a try, such as a job its queue's limit holds back deep in a backlog, has none."""


@dataclass(slots=True)
class StateView:
    """A state as readable rows: what ``gpuledger state`` prints and the console shows.

    Not a ``scheduler.fold.snapshot.Snapshot`` (a stored state for restoring the scheduler):
    this one is derived for people and never read back.
    """

    headline: str
    queues: list[dict[str, object]] = field(default_factory=list)
    running: list[dict[str, object]] = field(default_factory=list)
    pending: list[dict[str, object]] = field(default_factory=list)
    ended: str = ""
    """How many jobs had ended by then, by how they ended: ``12 jobs: 11 succeeded, 1 failed``."""
    state: State = field(default_factory=State)


def fold(reader: Any, bound: tuple[str, int] | None = None) -> tuple[State, int]:
    """The state of the ledger's records up to an offset (exclusive) or a time (inclusive),
    or all of them, each applied as recorded; and the last offset applied (-1: none)."""
    kind, value = bound if bound is not None else ("all", 0)
    state = State()
    last = -1
    for offset, env in reader.read(0):
        if (kind == "offset" and offset >= value) or (kind == "time" and env.at > value):
            break
        try:
            event = decode_event(env, offset)
        except DecodeError:
            continue
        apply(state, event, env.at)
        last = offset
    if kind == "time":
        state.now = max(state.now, value)
    return state, last


def state_at(reader: Any, bound: tuple[str, int]) -> StateView:
    """Fold the ledger up to an offset (exclusive) or a time (inclusive)."""
    return describe(*fold(reader, bound))


def describe(state: State, last_offset: int) -> StateView:
    """Queues with their shares, running jobs, pending jobs with their reasons."""
    shares = fair_shares(state)
    now = state.now
    capacity = sum(n.gpus for n in state.nodes.values() if not n.cordoned)
    used = sum(n.gpus * 1000 - n.free_gpu_milli for n in state.nodes.values()) // 1000
    snap = StateView(
        headline=(
            f"at {format_at(now, is_wall_clock(now))} (through offset {last_offset}): "
            f"{len(state.nodes)} nodes, "
            f"{capacity} schedulable GPUs, {used} allocated; policy {state.policy} "
            f"(revision {state.config.revision})"
        ),
        state=state,
    )
    counts = {s: n for s, n in state.status_counts().items() if s in TERMINAL}
    total = sum(counts.values())
    snap.ended = f"{total} job{'' if total == 1 else 's'}" + (
        ": " + ", ".join(f"{n} {status}" for status, n in counts.items()) if counts else ""
    )
    for name in sorted(state.queues):
        q = state.queues[name]
        snap.queues.append(
            {
                "queue": state.queue_path(name),
                "deserved": gpus(shares.deserved[name][0]),
                "fair_share": gpus(shares.fair[name][0]),
                "allocated": gpus(q.allocated[0]),
                "pending_jobs": len(q.pending),
            }
        )
    for job in state.jobs.values():
        if job.status in ACTIVE:
            nodes = sorted({p.node for p in job.placements.values()})
            since = job.started_at if job.started_at is not None else job.allocated_at
            snap.running.append(
                {
                    "job": job.job,
                    "queue": job.queue,
                    "status": job.status,
                    "gpus": gpus(sum(s.milli for p in job.placements.values() for s in p.gpus)),
                    "nodes": ",".join(nodes[:4]) + ("…" if len(nodes) > 4 else ""),
                    "for": format_duration((now - since) / 1000) if since is not None else "-",
                }
            )
        elif job.status == PENDING:
            snap.pending.append(
                {
                    "job": job.job,
                    "queue": job.queue,
                    "gpus": gpus(job.request[0]),
                    "waiting": format_duration((now - job.submitted_at) / 1000),
                    "cause": job.cause or "-",
                    "reason": job.reason or NO_REASON,
                }
            )
    return snap
