"""Asynchronous checkpointing's blocking time against the synchronous checkpoint duration, at the
same bytes, ranks and filesystem.

    python benchmarks/async_stall.py [--workload llama3_8b] [--ranks 4] [--scale 0.04] [--writes 4]
                                     [--reads 0] [--rounds 3] [--interval auto|SECONDS]
                                     [--interval-factor 2.0] [--short-interval 0]
                                     [--modes sync,async,async+tiers,sync+tiers]
                                     [--short-modes async,async+tiers] [--folder DIR] [--fast DIR]
                                     [--set KEY=VALUE ...] [--quick] [--keep] [--json FILE]

Modes (all open division): ``sync`` (training waits until the checkpoint is durable), ``async``
(training waits for a copy of the state into host staging; the persist runs behind training),
``async+tiers`` (the same, persisted to a fast tier on --fast, default /dev/shm, then drained to
--folder in the background) and ``sync+tiers`` (training waits for the fast-tier write; the drain
runs behind training).  Every run writes checkpoint.num_writes checkpoints of the same bytes.

Two settings of checkpoint.compute_interval_s (the training time after each checkpoint, which
background work can hide behind):

* long: ``--interval auto`` (the default) = ``--interval-factor`` (default 2.0) x the synchronous
  checkpoint duration measured by a first sync run at interval 0.  2x leaves the one-tier persist
  (about one sync duration) a margin of 2; the tiered modes have more background work (fast
  write, then a verified drain that reads the fast copy back), which may or may not fit; the
  back-pressure column shows which.  A fixed ``--interval SECONDS`` skips the calibration.
* short: ``--short-interval`` (default 0): the next checkpoint arrives as soon as its content is
  made, so back-pressure (waiting for the previous checkpoint's background work) shows.  The
  calibration run is the short setting's sync reference; add ``sync`` to --short-modes for more.

Round after round (--rounds, default 3) every (setting, mode) runs once; the order is rotated and
reversed between rounds, because this kind of VM disk drifts between runs.  Per mode and setting
it prints, from the bundles' summary.json: checkpoint bytes, the stall (what training waited per
checkpoint; for sync this is the checkpoint duration) mean and max, the headline ratio stall /
sync checkpoint duration (means over all ops of all rounds at the same setting, and paired per
round), the blocking stage's time and rate, the durable-tier write time and bandwidth, time to
durable, overlap efficiency and back-pressure.  Every figure is recomputed from records.jsonl
(records format 2) independently of mlckpt.metrics and checked against summary.json: any
difference is printed as CROSS-CHECK FAILED and makes the exit status 2 (the tables are still
printed).  The records are also checked against what records format 2 promises, rank by rank
(stages in order and inside [t0, t1], staged = t1 for sync, 0 <= back-pressure <= stall,
0 <= exposed <= background and <= the next back-pressure, training interval >=
compute_interval_s): a violation prints ODD RECORD (a runner bug to report; it does not change
the exit status).  A memcpy probe (``engine.snapshot`` in one process per rank, before and after
the runs) gives the rate the async stall should approach.

Everything goes under a temporary folder (--folder, default: $TMPDIR) and a temporary folder in
--fast; both are removed at the end (bundles too, unless --keep).  The runner's signing key goes to
a temporary XDG_CONFIG_HOME.  --quick: 2 ranks, scale 0.005 (0.5 GiB), 2 writes, 1 round, short
setting async only, no second memcpy probe (30-55 s, depending on load).
This is a measurement: exit status 0 whatever the figures, 1 if nothing was measured, 2 if a
cross-check failed.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import bench

GB = 1e9
GiB = float(1 << 30)
MODES = ("sync", "async", "async+tiers", "sync+tiers")
LONG, SHORT = "long", "short"
REL_TOL = 1e-9


# ------------------------------------------------------------------------------------ plan
@dataclass
class Case:
    workload: str
    ranks: int
    scale: float
    writes: int
    reads: int
    extra: list[str]
    rank_bytes: list[int] = field(default_factory=list)
    threads: int = 0
    block_size: int = 0

    @property
    def overrides(self) -> list[str]:
        return [f"workload={self.workload}", "division=open", f"scale={self.scale}",
                f"ranks={self.ranks}", f"checkpoint.num_writes={self.writes}",
                f"checkpoint.num_reads={self.reads}", *self.extra]

    @property
    def total(self) -> int:
        return sum(self.rank_bytes)


def resolve(case: Case) -> Case:
    from mlckpt.plan.config import setup

    s = setup(case.overrides)
    case.rank_bytes = [rp.bytes for rp in s.plan.rank_plans]
    case.threads = int(s.config["io"]["threads"])
    case.block_size = int(s.config["io"]["block_size"])
    return case


def mode_overrides(mode: str, interval: float, fast: Path) -> list[str]:
    sync_async, _, tiers = mode.partition("+")
    out = [f"checkpoint.mode={sync_async}", f"checkpoint.compute_interval_s={interval:g}"]
    if tiers:
        out.append(f"checkpoint.tiers.fast={fast}")
    return out


# ------------------------------------------------------------------------------------ records
def _stats(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "median": statistics.median(xs),
            "stdev": statistics.pstdev(xs), "min": min(xs), "max": max(xs)}


def recompute(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The write figures, straight from records format 2 (not through mlckpt.metrics):
    per op k, stall = max_r(staged - t0), time to durable = max_r(t1 - t0), durable-tier duration
    = max_r of the durable stage's (t1 - t0), bandwidth = sum of bytes / that duration, blocking
    and fast stages likewise, back-pressure = max_r(backpressure); overlap = sum_r(background -
    exposed) / sum_r(background) with background = t1 - staged, over all ops."""
    by_op: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r["op"] == "write":
            by_op.setdefault(int(r["index"]), []).append(r)
    ops = []
    bg_sum = exposed_sum = 0
    for k in sorted(by_op):
        rs = by_op[k]
        nbytes = sum(int(r["bytes"]) for r in rs)

        def stage_span(tier: str, rs: list[dict[str, Any]] = rs) -> float | None:
            spans = [st["t1_ns"] - st["t0_ns"] for r in rs for st in r["stages"] if st["tier"] == tier]
            return max(spans) / 1e9 if spans else None

        dur = stage_span("durable")
        bg = sum(r["t1_ns"] - r["staged_ns"] for r in rs)
        exposed = sum(r["exposed_ns"] for r in rs)
        bg_sum += bg
        exposed_sum += exposed
        ops.append({
            "index": k, "ranks": len(rs), "bytes": nbytes,
            "blocking_tier": rs[0]["stages"][0]["tier"],
            "stall_s": max(r["staged_ns"] - r["t0_ns"] for r in rs) / 1e9,
            "time_to_durable_s": max(r["t1_ns"] - r["t0_ns"] for r in rs) / 1e9,
            "duration_s": dur,
            "bandwidth_gib_s": nbytes / dur / GiB if dur else math.inf,
            "memory_s": stage_span("memory"), "fast_s": stage_span("fast"),
            "backpressure_s": max(r["backpressure_ns"] for r in rs) / 1e9,
            "compute_s": max(r["compute_ns"] for r in rs) / 1e9,
            "overlap_efficiency": (bg - exposed) / bg if bg > 0 else None,
            "background_ns": bg, "exposed_ns": exposed,
        })
    out: dict[str, Any] = {"ops": ops, "bytes_per_op": ops[0]["bytes"] if ops else 0,
                           "background_ns": bg_sum, "exposed_ns": exposed_sum,
                           "overlap_efficiency": (bg_sum - exposed_sum) / bg_sum if bg_sum > 0 else None,
                           "backpressure_ops": sum(1 for o in ops if o["backpressure_s"] > 0),
                           "backpressure_total_s": sum(o["backpressure_s"] for o in ops),
                           "compute_mean_s": statistics.fmean(o["compute_s"] for o in ops)}
    for name in ("stall_s", "time_to_durable_s", "duration_s", "bandwidth_gib_s", "memory_s", "fast_s"):
        vals = [o[name] for o in ops if o[name] is not None]
        if vals:
            out[name] = _stats(vals)
    return out


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b)):
        return bool(a == b)
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)


