"""GPU utilisation samples from monitoring data, as ``gpu_utilization_sampled`` events.

Two inputs:

* a Prometheus text-format dump of the NVIDIA DCGM exporter (what ``curl :9400/metrics``
  prints, or several such scrapes concatenated, or a Prometheus federation dump): the
  ``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_DEV_FB_USED`` (MiB) series, with the
  device in the ``gpu`` label and the node in ``Hostname`` (or ``hostname``, ``host``,
  ``node``, ``kubernetes_node``), and a millisecond timestamp after the value;
* a CSV file with the header ``timestamp_ms,node,gpu,utilization_pct[,memory_used_mib]``.

The dump is read with prometheus_client's text-format parser, a line at a time; every other
metric of the dump is skipped once its line has parsed. A malformed line is a
``MetricsError`` naming ``file:line`` and what is wrong (the parser's reason, or which
label or value does not fit), so a 50 MB dump with one bad line is fixable.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as PromSample

from events.codec import Envelope, wrap
from events.model import GpuUtilizationSampled

__all__ = [
    "FB_USED",
    "GPU_UTIL",
    "HOST_LABELS",
    "MetricsError",
    "Sample",
    "envelopes",
    "parse_csv",
    "parse_dcgm",
    "read_samples",
]

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
HOST_LABELS = ("Hostname", "hostname", "host", "node", "kubernetes_node")
"""Labels naming the node, in order of preference (the exporter sets ``Hostname``)."""


class MetricsError(ValueError):
    """A monitoring file could not be read; the message starts with ``file:line:``."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One device's utilisation at one time (ms), before it becomes an event."""

    at: int
    node: str
    device: int
    utilization_pct: int
    memory_used_mib: int = 0

    def event(self) -> GpuUtilizationSampled:
        """The ledger event of this sample."""
        return GpuUtilizationSampled(
            node=self.node,
            device=self.device,
            utilization_pct=self.utilization_pct,
            memory_used_mib=self.memory_used_mib,
        )


def _sample(line: str, where: str) -> PromSample:
    """The one sample of a sample line, as prometheus_client's text-format parser reads it."""
    try:
        # A sample line on its own is one untyped family of one sample; parsed a line at a
        # time so that an error names its line (the parser's errors name none).
        (family,) = text_string_to_metric_families(line)
        (sample,) = family.samples
    except ValueError as exc:
        raise MetricsError(
            f"{where}: not a Prometheus sample line ({exc or 'malformed'}): {line[:60]!r}"
        ) from None
    return sample


def _stamp_ms(sample: PromSample, where: str) -> int | None:
    """The sample's timestamp in ms, as written; ``None`` if it has none."""
    if sample.timestamp is None:
        return None
    # prometheus_client divides the exposition's millisecond timestamp by 1000.
    ms = float(sample.timestamp) * 1000
    if not math.isfinite(ms) or abs(ms - round(ms)) > 1e-3:
        raise MetricsError(f"{where}: timestamp {ms:g} is not a whole number of milliseconds")
    return round(ms)


def _percent(value: float, where: str) -> int:
    if math.isnan(value) or not 0 <= value <= 100:
        raise MetricsError(f"{where}: utilisation {value:g} is not a percentage in 0..100")
    return round(value)


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise MetricsError(f"{where}: value {text!r} is not a number") from None


