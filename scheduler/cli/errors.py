"""The one error every ``gpuledger`` sub-command raises for a user's mistake.

Library code raises its own exceptions (``LedgerError``, ``ConfigError``, ``KafkaLogError``
...); the command modules of this package turn the ones a user can cause into ``CliError``,
which ``scheduler.cli.main`` prints as one line.
"""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed as ``gpuledger: <message>`` with exit status 2."""


__all__ = ["CliError"]
