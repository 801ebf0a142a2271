"""The aiokafka settings the live path depends on, checked against the installed aiokafka:
an upgrade that moves them fails here rather than silently slowing every transaction."""

from __future__ import annotations

from aiokafka.producer import sender

import events.kafka_admin  # noqa: F401  # sets the retry below on import


def test_a_refused_add_partitions_is_retried_after_2_ms() -> None:
    assert sender.BACKOFF_OVERRIDE == 0.002
    # the handler reads the module's global at each refusal, so the setting takes effect
    code = sender.AddPartitionsToTxnHandler.handle_response.__code__
    assert "BACKOFF_OVERRIDE" in code.co_names
