"""Metrics from raw per-rank records.  Pure: the runner and the checker both call
``summarize`` on the same records, so every reported number is recomputable.

The records these formulas read, and their fields by format version, are described in
:mod:`mlckpt.records`.

Per op k: ``duration = max_r(t1 - t0)``, ``bandwidth = Σ_r bytes / duration``, and the slowest
rank's own bandwidth ``min_r(bytes_r / (t1_r - t0_r))``.  From summary format 10 (rules 1.20) each
rank's t0 is its host's first rank's for the op (:func:`from_barrier`): the op begins when its
barrier lets the host's ranks go, as IOR times from the barrier, so a rank that left it late
(descheduled, or claiming so to shorten its own time) is timed from there.  For writes, t0/t1 are those of the
durable stage (the storage's own time; for sync one-tier runs exactly the record's t0/t1), and
the other stages are measured the same way.  Training's view: ``stall = max_r(staged - t0)``,
``time_to_durable = max_r(t1 - t0)``, and overlap efficiency ``Σ_r (background_r - exposed_r) /
Σ_r background_r`` with ``background = t1 - staged``: the share of the background work hidden
behind training.  Headline = mean over ops (MLPerf convention), with median, stdev (population,
as numpy's default), min and max alongside.  Read headlines cover durable-tier restores; restores
served by the fast tier are summarised under ``read_fast_*``.

Records format 7 (rules 1.10) adds ``requests`` and ``phases_ns`` to the records of ops whose
requests go through the engine's timed file paths, and summary format 6 the latency percentiles,
IOPS and phase times made from them: both are described in mlckpt/latency.py, with the formulas.

Summary format 4 (records format 4) adds: the first write apart, ``write_first_duration_s`` and
``write_first_bandwidth_gib_s`` (write 1, durable stage), and ``write_steady_bandwidth_mean_gib_s``
(mean over writes 2..n; absent with one write): a first write slower than the rest (file creation,
allocation, a cold array cache) is visible instead of diluted; CPU per GiB moved,
``{write|read}_cpu_s_per_gib = Σ_r,k cpu_ns / 1e9 ÷ (Σ_r,k bytes / GiB)`` over the op's records;
and ``state_hugepage_fraction_min = min_r,k state_huge_bytes / state_bytes``.  A figure the records
cannot give (a record without ``cpu_ns``, no ``state_bytes`` anywhere) is absent.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from mlckpt import formats, latency
from mlckpt.units import GiB

RECORDS_FORMAT = formats.RECORDS.version
SUMMARY_FORMAT = formats.SUMMARY.version
GB = 1e9


class SummaryHead(TypedDict, total=False):
    """summary.json's fixed keys; the statistics beside them are named by pattern:
    ``{write|read|read_fast|...}_{bandwidth|duration|...}_{mean|median|stdev|min|max}_{unit}``."""

    summary_format: int
    records_format: int
    num_writes: int
    num_reads: int
    ops: list[dict[str, object]]
    mode: str
    tiers: list[str]
    checkpoint_bytes: int
    restore_bytes: int
    read_valid: bool
    read_cold: bool
    read_verified: bool
    dlio_compat: dict[str, object]  # summary format 2; format 3: metric and DLIO's top-level keys
    metric: dict[str, object]


@dataclass(frozen=True)
class StageStats:
    duration_s: float
    bandwidth_gib_s: float


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
    tier: str | None = None  # reads: fast | durable | mixed
    stall_s: float | None = None  # writes: what training waited
    time_to_durable_s: float | None = None
    backpressure_s: float | None = None
    overlap_efficiency: float | None = None  # None without background work
    compute_s: float | None = None
    stages: dict[str, StageStats] | None = None  # writes: per stage (memory, fast, durable)

    def to_dict(self) -> dict[str, object]:
        out = dict(self.__dict__)
        if self.stages is not None:
            out["stages"] = {k: dict(v.__dict__) for k, v in self.stages.items()}
        return out


def _span(r: Mapping[str, Any], tier: str | None = None) -> tuple[int, int]:
    """(t0, t1) of a record, or of one of its write stages."""
    if tier is None:
        return int(r["t0_ns"]), int(r["t1_ns"])
    for st in r["stages"]:
        if st["tier"] == tier:
            return int(st["t0_ns"]), int(st["t1_ns"])
    raise KeyError(tier)


def _timing(records: list[Mapping[str, Any]], tier: str | None) -> tuple[float, float, float, int, float]:
    """duration, bandwidth (B/s), slowest rank bandwidth (B/s), slowest rank, straggler ratio."""
    spans = [_span(r, tier) for r in records]
    durs = [(t1 - t0) / 1e9 for t0, t1 in spans]
    duration = max(durs)
    total = sum(int(r["bytes"]) for r in records)
    per_rank = [(int(r["bytes"]) / d if d > 0 else math.inf, int(r["rank"]))
                for r, d in zip(records, durs, strict=True) if int(r["bytes"]) > 0]
    slow_bw, slow_rank = min(per_rank) if per_rank else (0.0, -1)
    med = statistics.median(durs)
    return (duration, total / duration if duration > 0 else math.inf, slow_bw, slow_rank,
            duration / med if med > 0 else math.inf)


def op_stats(records: list[Mapping[str, Any]]) -> OpStats:
    first = records[0]
    op = str(first["op"])
    total = sum(int(r["bytes"]) for r in records)
    extra: dict[str, Any] = {}
    main_tier: str | None = None
    if op == "write":
        main_tier = "durable"
        tiers = [str(st["tier"]) for st in first["stages"]]
        stages = {}
        for t in tiers:
            d, bw, *_ = _timing(records, t)
            stages[t] = StageStats(d, bw / GiB)
        stall = max(int(r["staged_ns"]) - int(r["t0_ns"]) for r in records) / 1e9
        background = sum(int(r["t1_ns"]) - int(r["staged_ns"]) for r in records)
        exposed = sum(int(r["exposed_ns"]) for r in records)
        extra = dict(
            stall_s=stall,
            time_to_durable_s=max(int(r["t1_ns"]) - int(r["t0_ns"]) for r in records) / 1e9,
            backpressure_s=max(int(r["backpressure_ns"]) for r in records) / 1e9,
            overlap_efficiency=(background - exposed) / background if background > 0 else None,
            # the slowest rank trained least: its interval is the one every rank got
            compute_s=min(int(r["compute_ns"]) for r in records) / 1e9,
            stages=stages)
    else:
        found = {str(r["tier"]) for r in records}
        extra["tier"] = found.pop() if len(found) == 1 else "mixed"
    duration, bw, slow_bw, slow_rank, straggler = _timing(records, main_tier)
    resident = None
    if op == "read":
        checked = sum(int(r.get("cached_check_bytes", 0)) for r in records)
        resident = (sum(int(r.get("resident_bytes", 0)) for r in records) / checked) if checked else 0.0
    mism = sum(int(r.get("mismatches", 0)) for r in records) if op == "read" else None
    return OpStats(
        op=op, index=int(first["index"]), checkpoint=int(first["checkpoint"]),
        ranks=len(records), bytes=total, duration_s=duration,
        bandwidth_gib_s=bw / GiB, slowest_rank=slow_rank, slowest_rank_bandwidth_gib_s=slow_bw / GiB,
        straggler_ratio=straggler, resident_fraction=resident, mismatches=mism, **extra,
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


def group_ops(records: Iterable[Mapping[str, Any]], *, barrier: bool = False
              ) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    """The records by op, write ops first, each op's in rank order; ``barrier``: each op's records
    :func:`from_barrier` (summary format 10)."""
    ops: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        ops[(str(r["op"]), int(r["index"]))].append(r)
    for key, recs in ops.items():
        recs.sort(key=lambda r: int(r["rank"]))
        if barrier:
            ops[key] = from_barrier(recs)
    return dict(sorted(ops.items(), key=lambda kv: (kv[0][0] != "write", kv[0][1])))


def from_barrier(recs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One op's records, each rank's start (and that of the stage it began with) moved to the
    start of its host's first rank to leave the op's barrier (one clock per host): what the op
    took is from the barrier to each rank's end, whenever a rank says it began."""
    recs = list(recs)
    first: dict[str, int] = {}
    for r in recs:
        host, t0 = str(r.get("host")), int(r["t0_ns"])
        first[host] = min(first.get(host, t0), t0)
    out: list[Mapping[str, Any]] = []
    for r in recs:
        t0, start = int(r["t0_ns"]), first[str(r.get("host"))]
        if t0 == start:
            out.append(r)
            continue
        moved = {**r, "t0_ns": start}
        if "stages" in r:
            moved["stages"] = [{**st, "t0_ns": start} if int(st["t0_ns"]) == t0 else st for st in r["stages"]]
        out.append(moved)
    return out


