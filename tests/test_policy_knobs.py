"""The policy knobs are declared once (``Knob`` on ``PolicyConfigured``'s fields) and every
other form is derived: ``policy.yaml`` (``PolicyFile``), its conversion to the event
(``policy_event``), ``--policy kai`` (``KAI_KNOBS``) and the docs that list them.

These tests fail when a knob reaches one form and not another."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from events.knobs import Knob, knob_table
from events.model import POLICY_KNOBS, PolicyConfigured
from replay.config import ConfigError, PolicyFile, json_schema, parse, policy_event
from scheduler.core.policy import KAI_KNOBS, kai_knobs
from scheduler.fold.step import live_policy

DOCS = Path(__file__).resolve().parent.parent / "docs"

NOT_KNOBS = ["policy", "revision", "requeue_lost"]
"""The fields of ``policy_configured`` that are no knob of ``policy.yaml``: the policy's
name, the core's revision, and what lost pods become (the simulator's or a live ledger's)."""

IDS = [k.field for k in POLICY_KNOBS]


def test_every_field_of_the_event_is_a_knob_or_named_as_none() -> None:
    # A new field of policy_configured is either a knob (with a Knob) or added here.
    fields = [f.name for f in msgspec.structs.fields(PolicyConfigured)]
    assert [f for f in fields if f not in IDS] == NOT_KNOBS
    assert [f for f in fields if f not in NOT_KNOBS] == IDS  # in field order


def test_policy_yaml_has_a_field_per_knob_with_its_recommended_default() -> None:
    fields = msgspec.structs.fields(PolicyFile)
    assert [f.name for f in fields] == [k.file_name for k in POLICY_KNOBS]
    for field, knob in zip(fields, POLICY_KNOBS, strict=True):
        assert field.default == knob.file_default, knob.file_name
    schema = json_schema(PolicyFile)["$defs"]["PolicyFile"]["properties"]
    assert {name: p["description"] for name, p in schema.items()} == {
        k.file_name: k.doc for k in POLICY_KNOBS
    }


def _other(knob: Knob) -> Any:
    """A value of the knob in policy.yaml's unit that is neither its recommended nor its
    neutral value, exact in the ledger's unit."""
    default = knob.file_default
    if knob.kind is bool:
        return not default
    if knob.choices:
        return next(c for c in knob.choices if c != default)
    step = 1.5 if knob.unit == "ms" else 0.25
    value = (default or 0) + step
    assert knob.to_event(value) != knob.neutral
    return value


@pytest.mark.parametrize("knob", POLICY_KNOBS, ids=IDS)
def test_each_knob_goes_from_policy_yaml_to_the_event(knob: Knob) -> None:
    value = _other(knob)
    text = f"{knob.file_name}: {json.dumps(value)}\n"
    event = policy_event("gpuledger", parse(text, PolicyFile, "policy.yaml"))
    recommended = policy_event("gpuledger")
    for other in POLICY_KNOBS:
        got = getattr(event, other.field)
        if other is knob:
            assert got == knob.to_event(value) != getattr(recommended, knob.field)
            assert knob.to_file(got) == value
        else:
            assert got == other.to_event(other.file_default) == getattr(recommended, other.field)
    assert (event.policy, event.requeue_lost) == ("gpuledger", True)


@pytest.mark.parametrize("knob", [k for k in POLICY_KNOBS if k.null is not None], ids=str)
def test_null_in_policy_yaml_is_the_events_marker(knob: Knob) -> None:
    event = policy_event("gpuledger", parse(f"{knob.file_name}: null\n", PolicyFile))
    assert getattr(event, knob.field) == knob.null
    assert knob.to_file(knob.null) is None


@pytest.mark.parametrize("knob", [k for k in POLICY_KNOBS if k.choices], ids=str)
def test_a_string_knob_takes_only_its_choices(knob: Knob) -> None:
    expected = f"policy: {knob.file_name} must be {' or '.join(knob.choices)}, not 'lifo'"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        policy_event("gpuledger", PolicyFile(**{knob.file_name: "lifo"}))


