"""The runners: where inputs come from and where the records go, around ``scheduler.fold.step``.

- ``engine``: the runtime step plus a ledger writer (the simulator, the embedded loop);
- ``embedded``: the scheduler loop over the embedded file log (intake directories);
- ``service``: the live scheduler on Kafka (transactional consume → cycle → produce);
- ``intake``: producers to the live intake topic and the dead-letter reader.

They add no policy: what happens to an input is decided by the step, in the fold layer.
"""