def cross_check(summary: dict[str, Any], rec: dict[str, Any], mode: str) -> list[str]:
    """Differences between the runner's summary.json and the figures recomputed from records."""
    bad: list[str] = []

    def cmp(key: str, mine: Any) -> None:
        if key not in summary:
            bad.append(f"summary.json lacks {key} (records give {mine})")
        elif not _close(summary[key], mine):
            bad.append(f"{key}: summary.json {summary[key]!r} != records {mine!r}")

    for ours, theirs, unit in (("stall_s", "write_stall", "s"), ("duration_s", "write_duration", "s"),
                               ("time_to_durable_s", "write_time_to_durable", "s"),
                               ("bandwidth_gib_s", "write_bandwidth", "gib_s"),
                               ("memory_s", "write_memory_duration", "s"),
                               ("fast_s", "write_fast_duration", "s")):
        for stat, v in rec.get(ours, {}).items():
            cmp(f"{theirs}_{stat}_{unit}", v)
    cmp("write_backpressure_ops", rec["backpressure_ops"])
    cmp("write_backpressure_total_s", rec["backpressure_total_s"])
    cmp("write_overlap_efficiency", rec["overlap_efficiency"])
    cmp("write_compute_mean_s", rec["compute_mean_s"])
    cmp("write_bytes_per_op", rec["bytes_per_op"])
    cmp("checkpoint_bytes", rec["bytes_per_op"])
    cmp("num_writes", len(rec["ops"]))
    cmp("mode", mode.partition("+")[0])
    want_tiers = [rec["ops"][0]["blocking_tier"]] if rec["ops"] else []
    want_tiers += {"sync": [], "async": ["durable"], "async+tiers": ["fast", "durable"],
                   "sync+tiers": ["durable"]}[mode]
    cmp("tiers", want_tiers)
    theirs = {int(o["index"]): o for o in summary.get("ops", []) if o.get("op") == "write"}
    for o in rec["ops"]:
        s = theirs.get(o["index"])
        if s is None:
            bad.append(f"summary.json ops lack write {o['index']}")
            continue
        for key in ("stall_s", "time_to_durable_s", "duration_s", "bandwidth_gib_s", "backpressure_s",
                    "compute_s", "overlap_efficiency", "bytes"):
            if not _close(s.get(key), o[key]):
                bad.append(f"ops[write {o['index']}].{key}: summary.json {s.get(key)!r} != "
                           f"records {o[key]!r}")
    return bad


