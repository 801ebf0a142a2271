"""The folds of the ledger, between the policy core and everything that runs or reads it.

One layer up from ``scheduler.core`` (which it alone may import, with ``events``):

- ``step``: the one runtime step every runner calls (validate → apply → cycle → record),
  with ``validate``, the intake checks it applies;
- ``replayer``: re-runs a ledger's records through that step and compares each decision
  with the recorded one; ``verify`` drives it over a whole ledger (``replay --verify``, the
  embedded runner's restart);
- ``snapshot``: the state's snapshot codec and the catch-up of a snapshot with a ledger tail;
- ``outcomes``: every job's fate, folded from the ledger (projections, compare, what-if);
- ``state_at``: the state at a moment of a ledger, as readable rows (``gpuledger state``,
  the console's time travel).

Nothing here performs I/O of its own: readers and writers are passed in.
"""
