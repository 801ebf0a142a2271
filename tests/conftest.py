"""Test-wide settings.

Hypothesis explores new random examples on every developer run; CI (``CI=true``) runs a
fixed, derandomized set so that a landing never hinges on the luck of the draw. A failure
found while developing is kept by Hypothesis's example database and turned into a
regression test.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
