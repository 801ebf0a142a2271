"""``gpuledger schema``: the JSON Schema of a YAML input format (``replay.config``)."""

from __future__ import annotations

import argparse
import json

from replay.config import json_schema, kinds

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger schema`` to the ``gpuledger`` parser."""
    p = sub.add_parser("schema", help="print the JSON Schema of a YAML input format")
    p.add_argument("kind", choices=sorted(kinds()), help="which file format")
    p.set_defaults(func=_schema)


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(kinds()[args.kind]), indent=2))
    return 0
