"""Opening a reader over any ledger source a command accepts.

A *source* is what the CLI's ``LEDGER`` arguments name: a ledger directory (the file
log), a JSON Lines export (read whole into memory), or a Kafka ledger topic. This is the
one place that tells them apart, so every command reads the same sources the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from events.filelog import LedgerDirReader, LedgerError
from events.jsonl import iter_jsonl
from events.memlog import MemoryLedger
from events.port import LedgerReader


def open_reader(src: str | os.PathLike[str]) -> LedgerReader:
    """A reader over a ledger directory, a JSON Lines export (``.jsonl``/``.json``) or a
    Kafka ledger topic (``kafka://HOST:PORT/TOPIC?partition=N``).

    ``LedgerError`` names the source when it is none of these (or Kafka refuses it)."""
    if isinstance(src, str) and src.startswith("kafka://"):
        # Imported here: aiokafka is needed only by those who read from Kafka.
        from events.kafka_security import KafkaLogError  # noqa: PLC0415
        from events.kafkalog import open_kafka_reader  # noqa: PLC0415

        try:
            # Credentials and TLS come from the GPULEDGER_KAFKA_* environment.
            return open_kafka_reader(src)
        except KafkaLogError as exc:  # bad security settings, refused credentials, no topic
            raise LedgerError(str(exc)) from exc
    path = Path(src)
    if path.is_dir():
        return LedgerDirReader(path)
    if path.suffix in (".jsonl", ".json"):
        try:
            with open(path, "rb") as f:
                envelopes = list(iter_jsonl(f, source_name=str(path)))
        except FileNotFoundError:
            raise LedgerError(f"{path}: no such file") from None
        # A JSON Lines source read whole is an in-memory ledger.
        return MemoryLedger(envelopes, name=str(path))
    if not path.exists():
        raise LedgerError(f"{path}: no such ledger directory or JSON Lines file")
    raise LedgerError(f"{path}: neither a ledger directory nor a .jsonl/.json file")


__all__ = ["open_reader"]
