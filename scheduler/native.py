"""The policy core compiled to C by mypyc, used when it was built from exactly these sources.

``scheduler.core`` is plain, strictly typed Python (``make typecheck``). mypyc compiles its
modules (all but the package's ``__init__``) into extension modules that run the very same
code about 1.8 times as fast: every decision is the same, byte for byte
(``tests/test_native.py`` checks the pinned ledgers and the policy's spec tables under
both). ``python scripts/native.py build`` (``make native``, which ``make test`` and
``make bench`` run) compiles them into a cache outside the repository, in a directory named
by a hash of the sources they come from (``key``: the core's and the event model's files
and the interpreter), so a build is never used for sources it was not made from: edit a
core file and the core runs as Python until it is built again.

``import scheduler`` installs the build (``install``), before any module of the core is
imported, as ``GPULEDGER_CORE`` says:

- ``auto`` (the default): the compiled core if it is built for these sources, else Python;
- ``native``: the compiled core, or an ``ImportError`` saying how to build it;
- ``pure``: always Python (the test suite runs so, as it patches functions of the core;
  profilers see only Python frames, so profile with it too).

``GPULEDGER_NATIVE_DIR`` moves the cache (default ``~/.cache/gpuledger/native``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the ``scheduler`` and ``events`` packages."""
CORE = ROOT / "scheduler" / "core"
ENV = "GPULEDGER_CORE"
MODES = ("auto", "native", "pure")
GROUP = "gpuledger_core"
"""mypyc's name for the shared library of the compiled modules (``GROUP__mypyc``)."""
DONE = "complete"
"""The file a finished build holds (a build is moved into place whole, then marked)."""
KEEP = 3
"""Builds kept in the cache: the newest (an older checkout may still use them)."""


def compiled_modules() -> list[str]:
    """The core's modules that mypyc compiles: every one but the package's ``__init__``
    (plain Python, so ``scheduler.core`` is importable before its modules are)."""
    return sorted(p.stem for p in CORE.glob("*.py") if p.name != "__init__.py")


