"""Envelopes and codecs: msgpack for the log, JSON for people.

A record on any log is an ``Envelope``: the event's ``type`` tag, its ``key``, its time
``at`` (ms), the schema ``version`` and the encoded event as an opaque ``payload``. A
reader decodes the envelope first and the payload only if it knows the type, so an event
from a newer writer is skipped or parked, never a crash.
"""

from __future__ import annotations

from typing import Any

import msgspec

from events.ledgertime import format_at, is_wall_clock
from events.model import TAGS, AnyEvent, Event, event_key, tag_of

SCHEMA_VERSION = 9


class Envelope(msgspec.Struct, frozen=True):
    """One record of a log, as stored."""

    type: str
    key: str
    at: int
    payload: msgspec.Raw
    version: int = SCHEMA_VERSION


class Record(msgspec.Struct, frozen=True):
    """A decoded record with its log offset."""

    offset: int
    at: int
    event: Event


class DecodeError(ValueError):
    """A record could not be decoded; the message names the offset and the field."""


class UnknownEventType(DecodeError):  # noqa: N818  # names what it is; still a DecodeError
    """The envelope is fine but this reader does not know its type."""


# What msgspec raises on bad input: a malformed document, a schema mismatch, or a string
# that is not UTF-8 (msgspec lets UnicodeDecodeError through).
_BAD_INPUT = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)

_env_enc = msgspec.msgpack.Encoder()
_env_dec = msgspec.msgpack.Decoder(Envelope)
_event_dec: msgspec.msgpack.Decoder[AnyEvent] = msgspec.msgpack.Decoder(AnyEvent)
_json_event_dec: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)
_json_enc = msgspec.json.Encoder()


def wrap(event: Event, at: int, version: int = SCHEMA_VERSION) -> Envelope:
    """Put an event in its envelope (of ``version``: this schema's unless said)."""
    return Envelope(
        type=tag_of(type(event)),
        key=event_key(event),
        at=at,
        payload=msgspec.Raw(_env_enc.encode(event)),
        version=version,
    )


def encode(event: Event, at: int) -> bytes:
    """msgpack bytes of the event's envelope: what a log stores."""
    return _env_enc.encode(wrap(event, at))


def encode_envelope(env: Envelope) -> bytes:
    """msgpack bytes of an envelope, exactly as a log stores it."""
    return _env_enc.encode(env)


def decode_envelope(data: bytes | memoryview, offset: int = -1) -> Envelope:
    """Decode only the envelope; raises DecodeError naming the offset."""
    try:
        return _env_dec.decode(data)
    except _BAD_INPUT as exc:
        raise DecodeError(f"offset {offset}: bad envelope: {exc}") from exc


def decode_event(env: Envelope, offset: int = -1) -> Event:
    """Decode an envelope's payload; UnknownEventType for a type this reader lacks."""
    if env.type not in TAGS:
        raise UnknownEventType(f"offset {offset}: unknown event type {env.type!r}")
    try:
        event = _event_dec.decode(env.payload)
    except _BAD_INPUT as exc:
        raise DecodeError(f"offset {offset}: bad {env.type} payload: {exc}") from exc
    if tag_of(type(event)) != env.type:
        raise DecodeError(
            f"offset {offset}: envelope says {env.type} but payload is {tag_of(type(event))}"
        )
    return event


def decode(data: bytes | memoryview, offset: int = -1) -> Record:
    """Decode a stored record fully."""
    env = decode_envelope(data, offset)
    return Record(offset=offset, at=env.at, event=decode_event(env, offset))


# --------------------------------------------------------------------------- JSON for people


def event_to_builtins(event: Event) -> dict[str, Any]:
    """The event as plain JSON-able values (with its ``type`` tag)."""
    result: dict[str, Any] = msgspec.to_builtins(event)
    return result


def to_json_line(offset: int, env: Envelope, *, iso: bool = False) -> bytes:
    """One JSON Lines row for an envelope: offset, type, key, at, version, payload.

    With ``iso`` a record stamped in wall time (``events.ledgertime``) also carries
    ``at_iso``, its time as ISO-8601 UTC, for people reading ``log cat``; an export
    leaves it out (``from_json_line`` ignores it either way).

    Raises DecodeError naming the offset if the payload has no JSON form (msgpack
    extension types, say, which no gpuledger writer produces).
    """
    try:
        payload = msgspec.msgpack.decode(env.payload)
        row: dict[str, Any] = {
            "offset": offset,
            "type": env.type,
            "key": env.key,
            "at": env.at,
        }
        if iso and is_wall_clock(env.at):
            row["at_iso"] = format_at(env.at, wall=True)
        row["version"] = env.version
        row["payload"] = payload
        return _json_enc.encode(row)
    except (*_BAD_INPUT, msgspec.EncodeError, TypeError) as exc:
        raise DecodeError(f"offset {offset}: {env.type} payload has no JSON form: {exc}") from exc


class JsonRow(msgspec.Struct, frozen=True):
    """A JSON Lines row as exported. ``offset`` is not kept on import (the ledger numbers
    what it appends), but rows that carry one must carry consecutive ones
    (``events.jsonl.iter_jsonl``)."""

    type: str
    at: int
    payload: msgspec.Raw
    key: str = ""
    version: int = SCHEMA_VERSION
    offset: int = -1


_json_row_dec = msgspec.json.Decoder(JsonRow)
_STORABLE = range(-(2**63), 2**64)
"""The integers msgpack stores (int64 and uint64); JSON has no such limit."""


def from_json_line(line: bytes, where: str = "") -> Envelope:
    """Parse an exported JSON line back to a stored envelope, validating the payload.

    Unknown types are kept as they are (their payload re-encoded as msgpack), so an
    export/import round trip never loses a record this version cannot interpret.
    """
    return from_json_row(line, where)[1]


def from_json_row(line: bytes, where: str = "") -> tuple[int, Envelope]:
    """``from_json_line`` with the row's offset (-1: the row gives none)."""
    try:
        row = _json_row_dec.decode(line)
    except _BAD_INPUT as exc:
        raise DecodeError(f"{where}: {exc}") from exc
    for name, value in (("at", row.at), ("version", row.version), ("offset", row.offset)):
        if value not in _STORABLE:
            raise DecodeError(f"{where}: {name} {value} is out of range")
    # OverflowError: an integer beyond what msgpack stores.
    try:
        if row.type in TAGS:
            event = _json_event_dec.decode(row.payload)
            if tag_of(type(event)) != row.type:
                raise DecodeError(
                    f"{where}: row type {row.type} but payload is {tag_of(type(event))}"
                )
            payload = _env_enc.encode(event)
        else:
            payload = _env_enc.encode(msgspec.json.decode(row.payload))
    except (*_BAD_INPUT, OverflowError) as exc:
        raise DecodeError(f"{where}: bad {row.type} payload: {exc}") from exc
    return row.offset, Envelope(
        type=row.type, key=row.key, at=row.at, payload=msgspec.Raw(payload), version=row.version
    )


def event_json(event: Event) -> bytes:
    """Compact JSON of an event (with its tag), for people and diffs."""
    return _json_enc.encode(event)