def _io_block(out: dict[str, Any], name: str, group: list[OpStats]) -> None:
    out.update(_dist([o.bandwidth_gib_s for o in group], "gib_s", f"{name}_bandwidth"))
    out.update(_dist([o.duration_s for o in group], "s", f"{name}_duration"))
    out.update(_dist([o.slowest_rank_bandwidth_gib_s for o in group], "gib_s",
                     f"{name}_slowest_rank_bandwidth"))
    out[f"{name}_straggler_ratio_max"] = max(o.straggler_ratio for o in group)
    out[f"{name}_bytes_per_op"] = group[0].bytes


def summarize(records: Iterable[Mapping[str, object]], *, max_resident_fraction: float,
              records_format: int = RECORDS_FORMAT, summary_format: int = SUMMARY_FORMAT,
              seen: latency.Seen | None = None,
              grouped: Mapping[tuple[str, int], list[Mapping[str, object]]] | None = None,
              ) -> dict[str, object]:
    """The summary block of ``summary.json`` (all but run identity) from raw records of ``records_format``
    (a checker recomputing an older bundle passes its own, and the summary format its rules pin);
    ``seen`` gets each request histogram's longest request; ``grouped``: :func:`group_ops` of the
    records, where the caller has it.  Summary format 7 (records format 8): where records name a library
    writer, the headline is its ops' alone and ``framework`` sets it beside the engine's, as ratios."""
    records = list(records)
    writers = [str(r.get("writer", "mlckpt")) for r in records]  # none: the engine's (before format 8)
    split = summary_format >= 7 and records_format >= 8 and any(w != "mlckpt" for w in writers)
    args = (max_resident_fraction, records_format, summary_format, seen)
    barrier = summary_format >= 10
    if not split:
        if grouped is not None and barrier:
            grouped = {key: from_barrier(recs) for key, recs in grouped.items()}
        return _summarize(grouped if grouped is not None else group_ops(records, barrier=barrier), *args)
    ref = group_ops((r for r, w in zip(records, writers, strict=True) if w == "mlckpt"), barrier=barrier)
    out = _summarize(group_ops((r for r, w in zip(records, writers, strict=True) if w != "mlckpt"),
                               barrier=barrier), *args)
    writer = "+".join(sorted(set(writers) - {"mlckpt"}))
    out["framework"] = _framework_block(writer, out, _summarize(ref, *args) if ref else None)
    return out


