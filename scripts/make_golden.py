"""Write golden wire samples for event types that have none at the current version.

Existing files are never overwritten: a golden sample is a promise that this version's
readers decode what older writers wrote. Run: .venv/bin/python scripts/make_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from events.codec import SCHEMA_VERSION, encode, event_json  # noqa: E402
from events.model import tag_of  # noqa: E402
from tests.golden_samples import AT, SAMPLES  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"


def main() -> int:
    GOLDEN.mkdir(exist_ok=True)
    written = 0
    for event in SAMPLES:
        stem = f"{tag_of(type(event))}.v{SCHEMA_VERSION}"
        wire = GOLDEN / f"{stem}.msgpack"
        if wire.exists():
            continue
        wire.write_bytes(encode(event, AT))
        (GOLDEN / f"{stem}.json").write_bytes(event_json(event) + b"\n")
        written += 1
    print(f"wrote {written} golden samples to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
