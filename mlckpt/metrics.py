"""Metrics from raw per-rank records (SPEC §5).  Pure: the runner and the checker both call
``summarize`` on the same records, so every reported number is recomputable.

Record format history (one JSON object per line of ``records.jsonl``):
  1: first version: ``op`` (write|read), ``index`` (1-based op number), ``checkpoint``
     (checkpoint number the op wrote or restored), ``rank``, ``host``, ``t0_ns``/``t1_ns``
     (monotonic clock of that rank's host: leaving the barrier / last byte durable or read),
     ``bytes``, ``files``, ``fsync`` (every file and its directory fsynced inside [t0, t1]),
     ``resident_bytes``/``cached_check_bytes`` (reads: page-cache residency of the files just
     before the op), ``verified_bytes``/``mismatches`` (reads: verification after the op).

Per op k: ``duration = max_r(t1 - t0)``, ``bandwidth = Σ_r bytes / duration``, and the slowest
rank's own bandwidth ``min_r(bytes_r / (t1_r - t0_r))``.  Headline = mean over ops (MLPerf
convention), with median, stdev (population, as numpy's default), min and max alongside.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RECORDS_FORMAT = 1
SUMMARY_FORMAT = 1
GIB = float(1 << 30)
GB = 1e9


@dataclass(frozen=True)
class OpStats:
    op: str
    index: int
    checkpoint: int
    ranks: int
    bytes: int
    duration_s: float
    bandwidth_gib_s: float
    slowest_rank: int
    slowest_rank_bandwidth_gib_s: float
    straggler_ratio: float  # max rank duration / median rank duration
    resident_fraction: float | None
    mismatches: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def op_stats(records: list[Mapping[str, Any]]) -> OpStats:
    first = records[0]
    durs = [(r["t1_ns"] - r["t0_ns"]) / 1e9 for r in records]
    duration = max(durs)
    total = sum(int(r["bytes"]) for r in records)
    per_rank = [(int(r["bytes"]) / d if d > 0 else math.inf, int(r["rank"]))
                for r, d in zip(records, durs, strict=True) if int(r["bytes"]) > 0]
    slow_bw, slow_rank = min(per_rank) if per_rank else (0.0, -1)
    med = statistics.median(durs)
    resident = None
    if first["op"] == "read":
        checked = sum(int(r.get("cached_check_bytes", 0)) for r in records)
        resident = (sum(int(r.get("resident_bytes", 0)) for r in records) / checked) if checked else 0.0
    mism = sum(int(r.get("mismatches", 0)) for r in records) if first["op"] == "read" else None
    return OpStats(
        op=first["op"], index=int(first["index"]), checkpoint=int(first["checkpoint"]),
        ranks=len(records), bytes=total, duration_s=duration,
        bandwidth_gib_s=total / duration / GIB if duration > 0 else math.inf,
        slowest_rank=slow_rank, slowest_rank_bandwidth_gib_s=slow_bw / GIB,
        straggler_ratio=duration / med if med > 0 else math.inf,
        resident_fraction=resident, mismatches=mism,
    )


def _dist(values: list[float], unit: str, name: str) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{name}_mean_{unit}": statistics.fmean(values),
        f"{name}_median_{unit}": statistics.median(values),
        f"{name}_stdev_{unit}": statistics.pstdev(values),
        f"{name}_min_{unit}": min(values),
        f"{name}_max_{unit}": max(values),
    }


def group_ops(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    ops: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        ops[(str(r["op"]), int(r["index"]))].append(r)
    for recs in ops.values():
        recs.sort(key=lambda r: int(r["rank"]))
    return dict(sorted(ops.items(), key=lambda kv: (kv[0][0] != "write", kv[0][1])))


def summarize(records: Iterable[Mapping[str, Any]], *, max_resident_fraction: float) -> dict[str, Any]:
    """The summary block of ``summary.json`` (everything but run identity), from raw records."""
    ops = [op_stats(recs) for recs in group_ops(records).values()]
    writes = [o for o in ops if o.op == "write"]
    reads = [o for o in ops if o.op == "read"]
    out: dict[str, Any] = {"summary_format": SUMMARY_FORMAT, "records_format": RECORDS_FORMAT,
                           "num_writes": len(writes), "num_reads": len(reads)}
    for name, group in (("write", writes), ("read", reads)):
        if not group:
            continue
        out.update(_dist([o.bandwidth_gib_s for o in group], "gib_s", f"{name}_bandwidth"))
        out.update(_dist([o.duration_s for o in group], "s", f"{name}_duration"))
        out.update(_dist([o.slowest_rank_bandwidth_gib_s for o in group], "gib_s",
                         f"{name}_slowest_rank_bandwidth"))
        out[f"{name}_straggler_ratio_max"] = max(o.straggler_ratio for o in group)
        out[f"{name}_bytes_per_op"] = group[0].bytes
    if reads:
        worst = max(o.resident_fraction or 0.0 for o in reads)
        out["read_resident_fraction_max"] = worst
        out["read_cold"] = worst <= max_resident_fraction
        out["read_mismatches"] = sum(o.mismatches or 0 for o in reads)
        out["read_verified"] = out["read_mismatches"] == 0
    out["ops"] = [o.to_dict() for o in ops]
    return out


def dlio_compat(summary: Mapping[str, Any], checkpoint_bytes: int) -> dict[str, Any]:
    """DLIO/MLPerf summary.json metric names, for tools that read them.  DLIO labels these 'GB'
    but computes GiB (2**30); the values here are GiB/s likewise, so they compare like for like."""
    out: dict[str, Any] = {"checkpoint_size_GB": checkpoint_bytes / GIB}
    for ours, theirs in (("write", "save"), ("read", "load")):
        if f"{ours}_bandwidth_mean_gib_s" in summary:
            out[f"{theirs}_checkpoint_io_mean_GB_per_second"] = summary[f"{ours}_bandwidth_mean_gib_s"]
            out[f"{theirs}_checkpoint_io_stdev_GB_per_second"] = summary[f"{ours}_bandwidth_stdev_gib_s"]
            out[f"{theirs}_checkpoint_duration_mean_seconds"] = summary[f"{ours}_duration_mean_s"]
            out[f"{theirs}_checkpoint_duration_stdev_seconds"] = summary[f"{ours}_duration_stdev_s"]
    return out