def test_policy_kai_sets_the_knobs_with_a_kai_value_whatever_the_file_says() -> None:
    kai = {k.field: k.to_event(k.kai) for k in POLICY_KNOBS if k.set_by_kai}
    assert kai == KAI_KNOBS
    assert set(kai) < set(IDS)
    unlike_kai = PolicyFile(**{k.file_name: _other(k) for k in POLICY_KNOBS if k.set_by_kai})
    configured = policy_event("gpuledger", unlike_kai)
    event = policy_event("kai", unlike_kai)
    assert event == msgspec.structs.replace(configured, policy="kai", **kai)
    assert kai_knobs(configured) == event
    # on a live ledger pods cannot be moved: consolidation stays off
    live = live_policy("kai")
    assert live == msgspec.structs.replace(
        live_policy("gpuledger"), policy="kai", **{**kai, "consolidation": False}
    )


def test_errors_name_the_file_and_the_field() -> None:
    with pytest.raises(
        ConfigError, match=r"^p\.yaml: Object contains unknown field `half_life_ms`"
    ):
        parse("half_life_ms: 5\n", PolicyFile, "p.yaml")
    with pytest.raises(
        ConfigError, match=r"^p\.yaml: Expected `bool`, got `str` - at `\$\.backfill`"
    ):
        parse("backfill: sometimes\n", PolicyFile, "p.yaml")
    with pytest.raises(
        ConfigError, match=r"^p\.yaml: Expected `float`, got `str` - at `\$\.reclaim_hysteresis_s`"
    ):
        parse("reclaim_hysteresis_s: 1h\n", PolicyFile, "p.yaml")
    with pytest.raises(ConfigError, match=r"^p\.yaml: \$\.bind_backoff_s: 0\.0001 is not exact"):
        parse("bind_backoff_s: 0.0001\n", PolicyFile, "p.yaml")


# --------------------------------------------------------------------------- the docs


def _yaml_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def test_formats_md_lists_every_knob_with_its_default_and_doc() -> None:
    text = (DOCS / "formats.md").read_text()
    block = text.split("## policy.yaml", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    expected = "".join(
        f"{f'{k.file_name}: {_yaml_value(k.file_default)}':<27} # {k.doc}\n" for k in POLICY_KNOBS
    )
    assert block == expected, f"docs/formats.md's policy.yaml block should read:\n{expected}"


def test_policy_md_names_what_policy_kai_sets() -> None:
    section = (DOCS / "policy.md").read_text().split("## `kai`", 1)[1].split("\n## ", 1)[0]
    intro, table = section.split("### Where gpuledger differs from KAI-Scheduler", 1)
    kai = {k.file_name: k.kai for k in POLICY_KNOBS if k.set_by_kai}
    knobs = {k.file_name for k in POLICY_KNOBS}
    pairs = re.findall(r"`(\w+): ([^`]+)`", intro)
    assert {name: msgspec.yaml.decode(value) for name, value in pairs if name in knobs} == kai
    # the table of differences names each knob with its value under --policy kai
    named = re.findall(r"\| `(\w+)` \(`([^`]+)`", table)
    assert {name for name, _ in named} == set(kai)
    assert all(msgspec.yaml.decode(value) == kai[name] for name, value in named)


# --------------------------------------------------------------------------- declarations


def test_a_knob_its_field_contradicts_fails_at_once() -> None:
    class Seconds(msgspec.Struct):
        grace: Annotated[int, Knob("a duration without _ms", unit="ms")] = 0

    class Choice(msgspec.Struct):
        order: Annotated[str, Knob("a default not among the choices", choices=("a", "b"))] = "c"

    class Kai(msgspec.Struct):
        ratio_milli: Annotated[int, Knob("kai's value of another type", unit="milli", kai="x")] = 0

    with pytest.raises(TypeError, match="grace: unit 'ms' is for an int field named \\*_ms"):
        knob_table(Seconds)
    with pytest.raises(TypeError, match="order: 'c' is not one of"):
        knob_table(Choice)
    with pytest.raises(TypeError, match="ratio_milli: 'x' is not of type int"):
        knob_table(Kai)
