"""The one admission predicate: whether a queue's headroom holds a job back.

``admission.admission_reason`` words why a job may not start whatever the room (a limit of
its queue's chain, or the deserved quota for non-preemptible work); ``admission_headroom``
folds the same bounds over the chain once, and every place that only needs to know
*whether* a job is held back — the walk behind a blocked head (``allocate._skip_jobs``,
``allocate._past_held``) and the summaries of pending blocks (``pendingblocks.Summary``) —
asks ``admission_held`` here (the walk through ``held_back``, which passes a preemptible
job where no limit applies without asking). It lives in a module of its own, importing
nothing, because the pending blocks are part of ``State``, below ``admission``.
"""

from __future__ import annotations

__all__ = ["Headroom", "admission_held", "held_back"]

Headroom = tuple[int, int, int, int]
"""``admission.admission_headroom``: per resource the most a job may ask for within every
limit of its queue's chain, then the most GPU a non-preemptible job may ask for within
every deserved quota of it (``running.NEVER``: no bound)."""


def admission_held(headroom: Headroom, request: tuple[int, int, int], preemptible: bool) -> bool:
    """Whether ``admission_reason`` holds back a job of this request and preemptibility
    (it gives a reason exactly when this is True), without wording the reason. Where no
    limit applies the first three bounds are unbounded, so a preemptible job is never held:
    a caller may pass such jobs over without asking (``limited`` in ``allocate``)."""
    return (
        request[0] > headroom[0]
        or request[1] > headroom[1]
        or request[2] > headroom[2]
        or (not preemptible and request[0] > headroom[3])
    )


def held_back(
    limited: bool, headroom: Headroom, request: tuple[int, int, int], preemptible: bool
) -> bool:
    """``admission_held`` as the walk asks it: a preemptible job where no limit applies
    (``limited`` False) is never held, so it is passed without asking."""
    return (limited or not preemptible) and admission_held(headroom, request, preemptible)