def invariants(records: list[dict[str, Any]], mode: str, interval: float) -> list[str]:
    """What records format 2 promises, rank by rank (independent of the summary)."""
    bad: list[str] = []
    blocking = {"sync": "durable", "async": "memory", "async+tiers": "memory", "sync+tiers": "fast"}[mode]
    background = {"sync": [], "async": ["durable"], "async+tiers": ["fast", "durable"],
                  "sync+tiers": ["durable"]}[mode]
    for r in records:
        if r["op"] != "write":
            continue
        where = f"write {r['index']} rank {r['rank']}"
        tiers = [st["tier"] for st in r["stages"]]
        if tiers != [blocking, *background]:
            bad.append(f"{where}: stages {tiers}, expected {[blocking, *background]}")
            continue
        if r["mode"] != mode.partition("+")[0]:
            bad.append(f"{where}: mode {r['mode']!r}")
        t0, staged, t1 = r["t0_ns"], r["staged_ns"], r["t1_ns"]
        if not t0 <= staged <= t1:
            bad.append(f"{where}: t0 {t0} <= staged {staged} <= t1 {t1} does not hold")
        first, last = r["stages"][0], r["stages"][-1]
        if not t0 <= first["t0_ns"] <= first["t1_ns"] <= staged:
            bad.append(f"{where}: blocking stage [{first['t0_ns']}, {first['t1_ns']}] not inside "
                       f"[t0 {t0}, staged {staged}]")
        if last["t1_ns"] != t1:
            bad.append(f"{where}: t1 {t1} != the last stage's t1 {last['t1_ns']}")
        for a, b in zip(r["stages"], r["stages"][1:], strict=False):
            if b["t0_ns"] < a["t1_ns"]:
                bad.append(f"{where}: stage {b['tier']} starts before {a['tier']} ends")
        if not background and staged != t1:
            bad.append(f"{where}: sync, one tier: staged {staged} != t1 {t1} (stall != duration)")
        if not 0 <= r["backpressure_ns"] <= staged - t0:
            bad.append(f"{where}: back-pressure {r['backpressure_ns']} ns outside [0, stall {staged - t0}]")
        if not 0 <= r["exposed_ns"] <= max(t1 - staged, 0):
            bad.append(f"{where}: exposed {r['exposed_ns']} ns outside [0, background {t1 - staged}]")
        if r["compute_ns"] < interval * 1e9 * 0.999:
            bad.append(f"{where}: compute {r['compute_ns'] / 1e9:.3f} s < interval {interval:g} s")
        if any(int(st["bytes"]) != int(r["bytes"]) for st in r["stages"]):
            bad.append(f"{where}: a stage moved other bytes than the op")
        if any(st.get("mismatches") for st in r["stages"]):
            bad.append(f"{where}: drain mismatches {[st.get('mismatches') for st in r['stages']]}")
    by_rank: dict[int, dict[int, dict[str, Any]]] = {}
    for r in records:
        if r["op"] == "write":
            by_rank.setdefault(int(r["rank"]), {})[int(r["index"])] = r
    for rank, mine in by_rank.items():  # exposed time is paid in the next checkpoint's back-pressure
        for k, r in mine.items():
            nxt = mine.get(k + 1)
            if nxt is not None and r["exposed_ns"] > nxt["backpressure_ns"]:
                bad.append(f"write {k} rank {rank}: exposed {r['exposed_ns']} ns > write {k + 1}'s "
                           f"back-pressure {nxt['backpressure_ns']} ns")
    return bad