def parse_dcgm(
    lines: Iterable[str], name: str = "<dcgm>", *, default_at: int | None = None
) -> list[Sample]:
    """Samples of a DCGM exporter dump; ``default_at`` stamps lines without a timestamp.

    Memory (``DCGM_FI_DEV_FB_USED``) joins the utilisation sample of the same node, device
    and time; memory without a utilisation sample is dropped (the event needs both).
    """
    util: dict[tuple[int, str, int], int] = {}
    memory: dict[tuple[int, str, int], int] = {}
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{name}:{lineno}"
        sample = _sample(line, where)
        metric = sample.name
        if metric not in (GPU_UTIL, FB_USED):
            continue
        labels = sample.labels
        gpu = labels.get("gpu")
        if gpu is None or not gpu.isdigit():
            raise MetricsError(f"{where}: {metric} needs a numeric 'gpu' label, got {gpu!r}")
        node = next((labels[k] for k in HOST_LABELS if labels.get(k)), None)
        if node is None:
            raise MetricsError(
                f"{where}: {metric} has no node label (one of {', '.join(HOST_LABELS)})"
            )
        at = _stamp_ms(sample, where)
        if at is None:
            if default_at is None:
                raise MetricsError(f"{where}: sample has no timestamp; pass a default time (--at)")
            at = default_at
        value = float(sample.value)
        key = (at, node, int(gpu))
        if metric == GPU_UTIL:
            util[key] = _percent(value, where)
        else:
            if not math.isfinite(value) or value < 0:
                raise MetricsError(f"{where}: memory used {value:g} MiB is not valid")
            memory[key] = round(value)
    return [
        Sample(
            at=at,
            node=node,
            device=dev,
            utilization_pct=pct,
            memory_used_mib=memory.get((at, node, dev), 0),
        )
        for (at, node, dev), pct in sorted(util.items())
    ]


_CSV_REQUIRED = ("timestamp_ms", "node", "gpu", "utilization_pct")


def parse_csv(lines: Iterable[str], name: str = "<csv>") -> list[Sample]:
    """Samples of a CSV file: ``timestamp_ms,node,gpu,utilization_pct[,memory_used_mib]``."""
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise MetricsError(f"{name}:1: empty file; expected a header row")
    columns = [h.strip() for h in header]
    missing = [c for c in _CSV_REQUIRED if c not in columns]
    if missing:
        raise MetricsError(f"{name}:1: header lacks {', '.join(missing)}")
    index = {c: columns.index(c) for c in (*_CSV_REQUIRED, "memory_used_mib") if c in columns}
    samples: list[Sample] = []
    for row in reader:
        where = f"{name}:{reader.line_num}"
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < len(columns):
            raise MetricsError(f"{where}: {len(row)} fields, expected {len(columns)}")

        def cell(column: str, row: list[str] = row) -> str:
            return row[index[column]].strip()

        try:
            at = int(cell("timestamp_ms"))
            device = int(cell("gpu"))
        except ValueError:
            raise MetricsError(f"{where}: timestamp_ms and gpu must be integers") from None
        node = cell("node")
        if not node:
            raise MetricsError(f"{where}: empty node")
        pct = _percent(_number(cell("utilization_pct"), where), where)
        mem = 0
        if "memory_used_mib" in index and cell("memory_used_mib"):
            mem = round(_number(cell("memory_used_mib"), where))
        samples.append(Sample(at, node, device, pct, mem))
    samples.sort(key=lambda s: (s.at, s.node, s.device))
    return samples


def read_samples(
    path: str | Path, fmt: str, *, default_at: int | None = None, shift_ms: int = 0
) -> list[Sample]:
    """Samples of a ``dcgm`` or ``csv`` file, in time order, shifted by ``shift_ms``."""
    p = Path(path)
    try:
        with p.open(encoding="utf-8", newline="") as f:
            if fmt == "dcgm":
                samples = parse_dcgm(f, str(p), default_at=default_at)
            elif fmt == "csv":
                samples = parse_csv(f, str(p))
            else:
                raise MetricsError(f"unknown metrics format {fmt!r} (dcgm or csv)")
    except FileNotFoundError:
        raise MetricsError(f"{p}: no such file") from None
    except UnicodeDecodeError as exc:
        raise MetricsError(f"{p}: not UTF-8 text ({exc.reason})") from None
    if shift_ms:
        samples = [
            Sample(s.at + shift_ms, s.node, s.device, s.utilization_pct, s.memory_used_mib)
            for s in samples
        ]
    return samples


def envelopes(samples: Iterable[Sample]) -> Iterator[Envelope]:
    """The samples as ledger envelopes, ready to append."""
    for s in samples:
        yield wrap(s.event(), s.at)
