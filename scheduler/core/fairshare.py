"""Hierarchical fair share, per resource, in exact integer arithmetic.

At every level of the queue tree, siblings divide what their parent got:

1. each child first gets its deserved quota, capped by what it asks for (allocated plus
   pending requests in its subtree) and by its limit, even when the quotas together exceed
   what the parent got (the shares then add up to more, and step 2 has nothing to give);
2. the remainder goes to children that still want more, highest queue priority first,
   and within one priority by iterative water-filling in proportion to over-quota weight
   (a child whose want is met drops out and its unused portion is divided again);
3. each child's fair share is then divided among its own children the same way.

Integer division leaves a few units over; they go one at a time by weight, then name, so
the result is exact and identical on every run. With ``share_rounding: whole`` step 2 is
KAI-Scheduler's: each portion is floored to whole units (``UNITS``) and the units left
over go by largest fraction, then the order the queues were configured in, then name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from events.model import Resources
from scheduler.core.state import UNLIMITED, Queue, ShareMemo, State

RESOURCES: Final = 3  # gpu_milli, cpu_milli, memory_mib
UNITS: Final = (1000, 1, 1)
"""The whole unit of each resource under ``share_rounding: whole``: one GPU, one milli-CPU,
one MiB (KAI-Scheduler counts CPU in millicores)."""


def capacity(state: State) -> list[int]:
    """Total resources of the nodes that take pods (not cordoned)."""
    version, cached = state.capacity_cache
    if version == state.topology:
        return list(cached)
    total = [0, 0, 0]
    for node in state.nodes.values():
        if node.cordoned:
            continue
        total[0] += node.gpus * 1000
        total[1] += node.cpu_milli
        total[2] += node.memory_mib
    state.capacity_cache = (state.topology, tuple(total))
    return total


def demands(state: State) -> dict[str, list[int]]:
    """Per queue (inner ones included): allocated plus pending requests of its subtree."""
    result: dict[str, list[int]] = {name: list(q.allocated) for name, q in state.queues.items()}
    for leaf in state.queues.values():
        if not leaf.pending:
            continue
        want = state.wanted(leaf)
        for queue in state.ancestors(leaf.name):
            row = result[queue.name]
            row[0] += want[0]
            row[1] += want[1]
            row[2] += want[2]
    return result


def roots(state: State) -> list[Queue]:
    """Top-level queues (no parent, or a parent not configured), by name."""
    return [
        state.queues[n]
        for n in sorted(state.queues)
        if not state.queues[n].parent or state.queues[n].parent not in state.queues
    ]


def deserved_of(queue: Queue, resource: int, parent_deserved: int) -> int:
    """A queue's deserved amount of one resource (a GPU percentage resolves here)."""
    if resource == 0 and queue.deserved_gpu_percent is not None:
        return max(0, parent_deserved) * queue.deserved_gpu_percent // 100
    return max(0, _amount(queue.deserved, resource))


def limit_of(queue: Queue, resource: int) -> int:
    """A queue's limit of one resource, or UNLIMITED."""
    return _amount(queue.limit, resource)


def _amount(of: Resources, resource: int) -> int:
    """One resource of ``of`` (0 GPU, 1 CPU, 2 memory). (Read by branch: compiled, each
    field of the event model's struct is a Python attribute read, and a tuple of all three
    cost three of them and the tuple, in the test reclaim and admission make per level.)"""
    if resource == 0:
        return of.gpu_milli
    if resource == 1:
        return of.cpu_milli
    return of.memory_mib


def bounded(limit: int) -> bool:
    """Whether a limit (``limit_of``) is set: UNLIMITED and negative values are not."""
    return limit != UNLIMITED and limit >= 0