FRAMEWORK_FIGURES = ("write_bandwidth_mean_gib_s", "read_bandwidth_mean_gib_s", "write_cpu_s_per_gib",
                     "read_cpu_s_per_gib", "write_stall_mean_s")


def _framework_block(writer: str, mine: Mapping[str, Any], ref: Mapping[str, Any] | None) -> dict[str, Any]:
    """Summary format 7's ``framework``: each ratio library / engine (None where a side has none)."""
    block: dict[str, Any] = {"writer": writer, **{k: mine.get(k) for k in FRAMEWORK_FIGURES}}
    block["reference"] = None
    if ref is not None:
        block["reference"] = {k: ref.get(k) for k in FRAMEWORK_FIGURES}
        for op in ("write", "read"):
            a, b = mine.get(f"{op}_bandwidth_mean_gib_s"), ref.get(f"{op}_bandwidth_mean_gib_s")
            block["reference"][f"{op}_ratio"] = a / b if a is not None and b else None
    return block


def _summarize(grouped: Mapping[tuple[str, int], list[Mapping[str, Any]]], max_resident_fraction: float,
               records_format: int, summary_format: int, seen: latency.Seen | None) -> dict[str, object]:
    ops = [op_stats(recs) for recs in grouped.values()]
    writes = [o for o in ops if o.op == "write"]
    reads = [o for o in ops if o.op == "read"]
    first_write = next((recs[0] for (op, _), recs in grouped.items() if op == "write"), None)
    out: dict[str, object] = {"summary_format": summary_format, "records_format": records_format,
                           "num_writes": len(writes), "num_reads": len(reads)}
    if first_write is not None:
        out["mode"] = str(first_write["mode"])
        out["tiers"] = [str(st["tier"]) for st in first_write["stages"]]
    if writes:
        _io_block(out, "write", writes)
        out.update(_dist([o.stall_s or 0.0 for o in writes], "s", "write_stall"))
        out.update(_dist([o.time_to_durable_s or 0.0 for o in writes], "s", "write_time_to_durable"))
        for tier in writes[0].stages or {}:
            if tier != "durable":
                out.update(_dist([o.stages[tier].bandwidth_gib_s for o in writes if o.stages], "gib_s",
                                 f"write_{tier}_bandwidth"))
                out.update(_dist([o.stages[tier].duration_s for o in writes if o.stages], "s",
                                 f"write_{tier}_duration"))
        out["write_backpressure_ops"] = sum(1 for o in writes if (o.backpressure_s or 0) > 0)
        out["write_backpressure_total_s"] = sum(o.backpressure_s or 0.0 for o in writes)
        out["write_compute_mean_s"] = statistics.fmean(o.compute_s or 0.0 for o in writes)
        recs = [r for (op, _), rs in grouped.items() if op == "write" for r in rs]
        background = sum(int(r["t1_ns"]) - int(r["staged_ns"]) for r in recs)
        exposed = sum(int(r["exposed_ns"]) for r in recs)
        out["write_overlap_efficiency"] = (background - exposed) / background if background > 0 else None
    durable = [o for o in reads if o.tier == "durable"]
    if durable:
        _io_block(out, "read", durable)
    for tier in sorted({str(o.tier) for o in reads} - {"durable"}):
        _io_block(out, f"read_{tier}", [o for o in reads if o.tier == tier])
    if reads:
        worst = max(o.resident_fraction or 0.0 for o in durable) if durable else 0.0
        out["read_resident_fraction_max"] = worst
        out["read_cold"] = worst <= max_resident_fraction
        out["read_mismatches"] = sum(o.mismatches or 0 for o in reads)
        out["read_verified"] = out["read_mismatches"] == 0
    if summary_format >= 4 and records_format >= 4:
        out.update(_what_changes_the_figure(grouped, writes))
    if summary_format >= 6 and records_format >= 7:  # mlckpt/latency.py: requests and phases
        out.update(latency.summary([(op, recs) for (op, _), recs in grouped.items()
                                    if op == "write" or all(r.get("tier") == "durable" for r in recs)],
                                   seen))
    out["ops"] = [o.to_dict() for o in ops]
    return out


