"""The one retry helper of the Kubernetes adapters: bounded tries with doubling back-off.

Every adapter that retries a call — the binder's bindings and evictions, the ingestor's
reads of owner objects, the Kafka sink's transactions — goes through ``retry``; the
ingestor's watch reconnections take their delays from the same ``Backoff``. What counts as
transient is the caller's (``scheduler.kube.client.is_transient`` for API calls). This
module imports neither the Kubernetes client nor aiokafka, so the file and Kafka
transports can use it without loading the client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between tries: ``first_s``, then doubling, never above ``max_s``."""

    first_s: float = 0.2
    max_s: float = 10.0

    def delays(self) -> Iterator[float]:
        """The delays, endlessly (a new iterator starts again at ``first_s``)."""
        delay = self.first_s
        while True:
            yield delay
            delay = min(delay * 2, self.max_s)


def retry(
    call: Callable[[], T],
    *,
    what: str,
    attempts: int,
    transient: Callable[[BaseException], bool],
    backoff: Backoff = Backoff(),  # frozen: one shared default is safe
    describe: Callable[[BaseException], str] = str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, tried up to ``attempts`` times while it raises errors that ``transient``
    accepts, sleeping ``backoff``'s delays between tries; each retried error is logged as a
    warning naming ``what`` (``describe`` turns it into text). A non-transient error is
    raised at once; when the attempts run out, the last transient error is raised."""
    if attempts < 1:
        raise ValueError(f"retry of {what}: attempts must be at least 1, got {attempts}")
    delays = backoff.delays()
    attempt = 1
    while True:
        try:
            return call()
        except Exception as exc:
            if not transient(exc) or attempt == attempts:
                raise
            log.warning(
                "%s: transient error (attempt %d of %d): %s", what, attempt, attempts, describe(exc)
            )
        sleep(next(delays))
        attempt += 1
