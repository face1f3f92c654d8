"""A run's report as data, from its documents (run.json, summary.json, system.json, records).  Pure.

Per op (one row each; a serving run's load is an op "load", its strategy as its tier): its kind,
index, checkpoint, tier, duration (the slowest rank's, as the
summary's), aggregate bandwidth, the slowest rank and the spread (its duration over the median
rank's, as the summary's straggler ratio), requests and IOPS, latency percentiles, and the
slowest rank's phases.  Per rank and op: its own duration (the strip plot that shows
stragglers).  Per op kind: the latency distribution of every request (a CDF).  Per host: its
bandwidth over the run (each op's bytes over its time on that host, on that host's clock,
from its first op's start; and, where the records carry them, the device's own counters sampled
through each op).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mlckpt import latency
from mlckpt.metrics import group_ops
from mlckpt.units import GiB, fmt_io
from mlckpt.written import named_has

Rec = Mapping[str, Any]
OP_COLUMNS = ("op", "index", "checkpoint", "tier", "duration_s", "bandwidth_gib_s", "slowest_rank",
              "slowest_rank_bandwidth_gib_s", "straggler_ratio", "requests", "iops", "p50_ms", "p90_ms",
              "p99_ms", "p99_9_ms", "max_ms", "open_s", "transfer_s", "fsync_s", "dir_fsync_s")


@dataclass(frozen=True)
class Segment:
    """One op on one host: when (s from the host's first op), and its bandwidth there."""
    host: str
    op: str
    index: int
    start_s: float
    end_s: float
    gib_s: float


@dataclass(frozen=True)
class Report:
    title: str
    facts: tuple[tuple[str, str], ...]  # what the run was, in order (label, value)
    verdict: str
    findings: tuple[str, ...]
    ops: tuple[dict[str, object], ...]  # OP_COLUMNS each
    ranks: tuple[dict[str, Any], ...]  # op label, rank, host, duration_s
    cdfs: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # op kind -> CDF
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # op kind -> percentiles
    segments: tuple[Segment, ...] = ()
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # host -> (s, GiB/s)


def _label(op: str, index: int) -> str:
    return f"{op} {index}"


def _duration(r: Rec) -> int:
    return int(r["t1_ns"]) - int(r["t0_ns"])


def op_row(op: str, index: int, recs: Sequence[Rec]) -> dict[str, object]:
    slow = max(recs, key=_duration)
    dur = _duration(slow) / 1e9
    median = statistics.median(_duration(r) for r in recs) / 1e9
    total = sum(int(r["bytes"]) for r in recs)
    row: dict[str, Any] = dict.fromkeys(OP_COLUMNS)
    # a serving run's load (rules 1.13): no checkpoint; its strategy where a restore names its tier; a
    # resume run's resume (rules 1.21): no checkpoint either, "resume" as its tier
    load = op in ("load", "resume")
    tier = recs[0]["strategy"] if op == "load" else op if op == "resume" else recs[0].get("tier", "durable")
    row.update(op=op, index=index, checkpoint=None if load else int(recs[0]["checkpoint"]),
               tier=str(tier), duration_s=dur,
               bandwidth_gib_s=total / GiB / dur if dur > 0 else None, slowest_rank=int(slow["rank"]),
               slowest_rank_bandwidth_gib_s=int(slow["bytes"]) / GiB / dur if dur > 0 else None,
               straggler_ratio=dur / median if median > 0 else None)
    if all("requests" in r for r in recs):
        h = latency.merged(r["requests"] for r in recs)
        row["requests"] = h.get_total_count()
        row["iops"] = row["requests"] / dur if dur > 0 else None
        p = latency.percentiles_ms(h)
        row.update(p50_ms=p["p50"], p90_ms=p["p90"], p99_ms=p["p99"], p99_9_ms=p["p99_9"], max_ms=p["max"])
    for name, ns in (slow.get("phases_ns") or {}).items():
        row[f"{name}_s"] = int(ns) / 1e9
    return row


def segments(records: Sequence[Rec]) -> tuple[Segment, ...]:
    """Each op's bandwidth on each host, on that host's own clock from its first op's start."""
    by_host: dict[str, list[Rec]] = {}
    for r in records:
        by_host.setdefault(str(r["host"]), []).append(r)
    out = []
    for host, recs in sorted(by_host.items()):
        origin = min(int(r["t0_ns"]) for r in recs)
        for (op, index), mine in group_ops(recs).items():
            t0, t1 = min(int(r["t0_ns"]) for r in mine), max(int(r["t1_ns"]) for r in mine)
            nbytes = sum(int(r["bytes"]) for r in mine)
            out.append(Segment(host, op, index, (t0 - origin) / 1e9, (t1 - origin) / 1e9,
                               nbytes / GiB / ((t1 - t0) / 1e9) if t1 > t0 else 0.0))
    return tuple(out)


def sampled(records: Sequence[Rec]) -> dict[str, list[tuple[float, float]]]:
    """Per host, the device's bandwidth between consecutive counter samples taken through each op
    (records format 7's ``host_counters.samples``: [t_ns, read_bytes, written_bytes]), on the
    host's clock from its first op's start."""
    out: dict[str, list[tuple[float, float]]] = {}
    origins: dict[str, int] = {}
    for r in records:
        origins[str(r["host"])] = min(origins.get(str(r["host"]), int(r["t0_ns"])), int(r["t0_ns"]))
    for r in sorted(records, key=lambda r: int(r["t0_ns"])):
        samples = (r.get("host_counters") or {}).get("samples") or []
        host = str(r["host"])
        for (ta, ra, wa), (tb, rb, wb) in itertools.pairwise(samples):
            if tb > ta:
                rate = ((rb - ra) + (wb - wa)) / GiB / ((tb - ta) / 1e9)
                out.setdefault(host, []).append(((tb - origins[host]) / 1e9, rate))
    return out


def build(run: Mapping[str, Any], summary: Mapping[str, Any], system: Mapping[str, Any],
          records: Sequence[Rec], config: Mapping[str, object] | None = None) -> Report:
    # each rank timed as the summary times it: from its host's barrier from rules 1.20
    grouped = group_ops(records, barrier=named_has(run.get("rules_version"), "barrier_start"))
    ops = tuple(op_row(op, index, recs) for (op, index), recs in grouped.items())
    ranks = tuple({"op": _label(op, index), "rank": int(r["rank"]), "host": str(r["host"]),
                   "duration_s": _duration(r) / 1e9}
                  for (op, index), recs in grouped.items() for r in recs)
    cdfs, lat = {}, {}
    for kind in ("write", "read"):
        mine = [r for (op, _), recs in grouped.items() if op == kind for r in recs
                if r.get("tier", "durable") == "durable"]
        if mine and all("requests" in r for r in mine):
            h = latency.merged(r["requests"] for r in mine)
            cdfs[kind] = latency.cdf_ms(h)
            lat[kind] = latency.percentiles_ms(h)
    hosts = system.get("hosts") or []
    first = hosts[0] if hosts else {}
    fs = first.get("filesystem") or {}
    workload = run.get("workload")
    facts = (("workload", str(workload.get("name", "?") if isinstance(workload, Mapping) else workload)),
             ("ranks", f"{run.get('ranks')} on {len(hosts) or '?'} host(s)"),
             ("division", f"{run.get('division')}, scale {run.get('scale')}"),
             ("rules", str(run.get("rules_version"))),
             ("system", str(run.get("system_name") or first.get("hostname") or "?")),
             ("storage", f"{fs.get('fs_type', '?')} on {fs.get('source', '?')} "
                         f"({first.get('target_path', '?')})"),
             *((("I/O", fmt_io(config.get("io"))),) if config is not None else ()),
             *(_serving(summary) if summary.get("kind") == "serving" else
               _resume(summary) if summary.get("kind") == "resume" else
               (("write", _headline(summary, "write")), ("read", _headline(summary, "read")))),
             *(_framework(summary) if summary.get("kind") != "resume" else ()),
             ("started", str(run.get("started"))))
    findings = tuple(f"[{f.get('rule')}] {f.get('message')}" for f in run.get("findings") or ()
                     if f.get("severity") != "warning") + tuple(
        f"warning: [{f.get('rule')}] {f.get('message')}" for f in run.get("findings") or ()
        if f.get("severity") == "warning")
    return Report(title=str(run.get("name", "run")), facts=facts, verdict=str(run.get("verdict", "?")),
                  findings=findings, ops=ops, ranks=ranks, cdfs=cdfs, latency=lat,
                  segments=segments(records), samples=sampled(records))


def with_signature(rep: Report, status: str) -> Report:
    """The report with the bundle's signature status among its facts."""
    return replace(rep, facts=(*rep.facts, ("signature", status)))


def _framework(summary: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """Summary format 7: the library writer and its ratios to the engine's checkpoints of the run."""
    fw = summary.get("framework")
    if not isinstance(fw, Mapping):
        return ()
    ref = fw.get("reference") or {}
    ratios = [f"{op} {ref[f'{op}_ratio']:.2f}× the engine's {ref[f'{op}_bandwidth_mean_gib_s']:.3f} GiB/s"
              for op in ("write", "read") if ref.get(f"{op}_ratio") is not None]
    return (("framework", f"{fw.get('writer')}: " + ("; ".join(ratios) if ratios else
                                                     "no engine checkpoints in the run to compare with")),)


def _serving(summary: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Summary format 8: the replicas, the strategy and the time until the last one was ready."""
    rate = summary.get("effective_gb_s")
    return (("serving", f"{summary.get('replicas')} replicas of TP {summary.get('tp')}, "
                        f"{summary.get('strategy')}"),
            ("ready", f"{summary.get('ready_s_median', 0):.3f} s median over {summary.get('num_loads')} loads"
                      + (f", {rate:.2f} GB/s effective" if rate is not None else "")
                      + f", {int(summary.get('storage_bytes', 0)) / 1e9:.3f} GB from the storage per load"),
            *_node_tier(summary))


def _resume(summary: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Summary format 11: both layouts, the time until the last new rank held its shard, its parts."""
    rate = summary.get("rate_gb_s")
    parts = ", ".join(f"{p} {float(summary.get(f'{p}_s_median', 0)) * 1e3:.1f} ms"
                      for p in ("metadata", "planning", "read", "placing"))
    return (("resume", f"from {summary.get('from_ranks')} ranks (TP {summary.get('from_tp')}, PP "
                       f"{summary.get('from_pp')}) at TP {summary.get('tp')}, PP {summary.get('pp')}, DP "
                       f"{summary.get('dp')}"),
            ("resumed", f"{summary.get('ready_s_median', 0):.3f} s median over {summary.get('num_resumes')} "
                        "resumes" + (f", {rate:.2f} GB/s of state" if rate is not None else "")
                        + f", {int(summary.get('read_bytes', 0)) / 1e9:.3f} GB read for "
                        f"{int(summary.get('state_bytes', 0)) / 1e9:.3f} GB placed"),
            ("parts", f"slowest rank's, median: {parts}"), *_resume_library(summary))


def _resume_library(summary: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Summary format 12: a library's resumes (DCP's) beside the engine's of the same run, and what
    its hosts read from the storage."""
    fw = summary.get("framework")
    if not isinstance(fw, Mapping):
        return ()
    ref = fw.get("reference") or {}
    ratio, engine = ref.get("resume_ratio"), ref.get("ready_s_median")
    return (("through", f"{fw.get('writer')}'s resharding load (buffered reads); "
                        f"{int(summary.get('storage_bytes', 0)) / 1e9:.3f} GB from the storage, the hosts' "
                        "ranks sharing their page cache"),
            ("engine", "no resume by the engine in this run" if engine is None else
             f"{engine:.3f} s median over {ref.get('num_resumes')} resume(s) on the same checkpoint"
             + (f": {fw.get('writer')} at {ratio:.2f}× the engine's rate" if ratio is not None else "")))


def _node_tier(summary: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Summary format 9: whether nodecache's tier was read from its device or from memory."""
    cold = summary.get("node_tier_cold")
    if cold is None:
        return ()
    resident = sum(int(ld.get("node_tier_resident_bytes", 0)) for ld in summary.get("loads") or ())
    tier = sum(int(ld.get("node_tier_bytes", 0)) for ld in summary.get("loads") or ())
    share = f"{resident / tier:.0%}" if tier else "0%"
    return (("node tier", ("cold: read from its device" if cold else
                           "warm: read from memory (a tier in memory, or the page cache)")
             + f", {share} of its reads resident beforehand"),)


def _headline(summary: Mapping[str, Any], op: str) -> str:
    bw = summary.get(f"{op}_bandwidth_mean_gib_s")
    if bw is None:
        return "none"
    out = f"{bw:.3f} GiB/s mean over {summary.get(f'num_{op}s')} ops"
    lat = summary.get(f"{op}_latency_ms")
    if lat:
        out += f"; request p50 {lat['p50']:.3f} ms, p99 {lat['p99']:.3f} ms"
    return out