def _what_changes_the_figure(grouped: Mapping[tuple[str, int], list[Mapping[str, Any]]],
                             writes: list[OpStats]) -> dict[str, object]:
    """Summary format 4: the first write apart, CPU per GiB, the huge-page share (see the module
    docstring)."""
    out: dict[str, object] = {}
    if writes:
        first = min(writes, key=lambda o: o.index)
        out["write_first_duration_s"] = first.duration_s
        out["write_first_bandwidth_gib_s"] = first.bandwidth_gib_s
        steady = [o.bandwidth_gib_s for o in writes if o is not first]
        if steady:
            out["write_steady_bandwidth_mean_gib_s"] = statistics.fmean(steady)
    for op in ("write", "read"):
        recs = [r for (o, _), rs in grouped.items() if o == op for r in rs]
        moved = sum(int(r["bytes"]) for r in recs) / GiB
        cpu = [int(r["cpu_ns"]) for r in recs if r.get("cpu_ns") is not None]
        if recs and moved > 0 and len(cpu) == len(recs):
            out[f"{op}_cpu_s_per_gib"] = sum(cpu) / 1e9 / moved
    share = hugepage_share_min(r for rs in grouped.values() for r in rs)
    if share is not None:
        out["state_hugepage_fraction_min"] = share
    return out


def hugepage_share_min(records: Iterable[Mapping[str, Any]]) -> float | None:
    """``min_r state_huge_bytes / state_bytes`` over the records that say (records format 4)."""
    shares = [min(int(r["state_huge_bytes"]), int(r["state_bytes"])) / int(r["state_bytes"])
              for r in records if r.get("state_bytes") and "state_huge_bytes" in r]
    return min(shares) if shares else None
