"""The scheduler: the policy core, its folds and runners, adapters and command line.

Importing it puts the policy core's compiled modules on the import path when they are
built for these sources (``scheduler.native``; ``GPULEDGER_CORE`` chooses).
"""

from scheduler import native as _native

_native.install()
