"""Compile the policy core with mypyc (``make native``), or say where its build is.

    python scripts/native.py build [--force]   # a no-op when built for these sources
    python scripts/native.py where             # exit 1 when not built

See ``scheduler/native.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler import native  # after the repository is on the path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/native.py", description=__doc__)
    parser.add_argument("command", choices=("build", "where"))
    parser.add_argument("--force", action="store_true", help="build even if built already")
    args = parser.parse_args(argv)
    found = native.built()
    if args.command == "where":
        print(found if found is not None else f"not built: {native.cache() / native.key()}")
        return 0 if found is not None else 1
    if found is not None and not args.force:
        print(f"compiled core up to date: {found}")
        return 0
    print(f"compiling the policy core with mypyc into {native.cache() / native.key()} ...")
    sys.stdout.flush()
    try:
        where = native.build(force=args.force)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"compiled core built: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
