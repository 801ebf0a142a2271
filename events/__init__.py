"""Event schemas, codecs and the logs (embedded file log; Kafka in a later module)."""

from events.codec import (
    DecodeError,
    Envelope,
    Record,
    UnknownEventType,
    decode,
    decode_envelope,
    decode_event,
    encode,
    wrap,
)
from events.model import *  # noqa: F403  # the catalogue is the package's public surface
from events.model import __all__ as _model_all

__all__ = [
    "DecodeError",
    "Envelope",
    "Record",
    "UnknownEventType",
    "decode",
    "decode_envelope",
    "decode_event",
    "encode",
    "wrap",
    *_model_all,
]
