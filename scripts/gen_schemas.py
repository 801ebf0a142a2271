"""Write docs/schemas/*.schema.json from the msgspec types (tests check they are current)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replay.config import json_schema, kinds  # noqa: E402

OUT = ROOT / "docs" / "schemas"


def render(kind: str) -> str:
    """The schema file's text for one format."""
    return json.dumps(json_schema(kinds()[kind]), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for kind in sorted(kinds()):
        (OUT / f"{kind}.schema.json").write_text(render(kind))
    print(f"wrote {len(kinds())} schemas to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