# ------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    setting: str
    mode: str
    interval: float
    round: int
    summary: dict[str, Any]
    rec: dict[str, Any]
    mismatches: list[str]  # summary.json against records.jsonl
    oddities: list[str]  # records against the invariants of records format 2
    wall_s: float

    def s(self, key: str, default: float = math.nan) -> float:
        v = self.summary.get(key)
        return default if v is None else float(v)


def run_mlckpt(case: Case, mode: str, interval: float, setting: str, rnd: int, work: Path, fast: Path,
               env: dict[str, str], keep: bool) -> Run:
    out, ck = work / "results", work / "ckpt"
    cmd = [sys.executable, "-m", "mlckpt", "run", *case.overrides, *mode_overrides(mode, interval, fast),
           f"output.root={out}", f"checkpoint.folder={ck}"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    wall = time.perf_counter() - t
    bundle = next((ln.split("bundle:", 1)[1].strip() for ln in proc.stdout.splitlines()
                   if ln.startswith("bundle:")), None)
    if proc.returncode != 0 or bundle is None:
        lines = list(dict.fromkeys(ln.strip() for ln in (proc.stderr + proc.stdout).splitlines()
                                   if ln.strip()))
        raise RuntimeError(f"mlckpt run failed ({proc.returncode}): " + " | ".join(lines[-4:])[-800:])
    try:
        summary = json.loads((Path(bundle) / "summary.json").read_text())
        records = [json.loads(ln) for ln in (Path(bundle) / "records.jsonl").read_text().splitlines() if ln]
    finally:
        if not keep:
            shutil.rmtree(bundle, ignore_errors=True)
    rec = recompute(records)
    mismatches = cross_check(summary, rec, mode)
    if rec["bytes_per_op"] != case.total:
        mismatches.append(f"checkpoint bytes {rec['bytes_per_op']} != the plan's {case.total}")
    return Run(setting, mode, interval, rnd, summary, rec, mismatches, invariants(records, mode, interval),
               wall)


# ------------------------------------------------------------------------------------ memcpy probe
def _copy_worker(nbytes: int, threads: int, reps: int, barrier: Any, results: Any, solo: bool) -> None:
    from mlckpt import engine

    src, dst = engine.alloc(nbytes), engine.alloc(nbytes)
    src[::4096] = 7
    engine.snapshot(dst, src, nbytes, threads)  # warm-up, untimed
    together = []
    for _ in range(reps):
        barrier.wait()
        t = time.perf_counter_ns()
        engine.snapshot(dst, src, nbytes, threads)
        together.append((time.perf_counter_ns() - t) / 1e9)
    barrier.wait()
    alone = []
    if solo:  # the others have finished: one process, one thread, the machine to itself
        for _ in range(reps):
            t = time.perf_counter_ns()
            engine.snapshot(dst, src, nbytes, 1)
            alone.append((time.perf_counter_ns() - t) / 1e9)
    results.put((nbytes, together, alone))


def memcpy_probe(case: Case, reps: int = 5) -> dict[str, float]:
    """engine.snapshot (the async stall's copy) in one process per rank with io.threads threads,
    all at once, as the ranks do: aggregate rate = sum of bytes / slowest process per repetition
    (median and best of ``reps``).  Then one process with one thread: the single-core rate."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(case.ranks), ctx.Queue()
    procs = [ctx.Process(target=_copy_worker, args=(n, case.threads, reps, barrier, results, r == 0))
             for r, n in enumerate(case.rank_bytes)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = sum(g[0] for g in got)
    agg = [total / max(g[1][i] for g in got) / GiB for i in range(reps)]
    solo = next(g for g in got if g[2])
    one = [solo[0] / t / GiB for t in solo[2]]
    return {"aggregate_gib_s": statistics.median(agg), "aggregate_best_gib_s": max(agg),
            "aggregate_worst_gib_s": min(agg), "one_core_gib_s": statistics.median(one),
            "one_core_best_gib_s": max(one), "expected_stall_s": total / (statistics.median(agg) * GiB),
            "expected_stall_best_s": total / (max(agg) * GiB)}


def probe_line(p: dict[str, float], case: Case) -> str:
    return (f"{case.ranks} processes x {case.threads} threads at once: median {p['aggregate_gib_s']:.2f} "
            f"GiB/s (worst {p['aggregate_worst_gib_s']:.2f}, best {p['aggregate_best_gib_s']:.2f}) = "
            f"{p['expected_stall_s']:.3f} s per checkpoint (best {p['expected_stall_best_s']:.3f} s); "
            f"one process, one thread: median {p['one_core_gib_s']:.2f} GiB/s "
            f"(best {p['one_core_best_gib_s']:.2f})")


# ------------------------------------------------------------------------------------ report
def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def blocking_rate(run: Run) -> tuple[str, float, float]:
    """(blocking tier, mean duration s, mean rate GiB/s) of the stage training waits for."""
    tier = run.rec["ops"][0]["blocking_tier"]
    if tier == "durable":
        return tier, run.s("write_duration_mean_s"), run.s("write_bandwidth_mean_gib_s")
    return tier, run.s(f"write_{tier}_duration_mean_s"), run.s(f"write_{tier}_bandwidth_mean_gib_s")


def run_line(run: Run, case: Case) -> str:
    tier, bd, brate = blocking_rate(run)
    n = len(run.rec["ops"])
    ov = run.summary.get("write_overlap_efficiency")
    check = "check ok" if not run.mismatches else f"CROSS-CHECK FAILED ({len(run.mismatches)})"
    if run.oddities:
        check += f", {len(run.oddities)} ODD RECORDS"
    return (f"stall mean {run.s('write_stall_mean_s'):.3f} max {run.s('write_stall_max_s'):.3f} s | "
            f"{tier} {bd:.3f} s ({brate:.2f} GiB/s) | durable {run.s('write_duration_mean_s'):.3f} s "
            f"{run.s('write_bandwidth_mean_gib_s'):.2f} GiB/s | to durable "
            f"{run.s('write_time_to_durable_mean_s'):.2f} s | overlap {_fmt(ov, '.0%')} | back-pressure "
            f"{int(run.s('write_backpressure_ops'))}/{n} ({run.s('write_backpressure_total_s'):.2f} s) | "
            f"{check} | {run.wall_s:.0f} s, {bench.load()}")


def aggregate(runs: list[Run], sync_ref: list[Run]) -> dict[str, Any]:
    """Figures of one (setting, mode) over its runs; ratios against the sync runs ``sync_ref``."""
    ops = [o for r in runs for o in r.rec["ops"]]
    stall = [o["stall_s"] for o in ops]
    dsync = statistics.fmean(o["stall_s"] for r in sync_ref for o in r.rec["ops"]) if sync_ref else math.nan
    bg = sum(r.rec["background_ns"] for r in runs)
    exposed = sum(r.rec["exposed_ns"] for r in runs)
    tier, _, _ = blocking_rate(runs[0])
    paired = []
    for r in runs:  # this run against the sync run of the same round (else the mean of all sync runs)
        same = [s for s in sync_ref if s.round == r.round] or sync_ref
        if same:
            paired.append(r.s("write_stall_mean_s")
                          / statistics.fmean(s.s("write_stall_mean_s") for s in same))
    return {
        "runs": len(runs), "ops": len(ops), "interval_s": runs[0].interval,
        "checkpoint_bytes": int(runs[0].summary["checkpoint_bytes"]),
        "stall_mean_s": statistics.fmean(stall), "stall_median_s": statistics.median(stall),
        "stall_max_s": max(stall), "stall_min_s": min(stall),
        "sync_duration_mean_s": dsync,
        "ratio_mean": statistics.fmean(stall) / dsync, "ratio_max": max(stall) / dsync,
        "ratio_paired": paired,
        "blocking_tier": tier,
        "blocking_mean_s": statistics.fmean(blocking_rate(r)[1] for r in runs),
        "blocking_gib_s": statistics.fmean(blocking_rate(r)[2] for r in runs),
        "durable_mean_s": statistics.fmean(r.s("write_duration_mean_s") for r in runs),
        "durable_gib_s": statistics.fmean(r.s("write_bandwidth_mean_gib_s") for r in runs),
        "time_to_durable_mean_s": statistics.fmean(r.s("write_time_to_durable_mean_s") for r in runs),
        "time_to_durable_max_s": max(r.s("write_time_to_durable_max_s") for r in runs),
        "overlap_efficiency": (bg - exposed) / bg if bg > 0 else None,
        "overlap_per_run": [r.summary.get("write_overlap_efficiency") for r in runs],
        "backpressure_ops": sum(int(r.s("write_backpressure_ops")) for r in runs),
        "backpressure_mean_s": statistics.fmean(o["backpressure_s"] for o in ops),
        "compute_mean_s": statistics.fmean(o["compute_s"] for o in ops),
        "cross_check_failures": sum(len(r.mismatches) for r in runs),
        "odd_records": sum(len(r.oddities) for r in runs),
    }


def print_table(setting: str, interval: float, rows: dict[str, dict[str, Any]]) -> None:
    ref = next(iter(rows.values()))
    print(f"\n== {setting} interval: checkpoint.compute_interval_s={interval:g} s; "
          f"{ref['checkpoint_bytes'] / GiB:.3f} GiB ({ref['checkpoint_bytes'] / GB:.2f} GB) per checkpoint; "
          f"sync checkpoint duration {ref['sync_duration_mean_s']:.3f} s (mean over ops)")
    head = (f"  {'mode':12s}{'runs/ops':>9s}{'stall s':>9s}{'max':>7s}{'/sync':>7s}{'max/':>6s}"
            f"{'blocking stage (rate)':>30s}{'durable s':>10s}{'GiB/s':>7s}{'GB/s':>6s}{'to dur. s':>10s}"
            f"{'overlap':>8s}{'back-pr.':>9s}{'bp s/op':>8s}")
    print(head)
    for mode, a in rows.items():
        blk = f"{a['blocking_tier']} {a['blocking_mean_s']:.3f} s {a['blocking_gib_s']:.2f} GiB/s"
        print(f"  {mode:12s}{a['runs']:>4d}/{a['ops']:<4d}{a['stall_mean_s']:9.3f}{a['stall_max_s']:7.3f}"
              f"{a['ratio_mean']:7.3f}{a['ratio_max']:6.2f}{blk:>30s}{a['durable_mean_s']:10.3f}"
              f"{a['durable_gib_s']:7.2f}{a['durable_gib_s'] * GiB / GB:6.2f}"
              f"{a['time_to_durable_mean_s']:10.2f}{_fmt(a['overlap_efficiency'], '.0%'):>8s}"
              f"{a['backpressure_ops']:>5d}/{a['ops']:<3d}{a['backpressure_mean_s']:8.3f}")
    for mode, a in rows.items():
        if mode != "sync":
            print(f"    {mode}: stall / sync paired per round: "
                  + " ".join(f"{x:.3f}" for x in a["ratio_paired"])
                  + f"; mean training interval measured {a['compute_mean_s']:.2f} s")


# ------------------------------------------------------------------------------------ main
def schedule(modes: list[str], short_modes: list[str], rounds: int, calibrated: bool
             ) -> list[list[tuple[str, str]]]:
    """Per round, the (setting, mode) runs in order: rotated by round and reversed every other
    round.  With calibration, round 1's short sync run is the calibration run itself (done first)."""
    cases = [(LONG, m) for m in modes] + [(SHORT, m) for m in short_modes]
    step = max(1, len(cases) // max(rounds, 1))
    out = []
    for i in range(rounds):
        k = (i * step) % len(cases)
        order = cases[k:] + cases[:k]
        if i % 2:
            order.reverse()
        if i == 0 and calibrated:
            order = [c for c in order if c != (SHORT, "sync")]
        out.append(order)
    return out


def _modes(text: str) -> list[str]:
    out = [m.strip() for m in text.split(",") if m.strip()]
    for m in out:
        if m not in MODES:
            raise SystemExit(f"async_stall: unknown mode {m!r}; known: {', '.join(MODES)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--ranks", type=int, default=None, help="default 4 (--quick: 2)")
    ap.add_argument("--scale", type=float, default=None, help="default 0.04 (4.19 GiB on llama3_8b)")
    ap.add_argument("--writes", type=int, default=None, help="checkpoint.num_writes per run (default 4)")
    ap.add_argument("--reads", type=int, default=0, help="checkpoint.num_reads per run (default 0)")
    ap.add_argument("--rounds", type=int, default=None, help="runs per (setting, mode) (default 3)")
    ap.add_argument("--interval", default="auto", metavar="auto|SECONDS",
                    help="long compute interval (auto: --interval-factor x the sync checkpoint duration "
                    "of a first sync run)")
    ap.add_argument("--interval-factor", type=float, default=2.0)
    ap.add_argument("--short-interval", type=float, default=0.0,
                    help="the short setting's compute interval (default 0)")
    ap.add_argument("--modes", default=",".join(MODES), help="modes at the long interval")
    ap.add_argument("--short-modes", default=None,
                    help="modes at the short interval (default async,async+tiers; --quick: async; "
                    "empty: none; the calibration run is its sync)")
    ap.add_argument("--folder", help="checkpoint filesystem (default: a temporary folder in $TMPDIR)")
    ap.add_argument("--fast", default="/dev/shm", help="where the fast tier's temporary folder goes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra mlckpt override for every run (repeatable)")
    ap.add_argument("--quick", action="store_true",
                    help="2 ranks, scale 0.005, 2 writes, 1 round, short setting async only (< 1 min)")
    ap.add_argument("--keep", action="store_true", help="keep the result bundles (their folder is printed)")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args(argv)
    dflt: dict[str, Any] = {"ranks": 4, "scale": 0.04, "writes": 4, "rounds": 3,
                            "short_modes": "async,async+tiers"}
    if args.quick:
        dflt = {"ranks": 2, "scale": 0.005, "writes": 2, "rounds": 1, "short_modes": "async"}
    for k, v in dflt.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    modes, short_modes = _modes(args.modes), _modes(args.short_modes)
    if "sync" not in modes:
        raise SystemExit("async_stall: --modes needs sync (the reference)")
    case = resolve(Case(args.workload, args.ranks, args.scale, args.writes, args.reads, list(args.set)))

    if args.folder:
        Path(args.folder).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="mlckpt-asyncstall-", dir=args.folder))
    fast: Path | None = None
    if any("tiers" in m for m in modes + short_modes):
        if os.path.isdir(args.fast):
            fast = Path(tempfile.mkdtemp(prefix="mlckpt-asyncstall-", dir=args.fast))
        else:
            print(f"async_stall: {args.fast} does not exist: the tiered modes are skipped")
            modes = [m for m in modes if "tiers" not in m]
            short_modes = [m for m in short_modes if "tiers" not in m]
    env = dict(os.environ, XDG_CONFIG_HOME=str(base / "xdg"))
    from mlckpt.host.facts import host_facts

    try:
        facts = host_facts(base, "")
        fs = facts["filesystem"]
        print(f"host: {facts['cpu_model']}, {facts['cpu_cores']} CPUs, "
              f"{facts['memory_total_bytes'] / GiB:.1f} GiB RAM, kernel {facts['kernel']}; "
              f"{fs.get('fs_type')} on {fs.get('source')} ({fs.get('mount_options')})")
    except Exception as exc:  # host facts are a nicety
        print(f"host: (unknown: {exc})")
    print(f"folder: {base}; fast tier: {fast or '-'}; {bench.load()}")
    print(f"plan: {case.workload} scale={case.scale} ranks={case.ranks}: {case.total:,} B = "
          f"{case.total / GiB:.3f} GiB per checkpoint ({min(case.rank_bytes):,}..{max(case.rank_bytes):,} B "
          f"per rank); {case.writes} writes, {case.reads} reads per run; io.threads {case.threads}, "
          f"io.block_size {case.block_size}; {args.rounds} rounds", flush=True)
    runs: list[Run] = []
    failures = 0
    failed_runs = 0
    odd = 0
    t_start = time.perf_counter()
    out: dict[str, Any] = {"case": {"workload": case.workload, "ranks": case.ranks, "scale": case.scale,
                                    "writes": case.writes, "reads": case.reads, "bytes": case.total,
                                    "extra": case.extra}}
    try:
        probe = memcpy_probe(case)
        out["memcpy"] = {"before": probe}
        print(f"memcpy probe before (engine.snapshot): {probe_line(probe, case)}", flush=True)

        def one(setting: str, mode: str, interval: float, rnd: int) -> Run | None:
            nonlocal failures, failed_runs, odd
            label = f"[{rnd + 1}] {setting:5s} {mode:12s}"
            try:
                run = run_mlckpt(case, mode, interval, setting, rnd, base, fast or base, env, args.keep)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"  {label} FAILED: {exc}", flush=True)
                failed_runs += 1
                return None
            runs.append(run)
            print(f"  {label} {run_line(run, case)}", flush=True)
            for p in run.mismatches:
                print(f"    CROSS-CHECK FAILED (summary.json vs records.jsonl): {p}", flush=True)
            for p in run.oddities:
                print(f"    ODD RECORD (records format 2 invariant): {p}", flush=True)
            failures += len(run.mismatches)
            odd += len(run.oddities)
            return run

        calibrated = args.interval == "auto"
        if calibrated:
            cal = one(SHORT, "sync", args.short_interval, 0)
            if cal is None:
                return 1
            long_interval = round(args.interval_factor * cal.s("write_stall_mean_s"), 2)
            print(f"  long interval = {args.interval_factor:g} x {cal.s('write_stall_mean_s'):.3f} s "
                  f"(sync checkpoint duration, calibration run) = {long_interval:g} s", flush=True)
        else:
            long_interval = float(args.interval)
        interval = {LONG: long_interval, SHORT: args.short_interval}
        for rnd, order in enumerate(schedule(modes, short_modes, args.rounds, calibrated)):
            for setting, mode in order:
                one(setting, mode, interval[setting], rnd)
        if not args.quick:
            probe = memcpy_probe(case)
            out["memcpy"]["after"] = probe
            print(f"memcpy probe after: {probe_line(probe, case)}", flush=True)
    finally:
        shutil.rmtree(base / "ckpt", ignore_errors=True)
        shutil.rmtree(base / "xdg", ignore_errors=True)
        if fast is not None:
            shutil.rmtree(fast, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if not runs:
        return 1
    out["interval_s"] = interval
    out["settings"] = {}
    for setting in (LONG, SHORT):
        mine = [r for r in runs if r.setting == setting]
        if not mine:
            continue
        sync_ref = [r for r in mine if r.mode == "sync"] or [r for r in runs if r.mode == "sync"]
        rows = {m: aggregate([r for r in mine if r.mode == m], sync_ref)
                for m in MODES if any(r.mode == m for r in mine)}
        if not sync_ref:
            print(f"\n== {setting}: no sync run succeeded: no ratios")
            continue
        if not any(r.mode == "sync" for r in mine):
            print(f"\n(the {setting} setting has no sync run: ratios use the other setting's sync runs)")
        print_table(setting, interval[setting], rows)
        out["settings"][setting] = rows
    lng = out["settings"].get(LONG, {})
    if "async" in lng:
        a = lng["async"]
        print(f"\nHEADLINE: async stall / sync checkpoint duration, same bytes "
              f"({a['checkpoint_bytes'] / GiB:.3f} GiB), interval {interval[LONG]:g} s: "
              f"mean {a['ratio_mean']:.3f} "
              f"({a['stall_mean_s']:.3f} s / {a['sync_duration_mean_s']:.3f} s), worst op "
              f"{a['ratio_max']:.3f}; paired per round " + " ".join(f"{x:.3f}" for x in a["ratio_paired"]))
        m = out.get("memcpy", {})
        if m:
            print(f"          snapshot stage {a['blocking_mean_s']:.3f} s = {a['blocking_gib_s']:.2f} "
                  "GiB/s; memcpy probe (median) " + ", ".join(
                      f"{k} {p['aggregate_gib_s']:.2f} GiB/s = {p['expected_stall_s']:.3f} s"
                      for k, p in m.items()))
    print(f"\n{len(runs)} runs, {failed_runs} failed, {time.perf_counter() - t_start:.0f} s; cross-check: "
          + ("all figures in summary.json match records.jsonl" if not failures
             else f"{failures} DIFFERENCES (see CROSS-CHECK FAILED above)")
          + (f"; {odd} ODD RECORDS (see above)" if odd else "; records invariants hold"))
    if args.keep:
        print(f"bundles kept under {base / 'results'}")
    out["runs"] = [{"setting": r.setting, "mode": r.mode, "round": r.round + 1, "interval_s": r.interval,
                    "wall_s": r.wall_s, "mismatches": r.mismatches, "oddities": r.oddities,
                    "summary": {k: v for k, v in r.summary.items() if k.startswith("write_") or k in (
                        "checkpoint_bytes", "mode", "tiers", "num_writes")},
                    "ops": [{k: v for k, v in o.items() if not k.endswith("_ns")} for o in r.rec["ops"]]}
                   for r in runs]
    out["cross_check_failures"] = failures
    out["odd_records"] = odd
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 2 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
