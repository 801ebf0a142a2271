"""The one error every ``gpuledger`` sub-command raises for a user's mistake.

It lives in the lowest layer so that every package's command-line module can raise it
without importing the command-line shell (``scheduler.cli``), which imports them all.
"""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed as ``gpuledger: <message>`` with exit status 2."""


__all__ = ["CliError"]