@dataclass(slots=True)
class Shares:
    """The division of one cycle: per queue, ``[gpu_milli, cpu_milli, memory_mib]``."""

    fair: dict[str, list[int]]
    deserved: dict[str, list[int]]
    demand: dict[str, list[int]]
    placed: dict[str, list[int]]
    """``[gpu_milli, cpu_milli, memory_mib]`` placed in each queue (and its ancestors)
    during this cycle: borrowing done in a cycle is not grounds for reclaiming from the
    same queue in that cycle."""

    def __init__(
        self,
        fair: dict[str, list[int]],
        deserved: dict[str, list[int]],
        demand: dict[str, list[int]],
        placed: dict[str, list[int]] | None = None,
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.fair = fair
        self.deserved = deserved
        self.demand = demand
        self.placed = {} if placed is None else placed

    def held_before(self, queue: Queue, resource: int) -> int:
        """What ``queue`` held of ``resource`` before this cycle's placements."""
        placed = self.placed.get(queue.name)
        return queue.allocated[resource] - (placed[resource] if placed else 0)


def fair_shares(
    state: State, demand: dict[str, list[int]] | None = None, *, resources: int = RESOURCES
) -> Shares:
    """Fair share (and resolved deserved quota) of every queue for every resource.

    Each resource is divided on its own; ``resources=1`` divides the GPUs only (the other
    resources' shares and quotas are then 0), for a reader that needs nothing else.
    """
    if demand is None:
        demand = demands(state)
    total = capacity(state)
    shares: dict[str, list[int]] = {name: [0, 0, 0] for name in state.queues}
    deserved: dict[str, list[int]] = {name: [0, 0, 0] for name in state.queues}
    top = roots(state)
    rank = None
    if state.config.share_rounding == "whole":
        rank = {name: i for i, name in enumerate(state.queues)}
    for resource in range(resources):
        division = _Division(state, resource, demand, shares, deserved, rank)
        _divide(division, top, total[resource], total[resource])
    return Shares(fair=shares, deserved=deserved, demand=demand)


def cycle_shares(state: State) -> Shares:
    """``fair_shares`` for a cycle of the gang policy, reusing the last cycle's division
    (``State.share_cache``) when it would come out the same.

    A queue's demand enters the division only as its cap, ``min(demand, limit)``, and a
    cap no larger than the share the queue got never bounds a grant: every grant of the
    division (its deserved part, each water-filling portion, each unit handed out) is
    the same with any cap above that share. So when the capacity, the configuration and
    the queue tree (which drops the memo) are those of the last division, usage plays
    no part (no time-based share) and each queue whose cap changed got less than both
    its caps, old and new, every share and quota is the one the last division gave. In
    a congested cluster a submission or an end changes the demand of queues that want
    more than their share: that is most cycles."""
    demand = demands(state)
    memo = state.share_cache
    if (
        memo is not None
        and state.tuning.share_memo
        and memo.config is state.config
        and memo.topology == state.topology
        and state.config.half_life_ms <= 0
        and _same_division(state, memo.demand, demand, memo.fair)
    ):
        memo.demand = demand
        return Shares(fair=memo.fair, deserved=memo.deserved, demand=demand)
    shares = fair_shares(state, demand)
    state.share_cache = ShareMemo(
        state.config, state.topology, demand, shares.fair, shares.deserved
    )
    return shares


def _same_division(
    state: State,
    before: dict[str, list[int]],
    now: dict[str, list[int]],
    fair: dict[str, list[int]],
) -> bool:
    """Whether every queue whose cap moved from ``before``'s demands to ``now``'s got a
    share (``fair``) below both caps (see ``cycle_shares``)."""
    if before.keys() != now.keys():
        return False
    for name, want in now.items():
        old = before[name]
        if want == old:
            continue
        queue = state.queues[name]
        share = fair[name]
        for resource in range(RESOURCES):
            if want[resource] == old[resource]:
                continue
            limit = limit_of(queue, resource)
            cap, was = want[resource], old[resource]
            if bounded(limit):
                cap, was = min(cap, limit), min(was, limit)
            if cap != was and share[resource] >= min(cap, was):
                return False
    return True


@dataclass(slots=True)
class _Division:
    """One resource's division down the queue tree, written into ``shares`` and
    ``deserved`` (per queue, by resource index)."""

    state: State
    resource: int
    demand: dict[str, list[int]]
    shares: dict[str, list[int]]
    deserved: dict[str, list[int]]
    rank: dict[str, int] | None = None
    """Under ``share_rounding: whole``, each queue's place in the order queues were first
    configured (``State.queues`` keeps it); None for the exact milli division."""

    def children(self, queue: Queue) -> list[Queue]:
        return [self.state.queues[c] for c in queue.children if c in self.state.queues]


def _divide(div: _Division, children: list[Queue], amount: int, parent_deserved: int) -> None:
    if not children:
        return
    resource = div.resource
    if amount <= 0:
        # Nothing to share (e.g. CPU on nodes that report none): every share is 0, even
        # where a deserved quota is set, and only the deserved quotas resolve.
        for queue in children:
            own = deserved_of(queue, resource, parent_deserved)
            div.deserved[queue.name][resource] = own
            div.shares[queue.name][resource] = 0
            _divide(div, div.children(queue), 0, own)
        return
    caps: dict[str, int] = {}
    given: dict[str, int] = {}
    order = sorted(children, key=lambda q: (-q.priority, q.name))
    left = amount
    for queue in order:
        want = div.demand.get(queue.name, [0, 0, 0])[resource]
        limit = limit_of(queue, resource)
        cap = min(want, limit) if bounded(limit) else want
        caps[queue.name] = cap
        own = deserved_of(queue, resource, parent_deserved)
        div.deserved[queue.name][resource] = own
        # Every child gets min(deserved, request) whatever its siblings took, as in
        # KAI-Scheduler: when the deserved quotas are over-subscribed the shares add up
        # to more than ``amount``, ``left`` goes negative and nothing is over quota.
        first = min(own, cap)
        given[queue.name] = first
        left -= first
    # Over-quota: priority buckets, highest first; water-fill by weight inside each.
    weights = _weights(div.state, order)
    priorities = sorted({q.priority for q in order}, reverse=True)
    for priority in priorities:
        if left <= 0:
            break
        bucket = [q for q in order if q.priority == priority]
        if div.rank is None:
            left = _water_fill(left, bucket, caps, given, weights)
        else:
            fill = _Fill(caps, given, weights, UNITS[resource], div.rank)
            left = _water_fill_whole(left, bucket, fill)
    for queue in order:
        share = given[queue.name]
        div.shares[queue.name][resource] = share
        _divide(div, div.children(queue), share, div.deserved[queue.name][resource])


def _water_fill(
    amount: int,
    bucket: list[Queue],
    caps: dict[str, int],
    given: dict[str, int],
    weights: dict[str, int],
) -> int:
    """Divide ``amount`` among the bucket by over-quota weight up to each cap; return rest."""
    active = [q for q in bucket if weights[q.name] > 0 and given[q.name] < caps[q.name]]
    while amount > 0 and active:
        total_weight = sum(weights[q.name] for q in active)
        round_amount = amount
        progressed = 0
        for queue in active:
            portion = round_amount * weights[queue.name] // total_weight
            grant = min(portion, caps[queue.name] - given[queue.name])
            given[queue.name] += grant
            progressed += grant
        amount -= progressed
        if progressed == 0:
            # Rounding left less than one unit per weight: hand out single units.
            for queue in sorted(active, key=lambda q: (-weights[q.name], q.name)):
                if amount == 0:
                    break
                given[queue.name] += 1
                amount -= 1
        active = [q for q in active if given[q.name] < caps[q.name]]
    return amount


@dataclass(slots=True)
class _Fill:
    """What whole-unit water-filling works on: caps and grants so far per queue, the
    over-quota weights, the resource's unit and the queues' configuration order."""

    caps: dict[str, int]
    given: dict[str, int]
    weights: dict[str, int]
    unit: int
    rank: dict[str, int]

    def room(self, queue: Queue) -> int:
        return self.caps[queue.name] - self.given[queue.name]


def _water_fill_whole(amount: int, bucket: list[Queue], fill: _Fill) -> int:
    """KAI-Scheduler's over-quota division of ``amount`` in whole units; return the rest.

    Each round, the whole units of ``amount`` are divided by weight among the queues that
    still want more: every queue gets its portion floored to whole units, and the units
    the flooring left go one each by largest fraction, then configuration order, then
    name. A grant is capped by what the queue still wants; what a capped queue leaves is
    divided again in the next round. Less than one unit left is given whole to the first
    queue in that order, largest weight first.
    """
    weights = fill.weights
    active = [q for q in bucket if weights[q.name] > 0 and fill.room(q) > 0]
    while amount > 0 and active:
        units = amount // fill.unit
        if units == 0:
            first = min(active, key=lambda q: (-weights[q.name], fill.rank[q.name], q.name))
            grant = min(amount, fill.room(first))
            fill.given[first.name] += grant
            amount -= grant
        else:
            amount -= _whole_round(units, active, fill)
        active = [q for q in active if fill.room(q) > 0]
    return amount


def _whole_round(units: int, active: list[Queue], fill: _Fill) -> int:
    """One round of ``_water_fill_whole``: divide ``units`` whole units; return what it
    granted (in the resource's own units, e.g. milli-GPUs)."""
    total_weight = sum(fill.weights[q.name] for q in active)
    floors: dict[str, int] = {}
    fractions: dict[str, int] = {}
    for queue in active:
        floors[queue.name], fractions[queue.name] = divmod(
            units * fill.weights[queue.name], total_weight
        )
    spare = units - sum(floors.values())
    by_fraction = sorted(active, key=lambda q: (-fractions[q.name], fill.rank[q.name], q.name))
    for queue in by_fraction[:spare]:
        floors[queue.name] += 1
    granted = 0
    for queue in active:
        grant = min(floors[queue.name] * fill.unit, fill.room(queue))
        fill.given[queue.name] += grant
        granted += grant
    return granted


# --------------------------------------------------------------------------- time-based share

_STEPS: Final = 1024
# 2^(-i/1024) in 2^32 fixed point. Computed once with IEEE doubles and rounded, so every
# later use is integer arithmetic: the same ledger decays the same way on every run.
_DECAY: Final = tuple(round(2 ** (32 - i / _STEPS)) for i in range(_STEPS))


def decay(value: int, elapsed_ms: int, half_life_ms: int) -> int:
    """``value`` after ``elapsed_ms`` of exponential decay with the given half-life."""
    if elapsed_ms <= 0 or value == 0:
        return value
    steps = elapsed_ms * _STEPS // half_life_ms
    halvings, rest = divmod(steps, _STEPS)
    if halvings >= 64:
        return 0
    return ((value >> halvings) * _DECAY[rest]) >> 32


def accrue_usage(state: State) -> None:
    """Decay every queue's usage to now and add what it held since the last cycle.

    Usage is GPU-milli x ms, charged to a leaf queue and each of its ancestors; it is
    derived from the ledger alone (allocations and cycle times), so it replays.
    """
    half_life = state.config.half_life_ms
    elapsed = state.now - state.usage_at
    if elapsed <= 0:
        return
    usage = state.usage
    for name in list(usage):
        usage[name] = decay(usage[name], elapsed, half_life)
    for leaf, held in state.usage_alloc.items():
        if held <= 0:
            continue
        for queue in state.ancestors(leaf):
            usage[queue.name] = usage.get(queue.name, 0) + held * elapsed
    state.usage_at = state.now


def _weights(state: State, siblings: list[Queue]) -> dict[str, int]:
    """Over-quota weights, moved by past usage when time-based fair share is on.

    As KAI's kValue: a queue whose share of the siblings' decayed usage exceeds its share
    of their weights gets proportionally less of what is over quota, one below it more:
    ``weight x max(0, 1 + k x (weight share - usage share))``, in parts per million.
    """
    base = {q.name: q.over_quota_weight * 1_000_000 for q in siblings}
    if state.config.half_life_ms <= 0:
        return base
    total_usage = sum(state.usage.get(q.name, 0) for q in siblings)
    total_weight = sum(q.over_quota_weight for q in siblings)
    if total_usage <= 0 or total_weight <= 0:
        return base
    k = state.config.k_value_milli
    adjusted: dict[str, int] = {}
    for q in siblings:
        weight_share = q.over_quota_weight * 1_000_000 // total_weight
        usage_share = state.usage.get(q.name, 0) * 1_000_000 // total_usage
        factor = max(0, 1_000_000 + k * (weight_share - usage_share) // 1000)
        adjusted[q.name] = q.over_quota_weight * factor
    return adjusted