def key(root: Path = ROOT) -> str:
    """The build's name: a hash of what the compiled modules are made from (the core's
    files, the event model's, whose constants mypyc may compile in, in the tree at
    ``root``) and of the interpreter that will load them."""
    digest = hashlib.sha256()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    digest.update(f"{sys.version}\0{sysconfig.get_platform()}\0{suffix}\0".encode())
    core = root / "scheduler" / "core"
    for path in sorted([*core.glob("*.py"), *(root / "events").glob("*.py")]):
        digest.update(f"{path.parent.name}/{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def cache() -> Path:
    """Where builds are kept (``GPULEDGER_NATIVE_DIR``, or ``~/.cache/gpuledger/native``)."""
    return Path(os.environ.get("GPULEDGER_NATIVE_DIR") or Path.home() / ".cache/gpuledger/native")


def built() -> Path | None:
    """The finished build for these sources, if there is one."""
    where = cache() / key()
    return where if (where / DONE).is_file() else None


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules of the core (and their shared library) in one build."""

    def __init__(self, where: Path) -> None:
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        self.files = {
            f"scheduler.core.{name}": where / "scheduler" / "core" / f"{name}{suffix}"
            for name in compiled_modules()
        }
        self.files[f"{GROUP}__mypyc"] = where / f"{GROUP}__mypyc{suffix}"

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,  # noqa: ARG002  # (the finder protocol's)
        target: ModuleType | None = None,  # noqa: ARG002
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None or not file.is_file():
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def install() -> str:
    """Put the compiled core first on the import path, as ``GPULEDGER_CORE`` says; how
    the core will run (``mode``). Called by ``import scheduler``, before any module of the
    core is imported (a process never mixes the two: their classes differ)."""
    wanted = os.environ.get(ENV, "auto") or "auto"
    if wanted not in MODES:
        raise ImportError(f"{ENV}={wanted!r}: expected one of {', '.join(MODES)}")
    if wanted == "pure" or any(name.startswith("scheduler.core") for name in sys.modules):
        return mode()
    where = built()
    if where is None:
        if wanted == "native":
            raise ImportError(
                f"{ENV}=native, but the core is not compiled for these sources (no "
                f"{cache() / key()}): run `make native` (python scripts/native.py build)"
            )
        return mode()
    if mode() == "pure":
        sys.meta_path.insert(0, _Finder(where))
    return mode()


def mode() -> str:
    """How this process runs the policy core: ``native`` (compiled) or ``pure``."""
    return "native" if any(isinstance(f, _Finder) for f in sys.meta_path) else "pure"


def construct(kind: Any, value: Any) -> Any:
    """``value`` (msgpack's builtins) as an instance of ``kind``, what ``msgspec.convert``
    gives for the Python core's classes: msgspec cannot make instances of compiled ones,
    so the dataclasses of the core are built by calling them, field by field (a compiled
    class checks each field's type as it is set); every part of ``kind`` holding no
    dataclass is converted by msgspec in one call. ``TypeError`` or
    ``msgspec.ValidationError`` when it does not fit."""
    return _converter(kind)(value)


Convert = Callable[[Any], Any]
_CONVERTERS: dict[Any, Convert] = {}


def _converter(kind: Any) -> Convert:
    """The function that converts values to ``kind``, made once per type."""
    found = _CONVERTERS.get(kind)
    if found is None:
        found = _CONVERTERS[kind] = _make(kind)
    return found


def _holds_dataclass(kind: Any) -> bool:
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return True
    return any(_holds_dataclass(a) for a in typing.get_args(kind) if a is not Ellipsis)


def _make(kind: Any) -> Convert:
    if kind is Any or kind is object:
        return _same
    if not _holds_dataclass(kind):
        return functools.partial(_by_msgspec, kind)
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin is typing.Union or origin is types.UnionType:
        (other,) = [a for a in args if a is not type(None)]
        inner = _converter(other)
        return lambda value: None if value is None else inner(value)
    if origin is list:
        item = _converter(args[0])
        return lambda value: [item(v) for v in _sequence(value, kind)]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        return lambda value: tuple(item(v) for v in _sequence(value, kind))
    if origin is tuple:
        items = [_converter(a) for a in args]
        return functools.partial(_fixed_tuple, kind, items)
    if origin is dict:
        keys, values = _converter(args[0]), _converter(args[1])
        return lambda value: {keys(k): values(v) for k, v in _mapping(value, kind).items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        fields = [(f.name, _converter(hints[f.name])) for f in dataclasses.fields(kind)]
        return functools.partial(_dataclass, kind, fields)
    raise TypeError(f"cannot restore values of type {kind}")


def _same(value: Any) -> Any:
    return value


def _by_msgspec(kind: Any, value: Any) -> Any:
    return value if type(value) is kind else msgspec.convert(value, kind)


def _fixed_tuple(kind: Any, items: list[Convert], value: Any) -> tuple[Any, ...]:
    got = _sequence(value, kind)
    if len(got) != len(items):
        raise TypeError(f"expected {len(items)} items for {kind}, got {len(got)}")
    return tuple(convert(v) for convert, v in zip(items, got, strict=True))


def _dataclass(kind: type, fields: list[tuple[str, Convert]], value: Any) -> Any:
    given = _mapping(value, kind)
    return kind(**{name: convert(given[name]) for name, convert in fields if name in given})


def _mapping(value: Any, kind: Any) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object for {kind}, got {type(value).__name__}")
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(kind: type) -> dict[str, Any]:
    """``typing.get_type_hints`` of a class of the core. A compiled class keeps only erased
    annotations (``int | None`` becomes ``type``): it is given back those of its source
    first (as strings, as ``from __future__ import annotations`` leaves them)."""
    found = _HINTS.get(kind)
    if found is None:
        module = sys.modules[kind.__module__]
        source = CORE / f"{kind.__module__.rpartition('.')[2]}.py"
        if not str(getattr(module, "__file__", "")).endswith(".py") and source.is_file():
            for node in ast.parse(source.read_text(), filename=str(source)).body:
                if isinstance(node, ast.ClassDef) and node.name == kind.__name__:
                    kind.__annotations__ = {
                        item.target.id: ast.unparse(item.annotation)
                        for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                    }
        found = _HINTS[kind] = typing.get_type_hints(kind)
    return found


def _sequence(value: Any, kind: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected an array for {kind}, got {type(value).__name__}")
    return value


def build(*, force: bool = False) -> Path:
    """Compile the core for these sources into the cache (unless built already); the
    build's directory. Needs mypy (a development dependency) and a C compiler."""
    where = cache() / key()
    if (where / DONE).is_file() and not force:
        return where
    cache().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{where.name}-", dir=cache()))
    try:
        paths = [str(CORE / f"{name}.py") for name in compiled_modules()]
        (work / "setup.py").write_text(
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='gpuledger-core', ext_modules=mypycify({paths!r} + "
            f"['--cache-dir', {str(work / 'mypy')!r}], opt_level='3', "
            f"target_dir={str(work / 'c')!r}, group_name={GROUP!r}))\n"
        )
        command = [sys.executable, "setup.py", "-q", "build_ext"]
        command += ["--build-lib", str(work / "out"), "--build-temp", str(work / "obj")]
        # Run from the scratch directory: mypy and setuptools read no configuration of ours.
        done = subprocess.run(  # noqa: S603  # this interpreter, our own setup script
            command, cwd=work, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"compiling the core failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
            )
        (work / "out" / DONE).write_text(f"{', '.join(compiled_modules())}\n")
        if (where / DONE).is_file() and not force:
            return where  # another build of the same sources finished first: keep it
        if where.exists():
            # (unfinished, or --force: a process may be loading it, so it is moved aside
            # whole and removed after, never emptied in place)
            where.rename(work / "old")
        try:
            (work / "out").rename(where)
        except OSError:
            if not (where / DONE).is_file():
                raise
            # another build of the same sources moved in just before: keep that one
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(where)
    return where


def _prune(keep: Path) -> None:
    """Drop all but the ``KEEP`` newest finished builds (always keeping ``keep``), and the
    scratch directories of builds that were killed more than a day ago."""
    for scratch in cache().glob(".*"):
        if scratch.is_dir() and time.time() - scratch.stat().st_mtime > 86_400:
            shutil.rmtree(scratch, ignore_errors=True)
    builds = sorted(
        (p for p in cache().iterdir() if (p / DONE).is_file() and p != keep),
        key=lambda p: (p / DONE).stat().st_mtime,
        reverse=True,
    )
    for old in builds[KEEP - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
