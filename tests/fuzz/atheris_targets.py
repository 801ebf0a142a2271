"""Run one fuzz target under atheris (coverage-guided, libFuzzer).

    python -m tests.fuzz.atheris_targets TARGET [libFuzzer flags] [CORPUS_DIR ...]
    python -m tests.fuzz.atheris_targets --list

Targets are ``codec``, ``segment``, ``config`` and ``jsonl`` (``tests/fuzz/targets.py``).
Flags go to libFuzzer as they are: ``-runs=N``, ``-max_total_time=S``, ``-seed=N``...
Without a corpus directory the corpus is ``out/fuzz/TARGET/corpus`` and crash inputs go to
``out/fuzz/TARGET/`` (``-artifact_prefix=`` overrides). The first corpus directory is
seeded with the target's seeds (golden envelopes, example YAML files, ledger segments)
and receives the inputs that reach new code. A crash input found here belongs in
``tests/data/fuzz-regressions/TARGET/`` once the bug is fixed; ``tests/test_atheris.py``
replays that directory.

Given files instead of directories, it runs just those inputs (a crash to re-check, say).
Exit status: 0 when the run finished without a finding, non-zero otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.fuzz.scratch import SCRATCH_ENV, shm_dir

DEFAULT_MAX_LEN = {"codec": 2048, "segment": 8192, "config": 4096, "jsonl": 8192}


def _seed(corpus: Path, target: str) -> None:
    from tests.fuzz.targets import SEEDS  # after instrumentation

    corpus.mkdir(parents=True, exist_ok=True)
    for name, data in SEEDS[target]():
        digest = hashlib.sha1(data, usedforsecurity=False).hexdigest()[:12]
        path = corpus / f"seed-{name}-{digest}"
        if not path.exists():
            path.write_bytes(data)


def _write_dict(path: Path, target: str) -> None:
    from tests.fuzz.targets import dictionary

    lines = []
    for token in dictionary(target):
        escaped = "".join(
            chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else f"\\x{b:02x}" for b in token
        )
        lines.append(f'"{escaped}"')
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    """Run the fuzzer in a child process with a scratch directory removed afterwards.

    libFuzzer ends the process with exit(), past Python's clean-up, so the directory the
    targets write ledgers and YAML files into is made and removed out here.
    """
    if os.environ.get(SCRATCH_ENV):
        return _fuzz(argv)
    scratch = tempfile.mkdtemp(prefix="gpuledger-fuzz-", dir=shm_dir())
    try:
        env = {**os.environ, SCRATCH_ENV: scratch}
        return subprocess.call(
            [sys.executable, "-m", "tests.fuzz.atheris_targets", *argv[1:]], env=env
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fuzz(argv: list[str]) -> int:
    """Parse the command line, instrument the project, hand over to libFuzzer."""
    import atheris  # the targets themselves do not need it

    if len(argv) < 2 or argv[1] in ("-h", "--help", "--list"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    target = argv[1]
    flags = [a for a in argv[2:] if a.startswith("-")]
    dirs = [a for a in argv[2:] if not a.startswith("-")]
    with atheris.instrument_imports(include=["events", "replay", "scheduler", "tests.fuzz"]):
        from tests.fuzz.targets import TARGETS

    if target not in TARGETS:
        print(f"unknown target {target!r}; targets: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    work = Path("out") / "fuzz" / target
    if not dirs:
        dirs = [str(work / "corpus")]
    corpus = Path(dirs[0])
    if not corpus.is_file():  # files are single inputs to re-run (a crash, say)
        _seed(corpus, target)
    prefix = next((f.split("=", 1)[1] for f in flags if f.startswith("-artifact_prefix=")), None)
    if prefix is None:
        flags.append(f"-artifact_prefix={work}/")
    elif prefix.endswith("/"):
        work = Path(prefix)  # the dictionary goes there too, not into out/
    work.mkdir(parents=True, exist_ok=True)
    if not any(f.startswith("-max_len=") for f in flags):
        flags.append(f"-max_len={DEFAULT_MAX_LEN[target]}")
    if not any(f.startswith("-dict=") for f in flags):
        dict_path = work / f"{target}.dict"
        _write_dict(dict_path, target)
        flags.append(f"-dict={dict_path}")
    if not any(f.startswith("-timeout=") for f in flags):
        flags.append("-timeout=20")
    # Recovery logs every torn tail it cuts; the segment target makes thousands of them.
    logging.getLogger("events.filelog").setLevel(logging.ERROR)
    atheris.Setup([argv[0], *flags, *dirs], TARGETS[target])
    atheris.Fuzz()
    return 0  # pragma: no cover  # Fuzz() exits the process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
