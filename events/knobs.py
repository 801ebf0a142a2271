"""The policy knobs' one declaration: a ``Knob`` on each knob field of ``policy_configured``.

A knob is a field of ``PolicyConfigured`` annotated ``Annotated[type, Knob(...)]``: the
field gives its name, type and the ledger's neutral default (what an older ledger without
the field decides with); the ``Knob`` gives what the rest of gpuledger derives from it:

- ``policy.yaml`` (``replay.config.PolicyFile``): the knob's name and unit there (a ``_ms``
  field is written in seconds as ``_s``, a ``_milli`` one as a plain ratio without the
  suffix), its recommended value (by default the neutral one) and its line of doc;
- the conversion of a ``policy.yaml`` to the event (``replay.config.policy_event``);
- ``--policy kai`` (``scheduler.core.policy.KAI_KNOBS``): KAI-Scheduler's value, for the
  knobs where gpuledger deliberately differs.

``knob_table`` reads the knobs of a Struct in field order; ``events.model.POLICY_KNOBS`` is
that table for ``PolicyConfigured``. Adding a knob is adding one annotated field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec

Value = bool | int | float | str | None
"""A knob's value: in the ledger's unit in the event, in ``policy.yaml``'s unit in the file."""

Unit = Literal["", "ms", "milli"]
"""How a knob is written in ``policy.yaml``: ``ms``, an integer of milliseconds in the
ledger, is seconds in the file; ``milli``, a ratio x1000 in the ledger, is the ratio in
the file; ``""``, the value as it is."""

_SUFFIX: dict[str, tuple[str, str]] = {"ms": ("_ms", "_s"), "milli": ("_milli", ""), "": ("", "")}
"""Per unit, the field's suffix in the event and the one that replaces it in the file."""


class Unset(enum.Enum):
    """The marker of a ``Knob`` value not given."""

    UNSET = enum.auto()


UNSET = Unset.UNSET


@dataclass(frozen=True, slots=True)
class Knob:
    """One policy knob's metadata, on its ``PolicyConfigured`` field (see the module doc).

    ``recommended`` and ``kai`` are in ``policy.yaml``'s unit (seconds, ratios): the value
    a ``policy.yaml`` that leaves the knob out gets (unset: the neutral default) and the
    one ``--policy kai`` sets (unset: kai leaves the knob as configured). ``choices`` are
    the accepted values of a string knob; ``null`` is the event's value that
    ``policy.yaml`` writes as ``null`` (e.g. -1 for "no bound").

    ``field``, ``kind`` and ``neutral`` are filled in from the field by ``knob_table``, as
    ``recommended`` is when unset.
    """

    doc: str
    """One line: the comment beside the knob in docs/formats.md and its schema description."""
    unit: Unit = ""
    recommended: Value | Unset = UNSET
    kai: Value | Unset = UNSET
    choices: tuple[str, ...] = ()
    null: int | None = None
    field: str = ""
    """The event's field name."""
    kind: type = object
    """The event field's type (``bool``, ``int`` or ``str``)."""
    neutral: Value = None
    """The event field's default, in the ledger's unit."""

    @property
    def file_name(self) -> str:
        """The knob's name in ``policy.yaml``."""
        event_suffix, file_suffix = _SUFFIX[self.unit]
        return self.field.removesuffix(event_suffix) + file_suffix

    @property
    def file_default(self) -> Value:
        """The value a ``policy.yaml`` without this knob gets, in the file's unit."""
        assert not isinstance(self.recommended, Unset), "knob_table fills it in"
        return self.recommended

    @property
    def set_by_kai(self) -> bool:
        """Whether ``--policy kai`` sets this knob (to ``kai``)."""
        return not isinstance(self.kai, Unset)

    @property
    def kai_event(self) -> Value:
        """KAI-Scheduler's value in the ledger's unit (only when ``set_by_kai``)."""
        assert not isinstance(self.kai, Unset), f"--policy kai leaves {self.field}"
        return self.to_event(self.kai)

    def to_event(self, value: Value) -> Value:
        """A value in ``policy.yaml``'s unit as the event records it."""
        if value is None and self.null is not None:
            return self.null
        if self.unit and isinstance(value, int | float):
            return round(value * 1000)
        return value

    def to_file(self, value: Value) -> Value:
        """An event's value as ``policy.yaml`` writes it (the inverse of ``to_event``)."""
        if self.null is not None and value == self.null:
            return None
        if self.unit == "ms" and isinstance(value, int):
            return value // 1000 if value % 1000 == 0 else value / 1000
        if self.unit == "milli" and isinstance(value, int):
            return value / 1000
        return value


def knob_table(cls: type[msgspec.Struct]) -> tuple[Knob, ...]:
    """The knobs of ``cls``'s fields, in field order, each completed from its field.

    Raises ``TypeError`` for a knob its field contradicts (a unit without its suffix or on
    a field that is not an integer, a choice or value of the wrong kind), so a mistyped
    declaration fails when the module is imported.
    """
    table: list[Knob] = []
    for info in msgspec.structs.fields(cls):
        if get_origin(info.type) is not Annotated:
            continue
        kind, *extras = get_args(info.type)
        knobs = [extra for extra in extras if isinstance(extra, Knob)]
        if not knobs:
            continue
        knob = replace(knobs[0], field=info.name, kind=kind, neutral=info.default)
        if isinstance(knob.recommended, Unset):
            knob = replace(knob, recommended=knob.to_file(knob.neutral))
        _check(knob)
        table.append(knob)
    return tuple(table)


def _check(knob: Knob) -> None:
    where = f"{knob.field}: "
    event_suffix, _ = _SUFFIX[knob.unit]
    if knob.unit and (knob.kind is not int or not knob.field.endswith(event_suffix)):
        raise TypeError(f"{where}unit {knob.unit!r} is for an int field named *{event_suffix}")
    if knob.choices and knob.kind is not str:
        raise TypeError(f"{where}choices are for a str field")
    if knob.null is not None and knob.kind is not int:
        raise TypeError(f"{where}null stands for an int")
    values: list[Any] = [knob.neutral, knob.to_event(knob.file_default)]
    if knob.set_by_kai:
        values.append(knob.kai_event)
    for value in values:
        if type(value) is not knob.kind:
            raise TypeError(f"{where}{value!r} is not of type {knob.kind.__name__}")
        if knob.choices and value not in knob.choices:
            raise TypeError(f"{where}{value!r} is not one of {knob.choices}")


__all__ = ["UNSET", "Knob", "Unit", "Unset", "Value", "knob_table"]
