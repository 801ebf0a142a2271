"""Every event type has golden wire samples, and every sample still decodes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from events.codec import SCHEMA_VERSION, decode, encode
from events.model import EVENT_TYPES, AnyEvent, JobSubmitted, PolicyConfigured, tag_of
from tests.golden_samples import AT, SAMPLES

GOLDEN = Path(__file__).resolve().parent / "golden"
FILES = sorted(GOLDEN.glob("*.msgpack"))


def test_every_event_type_has_a_golden_sample() -> None:
    tags = {p.name.split(".")[0] for p in FILES}
    missing = sorted(tag_of(t) for t in EVENT_TYPES if tag_of(t) not in tags)
    assert not missing, f"no golden sample for {missing}: run scripts/make_golden.py"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_golden_sample_decodes_and_matches_its_json_twin(path: Path) -> None:
    record = decode(path.read_bytes(), offset=0)
    assert record.at == AT
    assert tag_of(type(record.event)) == path.name.split(".")[0]
    twin = path.parent.joinpath(path.name.removesuffix(".msgpack") + ".json").read_bytes()
    # an older twin lacks fields added since; decoding fills their defaults on both sides
    assert msgspec.json.decode(twin, type=AnyEvent) == record.event


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: tag_of(type(e)))
def test_current_encoder_writes_the_current_golden_bytes(event: object) -> None:
    """A change here means the wire format changed: add a new version, never overwrite."""
    path = GOLDEN / f"{tag_of(type(event))}.v{SCHEMA_VERSION}.msgpack"
    assert encode(event, AT) == path.read_bytes()  # type: ignore[arg-type]


def test_encoding_does_not_depend_on_string_identity() -> None:
    """Regression: omit_defaults compared by identity, so equal events encoded differently."""
    built = "".join(["gpu", "ledger"])  # equal to, but not the same object as, the default
    assert built is not "gpuledger"  # noqa: F632  # the point of the test
    assert encode(PolicyConfigured(policy=built), 0) == encode(PolicyConfigured(), 0)
    cls = "".join(["tr", "ain"])
    a = JobSubmitted(job="j", queue="q", pods=(), priority_class=cls)
    assert encode(a, 0) == encode(JobSubmitted(job="j", queue="q", pods=()), 0)
